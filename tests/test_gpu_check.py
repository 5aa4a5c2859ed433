"""benchmarks/gpu_check.py at its tiny size on the CPU: the JSON's structure, and every exactness check passes
(cache == recompute, batched == alone, speculate == window 1, flex == dense). The timings it writes are not
checked (they depend on the machine)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("gpu_check", BENCH / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path_factory.mktemp("gpu_check") / "check.json"
    returned = mod.main(["--tiny", "--device", "cpu", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(returned))  # the file holds the whole report
    return written


def test_exactness_checks_pass_on_the_cpu(report):
    checks = {c["name"]: c for c in report["sections"]["exactness"]}
    for name in ("cache == recompute (AR)", "cache == recompute (SetDLM window 1)", "batched == alone (AR)",
                 "batched == alone (BD3LM)", "batched == alone (SetDLM w=4 threshold 0.5)",
                 "speculate == window 1 (SetDLM w=4)", "flex == dense training loss (every family, padded batch)"):
        assert checks[name]["passed"] is True, checks[name]
    assert checks["cache == recompute (AR)"]["tokens"] == 3 * 6 and checks["cache == recompute (AR)"]["max_gap"] == 0
    static = checks["static cache == dynamic cache (CPU: no capture)"]
    assert static["passed"] is True and static["rows"] == 5 * 3 and static["replays"] == 0  # the CPU never captures
    assert report["exactness_passed"] is True


def test_training_section_structure(report):
    t = report["sections"]["training"]
    fams = ("ar", "mdlm", "bd3lm", "setdlm")
    for name in fams + ("plain_transformers",):
        row = t[name]
        assert row["steps"] == 2 and row["warmup_steps"] == 1
        assert row["ms_per_step"] > 0 and row["tokens_per_s"] > 0
        assert row["mfu"] is None  # no peak FLOP/s on the CPU
    assert t["ar"]["eval_s"] > 0 and t["ar"]["save_s"] > 0  # timed apart from the steps
    assert set(t["vs_plain"]) == set(fams) and t["per_token_cost_vs_ar"]["ar"] == 1.0
    for name in ("training_long", "compile", "generate_compiled"):
        assert report["sections"][name] == {"skipped": "needs CUDA"}


def test_decoding_section_structure(report):
    rows = report["sections"]["decoding"]
    names = {r["decoder"] for r in rows}
    assert {"setdlm AR", "setdlm BD3LM S=4", "setdlm SetDLM w=4, threshold off", "setdlm SetDLM w=4, threshold 0.5",
            "setdlm AR + static cache", "setdlm SetDLM w=4, threshold off + static cache",
            "transformers generate (dynamic cache)", "transformers generate (static cache)"} <= names
    assert not [r for r in rows if "error" in r]
    for r in rows:
        if r["decoder"].startswith("setdlm"):
            assert r["new_tokens"] == 6 and r["tokens_per_s"] > 0 and r["nfe"] >= 1 and "vs_generate" in r
    assert {r["batch"] for r in rows} == {1, 3}
    env = report["environment"]
    assert env["device"] == "cpu" and env["model"]["llama"]["vocab_size"] == 96
