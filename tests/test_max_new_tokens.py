"""One default ``max_new_tokens`` per entry point (setdlm.decoding.settings.MAX_NEW_TOKENS_DEFAULTS): the
table docs/decoding.md shows is the code's, and each entry point decodes that many tokens when none is given."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import setdlm

from setdlm.cli.commands import build_parser
from setdlm.cli.flags import decode_settings
from setdlm.cli.options import GenerateOptions, ModelChoice, generate_rows
from setdlm.decoding import generate
from setdlm.decoding.session import prepare
from setdlm.decoding.settings import (MAX_NEW_TOKENS, MAX_NEW_TOKENS_DEFAULTS, default_max_new_tokens,
                                     max_new_tokens_table)

from support import CharTokenizer, save_tiny, tiny_model

DOC = Path(__file__).resolve().parents[1] / "docs" / "decoding.md"


def test_the_doc_table_is_the_codes():
    assert max_new_tokens_table() in DOC.read_text(encoding="utf-8")


def test_defaults_and_the_room():
    """One rule: min(256, the room), whoever asks (issue #46: eval used the room, 8,000+ tokens on SmolLM2)."""
    assert MAX_NEW_TOKENS == 256 and set(MAX_NEW_TOKENS_DEFAULTS) == {
        "generate", "cli", "server", "evaluate", "harness", "demo"}
    for entry in MAX_NEW_TOKENS_DEFAULTS:
        assert default_max_new_tokens(entry, room=10) == 10 and default_max_new_tokens(entry, room=8190) == 256
    assert default_max_new_tokens("cli", room=0) == 1  # a prompt without room is refused by generate, not here
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'room'"):
        default_max_new_tokens("evaluate")
    with pytest.raises(KeyError, match="unknown entry point 'repl'; choose one of generate, cli"):
        default_max_new_tokens("repl", room=3)


def test_each_entry_point_reads_its_default(tmp_path):
    """The library, sessions, the CLI and the server decode min(256, the room) tokens when none is given,
    per row in generate (a row's budget does not depend on its batch)."""
    from setdlm.serve.schemas import parse_request

    model = tiny_model("setdlm", L=48)
    model.tokenizer = CharTokenizer()
    out = generate(model, ["ab", "abcdef"], ignore_eos=True)
    assert [len(t) for t in out.tokens] == [45, 41]  # [BOS] a b: the room is 45; [BOS] abcdef: 41
    assert out.tokens[1] == generate(model, "abcdef", ignore_eos=True).tokens[0]
    assert sum(prepare(model, "ab", width=100, ignore_eos=True).targets()) == 97
    assert sum(prepare(model, "ab", width=1000, ignore_eos=True).targets()) == 256
    parser = build_parser()
    args = parser.parse_args(["generate", "--prompt", "x"])
    assert args.max_new_tokens is None  # the rule, resolved once the model is loaded
    path = save_tiny(tmp_path / "m")
    out, _, _ = generate_rows(GenerateOptions(["ab"], replace(decode_settings(args), ignore_eos=True),
                                              ModelChoice(path)))
    L = setdlm.load(path).family.length
    assert len(out.tokens[0]) == min(256, L - 3)
    assert parser.parse_args(["demo"]).max_new_tokens is None

    def budget(prompt: str, width: int) -> int:
        raw = json.dumps({"prompt": prompt}).encode()
        return parse_request(raw, chat=False, model=model, model_name="m", width=width).settings.max_new_tokens

    assert budget("ab", 1000) == 256 and budget("ab", 48) == 48 - 3


def test_eval_on_a_long_context_is_bounded():
    """`setdlm eval smollm2-135m --task reasoning` decoded 8,000+ tokens a row by default: now 256."""
    from setdlm.evaluation.passes import _budget

    model = tiny_model("ar", L=8192)
    assert _budget(model, [[1, 2, 3], [1, 2]], None) == 256
    assert _budget(model, [[1, 2, 3]], 9) == 9
    assert _budget(tiny_model("ar", L=48), [[1, 2, 3]], None) == 45


def test_generate_past_the_context_says_so():
    """Python generate slid past L silently where the server refuses: it still decodes, with a warning."""
    model = tiny_model("setdlm", L=48)
    model.tokenizer = CharTokenizer()
    with pytest.warns(UserWarning, match=r"max_new_tokens=60 runs past the context length L=48: prompt 0 leaves "
                                         r"room for 45 tokens, and past that the decoder slides"):
        out = generate(model, "ab", max_new_tokens=60, ignore_eos=True)
    assert len(out.tokens[0]) == 60


def test_the_harness_default(tmp_path):
    """lm-eval's ``generate_until`` budget when a task sets no ``max_gen_toks``: 256, or the model argument."""
    pytest.importorskip("lm_eval")
    from setdlm.evaluation.harness import SetDLMLM

    path = save_tiny(tmp_path / "ck")
    assert SetDLMLM(path).max_new_tokens == 256
    assert SetDLMLM(path, max_new_tokens=9).max_new_tokens == 9
