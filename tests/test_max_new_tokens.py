"""One default ``max_new_tokens`` per entry point (setdlm.decoding.settings.MAX_NEW_TOKENS_DEFAULTS): the
table docs/decoding.md shows is the code's, and each entry point decodes that many tokens when none is given."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from setdlm.cli.commands import build_parser
from setdlm.cli.flags import decode_settings
from setdlm.cli.options import GenerateOptions, ModelChoice, generate_rows
from setdlm.decoding import generate
from setdlm.decoding.session import prepare
from setdlm.decoding.settings import MAX_NEW_TOKENS_DEFAULTS, default_max_new_tokens, max_new_tokens_table

from support import CharTokenizer, save_tiny, tiny_model

DOC = Path(__file__).resolve().parents[1] / "docs" / "decoding.md"


def test_the_doc_table_is_the_codes():
    assert max_new_tokens_table() in DOC.read_text(encoding="utf-8")


def test_defaults_and_the_room():
    assert {k: v for k, (v, _) in MAX_NEW_TOKENS_DEFAULTS.items()} == {
        "generate": 64, "cli": 128, "server": 64, "evaluate": None, "harness": 256, "demo": 48}
    assert default_max_new_tokens("server", room=10) == 10 and default_max_new_tokens("server", room=100) == 64
    assert default_max_new_tokens("evaluate", room=7) == 7 and default_max_new_tokens("cli", room=3) == 128
    with pytest.raises(TypeError, match="depends on the room the prompt leaves; pass room"):
        default_max_new_tokens("evaluate")
    with pytest.raises(KeyError, match="unknown entry point 'repl'; choose one of generate, cli"):
        default_max_new_tokens("repl")


def test_each_entry_point_reads_its_default(tmp_path):
    """The library and sessions decode 64 tokens, the CLI's flags default to 128 / 48, the server's
    ``max_tokens`` to min(64, the room)."""
    from setdlm.serve.schemas import parse_request

    model = tiny_model("setdlm", L=48)
    model.tokenizer = CharTokenizer()
    assert len(generate(model, "ab", ignore_eos=True).tokens[0]) == 64  # slides past L = 48
    assert sum(prepare(model, "ab", width=100, ignore_eos=True).targets()) == 64
    parser = build_parser()
    args = parser.parse_args(["generate", "--prompt", "x"])
    assert args.max_new_tokens is None  # the command's default, resolved once the model is loaded
    path = save_tiny(tmp_path / "m")
    out, _, _ = generate_rows(GenerateOptions(["ab"], replace(decode_settings(args), ignore_eos=True),
                                              ModelChoice(path)))
    assert len(out.tokens[0]) == 128
    assert parser.parse_args(["demo"]).max_new_tokens == 48

    def budget(prompt: str, width: int) -> int:
        raw = json.dumps({"prompt": prompt}).encode()
        return parse_request(raw, chat=False, model=model, model_name="m", width=width).settings.max_new_tokens

    assert budget("ab", 100) == 64 and budget("ab", 48) == 48 - 3  # [BOS] a b: the room is 45


def test_the_harness_default(tmp_path):
    """lm-eval's ``generate_until`` budget when a task sets no ``max_gen_toks``: 256, or the model argument."""
    pytest.importorskip("lm_eval")
    from setdlm.evaluation.harness import SetDLMLM

    path = save_tiny(tmp_path / "ck")
    assert SetDLMLM(path).max_new_tokens == 256
    assert SetDLMLM(path, max_new_tokens=9).max_new_tokens == 9
