"""One typed settings object for decoding (docs/decoding.md "Settings"): checked once, which family uses
which setting in one table, the same decode whether given as ``settings=`` or as keywords, and the CLI's
generate/infill flags derived from its fields."""

import argparse
import dataclasses

import pytest

from support import EOS, MASK, PROMPTS, tiny_model
from setdlm.cli.commands import build_parser
from setdlm.decoding import fill, generate, infill
from setdlm.decoding.settings import SETTING_FAMILIES, GENERATE_ONLY, DecodeSettings, applicable

ALL = ("ar", "mdlm", "bd3lm", "setdlm")


@pytest.mark.parametrize("family", ALL)
def test_settings_object_and_keywords_decode_the_same(family):
    model = tiny_model(family)
    kw = dict(max_new_tokens=7, temperature=0.8, top_k=10, repetition_penalty=1.3, length_penalty=(2, 1.5),
              eos_token_id=EOS, **applicable(family, threshold=0.4, window=3, block_size=2))
    a = generate(model, PROMPTS, seed=[1, 2, 3], trace=True, **kw)
    b = generate(model, PROMPTS, DecodeSettings(**kw), seed=[1, 2, 3], trace=True)
    assert a.tokens == b.tokens and a.trace == b.trace and a.nfe == b.nfe
    c = generate(model, PROMPTS, seed=[1, 2, 3], trace=True, **{**kw, "max_new_tokens": 3})
    assert c.tokens != a.tokens  # the settings do reach the decoder
    rows = [[*p, MASK, MASK, 9, MASK] for p in PROMPTS]
    settings = DecodeSettings(**{k: v for k, v in kw.items() if k != "max_new_tokens"})
    assert fill(model, rows, settings, seed=4).tokens == fill(model, rows, seed=4, **dataclasses.asdict(settings)).tokens
    if family != "ar":
        assert (infill(model, PROMPTS, [[5]] * 3, 2, settings=settings, seed=4).tokens
                == infill(model, PROMPTS, [[5]] * 3, 2, seed=4, **dataclasses.asdict(settings)).tokens)


def test_settings_and_keywords_together_or_unknown_are_errors():
    model = tiny_model("setdlm")
    with pytest.raises(ValueError, match="give settings= or the keyword settings \\(threshold\\), not both"):
        generate(model, PROMPTS, DecodeSettings(window=2), threshold=0.5)
    with pytest.raises(TypeError, match="generate\\(\\) got an unexpected keyword argument 'windw'"):
        generate(model, PROMPTS, windw=2)
    with pytest.raises(TypeError, match="settings must be a DecodeSettings, got dict"):
        fill(model, [[1, MASK]], {"window": 2})


@pytest.mark.parametrize("kw, error, match", [
    (dict(window=0), ValueError, "window must be a positive integer, got 0"),
    (dict(block_size=2.0), ValueError, "block_size must be a positive integer, got 2.0"),
    (dict(threshold=0), ValueError, r"threshold must lie in \(0, 1\]"),
    (dict(threshold=1.01), ValueError, r"threshold must lie in \(0, 1\]"),
    (dict(cache_order="random"), ValueError, "cache_order must be 'position' or 'reveal'"),
    (dict(temperature=float("inf")), ValueError, "temperature must be a finite number >= 0"),
    (dict(top_p=1.5), ValueError, r"top_p must lie in \(0, 1\]"),
    (dict(top_k=-1), ValueError, "top_k must be an integer >= 0"),
    (dict(repetition_penalty=0), ValueError, "repetition_penalty must be > 0"),
    (dict(length_penalty=3), TypeError, "length_penalty must be a pair"),
    (dict(length_penalty=(2, 0.5)), ValueError, "length_penalty must be \\(start >= 0, factor >= 1\\)"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens must be a positive integer"),
    (dict(max_new_tokens=True), TypeError, "max_new_tokens must be an int, got bool"),
    (dict(eos_token_id="2"), TypeError, "eos_token_id must be a token id"),
    (dict(ignore_eos=1), TypeError, "ignore_eos must be True or False"),
    (dict(stop=[""]), ValueError, "stop must be a non-empty string"),
])
def test_each_setting_is_checked_on_construction(kw, error, match):
    with pytest.raises(error, match=match):
        DecodeSettings(**kw)


def test_normalised_and_frozen():
    s = DecodeSettings(stop="\n", length_penalty=[2, 1.5], eos_token_id=[2, 3])
    assert s.stop == ("\n",) and s.length_penalty == (2, 1.5) and s.eos_token_id == (2, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.window = 3


@pytest.mark.parametrize("family", ALL)
def test_check_for_follows_the_one_table(family):
    values = {"window": 2, "threshold": 0.5, "block_size": 2, "speculate": True}
    for name, families in SETTING_FAMILIES.items():
        s = DecodeSettings(**{name: values[name]})
        if family in families:
            s.check_for(family)
        else:
            with pytest.raises(ValueError, match=f"{name} applies to {'/'.join(families)} models, not to this"):
                s.check_for(family)
    assert set(applicable(family, **values)) == {n for n, f in SETTING_FAMILIES.items() if family in f}
    for name, value in (("stop", "x"), ("ignore_eos", True), ("cache_order", "reveal"), ("max_new_tokens", 5)):
        DecodeSettings(**{name: value}).check_for(family)  # generate takes them
        with pytest.raises(ValueError, match=f"{name} applies to generate only"):
            DecodeSettings(**{name: value}).check_for(family, "fill")
    assert set(GENERATE_ONLY) <= {f.name for f in dataclasses.fields(DecodeSettings)}


def test_cli_flags_are_the_dataclass_fields():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    dests = {name: {a.dest for a in sub.choices[name]._actions} for name in ("generate", "infill", "eval", "bench")}
    names = {f.name for f in dataclasses.fields(DecodeSettings)} - {"constraint"}  # spelled by three flags:
    assert {"regex", "json_schema", "choice"} <= dests["generate"] & dests["infill"]
    assert names <= dests["generate"] and names <= dests["eval"]
    assert dests["infill"] & names == names - set(GENERATE_ONLY)
    # bench sweeps these four (--thresholds, --windows, --block-sizes, --sweep-speculate)
    assert dests["bench"] & names == names - {"threshold", "window", "block_size", "speculate"}
    args = parser.parse_args(["generate", "--prompt", "a", "--stop", "x", "--stop", "y", "--length-penalty", "3",
                              "1.5", "--eos-token-id", "2", "--ignore-eos", "--cache-order", "reveal"])
    assert (args.stop, args.length_penalty, args.eos_token_id, args.ignore_eos, args.cache_order, args.max_new_tokens,
            args.window) == (["x", "y"], ["3", "1.5"], [2], True, "reveal", None, None)


def test_a_session_row_follows_the_same_table():
    from setdlm.decoding.session import prepare

    with pytest.raises(ValueError, match="threshold applies to setdlm/bd3lm/mdlm models, not to this 'ar'"):
        prepare(tiny_model("ar"), PROMPTS[0], threshold=0.5)
    row = prepare(tiny_model("setdlm"), PROMPTS[0], DecodeSettings(window=3, max_new_tokens=5))
    assert row.config.window == 3 and len(row.sequence) == len(PROMPTS[0]) + 5


def test_cli_flags_become_one_settings_object():
    from setdlm.errors import UserError, as_flags
    from setdlm.cli.flags import decode_settings

    parser = build_parser()
    args = parser.parse_args(["generate", "--prompt", "a", "--threshold", "0.5", "--stop", ".", "--length-penalty", "3",
                              "1.5", "--eos-token-id", "2", "--top-k", "4", "--ignore-eos"])
    settings = decode_settings(args)
    assert settings == DecodeSettings(threshold=0.5, stop=(".",), length_penalty=(3, 1.5), eos_token_id=(2,), top_k=4,
                                      ignore_eos=True)
    settings.check_for("bd3lm")
    with pytest.raises(UserError) as e:  # the library's words; the command line prints the field as its flag
        settings.check_for("ar")
    assert str(e.value) == "threshold applies to setdlm/bd3lm/mdlm models, not to this 'ar' model"
    assert as_flags(e.value) == "--threshold applies to setdlm/bd3lm/mdlm models, not to this 'ar' model"
    bad = parser.parse_args(["infill", "--prefix", "a", "--length", "2", "--length-penalty", "x", "1"])
    with pytest.raises(UserError) as e:
        decode_settings(bad)
    assert as_flags(e.value).startswith("--length-penalty takes START FACTOR")
    assert decode_settings(parser.parse_args(["infill", "--prefix", "a", "--length", "2"])) == DecodeSettings()
