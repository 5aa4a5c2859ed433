"""`make demo` / `setdlm demo` on tiny models (fast mode), so the README's demo cannot rot; and the shipped
models: they load, decode, and are what `generate`/`infill` use without a checkpoint."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import setdlm
from setdlm import FamilyConfig, Model, TransformerConfig, Transformer
from setdlm.formats import pretrained
from setdlm.formats.checkpoint import save
from setdlm.data.sources import read_source
from setdlm.data.tasks import reasoning_split
from setdlm.data.tokenizers import char_tokenizer, train_bpe
from setdlm.evaluation.passes import EvalRun

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_SHAPES = {"ar": {}, "bd3lm-s4": dict(block_size=4), "setdlm-smax8": dict(D=4, M=8)}


def _tiny(tok, family: str, L: int, seed: int) -> Model:
    name = family.split("-")[0]
    torch.manual_seed(seed)
    bb = Transformer(TransformerConfig(vocab_size=tok.vocab_size, hidden_size=32, n_heads=2, n_layers=1))
    bb.init_weights(zero_head=False, generator=torch.Generator().manual_seed(seed))
    fam = FamilyConfig(name, length=L, mask_token_id=tok.mask_token_id, **SHIPPED_SHAPES[family])
    return Model(bb.to(torch.bfloat16), fam, tok)  # stored in bf16, like the shipped models


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """Random tiny checkpoints named like the shipped ones (bf16 on disk)."""
    d = tmp_path_factory.mktemp("models")
    text = read_source("shakespeare").texts[0][:200_000]
    bpe = train_bpe([text], 512)
    chars = char_tokenizer([e.prompt + e.completion for e in reasoning_split("train", 500, level="medium")])
    for i, fam in enumerate(SHIPPED_SHAPES):
        save(d / f"shakespeare-{fam}", _tiny(bpe, fam, 256, i))
        save(d / f"arith-{fam}", _tiny(chars, fam, 192, 10 + i))
    return d


def _readme_demo_command() -> list[str]:
    """README names `make demo`; the Makefile's demo target runs `setdlm demo ...`: return that command."""
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme
    make = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", make, re.M).group(1)
    line = next(l for l in recipe.splitlines() if "setdlm demo" in l or "-m setdlm demo" in l)
    cmd = shlex.split(line.strip())
    i = cmd.index("demo")
    return [sys.executable, "-m", "setdlm"] + cmd[i:]


def test_readme_demo_runs_on_tiny_models(tiny_models, tmp_path):
    cmd = _readme_demo_command() + ["--models", str(tiny_models), "--out", str(tmp_path / "demo"), "--n", "4",
                                    "--max-new-tokens", "8", "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=tmp_path)  # a hang guard only
    assert r.returncode == 0, r.stderr[-2000:]
    for part in ("1. Shakespeare", "2. A hidden line", "3. An arithmetic word problem", "4. Live"):
        assert part in r.stdout
    # the live table has a row per setting: AR once, BD3LM and SetDLM at three thresholds each
    live = r.stdout.split("4. Live")[1].split("AUP over")[0]  # the table; the AUP of each curve follows it
    rows = [l for l in live.splitlines() if l.startswith("| arith-")]
    assert len(rows) == 7, r.stdout
    assert "AUP over τ" in r.stdout
    png = (tmp_path / "demo" / "pareto.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") > 100


def test_demo_rejects_bad_n(tiny_models):
    r = subprocess.run([sys.executable, "-m", "setdlm", "demo", "--models", str(tiny_models), "--n", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "at least 3 problems" in r.stderr


def test_bf16_checkpoints_load_as_float32(tiny_models):
    m = setdlm.load(tiny_models / "arith-ar")
    assert next(m.backbone.parameters()).dtype == torch.float32
    assert next(setdlm.load(tiny_models / "arith-ar", dtype=torch.bfloat16).backbone.parameters()).dtype == torch.bfloat16


def test_unknown_shipped_name():
    with pytest.raises(ValueError, match="no shipped model 'nope'"):
        pretrained.path("nope")


shipped = pytest.mark.skipif(not pretrained.available(), reason="no shipped models in this installation")


@shipped
def test_shipped_models_load_and_decode():
    names = pretrained.available()
    assert pretrained.DEFAULT in names
    for name in names:
        m = setdlm.load(name)  # by name
        assert next(m.backbone.parameters()).dtype == torch.float32
        prompt = "ROMEO." if name.startswith("shakespeare") else reasoning_split("test", 1, level="medium")[0].prompt
        out = m.generate([prompt], max_new_tokens=8, ignore_eos=True)
        assert len(out.tokens[0]) == 8 and out.nfe >= 1


@shipped
def test_generate_and_infill_default_to_the_shipped_setdlm():
    m = setdlm.load(pretrained.DEFAULT)
    direct = m.generate(["ROMEO."], max_new_tokens=6, ignore_eos=True)
    r = subprocess.run([sys.executable, "-m", "setdlm", "generate", "--prompt", "ROMEO.", "--max-new-tokens", "6",
                        "--ignore-eos"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert direct.texts[0] in r.stdout
    r = subprocess.run([sys.executable, "-m", "setdlm", "infill", "--prefix", "ROMEO. But", "--suffix", " the east.",
                        "--length", "4"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@shipped
def test_shipped_models_are_the_trained_ones():
    """The shipped weights are the study's trained models, not random ones: the arithmetic models solve
    held-out problems and the Shakespeare SetDLM's bound on Shakespeare text is far below log(vocab)."""
    import math

    from setdlm.evaluation.likelihood import likelihood
    from setdlm.evaluation.reasoning import reasoning

    problems = reasoning_split("test", 30, level="medium", seed=0)
    for name in ("arith-ar", "arith-setdlm-smax8"):
        acc = reasoning(setdlm.load(name), problems, run=EvalRun(batch_size=30, progress=False)).accuracy
        assert acc >= 0.15, (name, acc)
    m = setdlm.load("shakespeare-setdlm-smax8")
    text = read_source("shakespeare").texts[0][-20_000:]
    ids = m.tokenizer.encode(text)[: 4 * m.family.length]
    rows = torch.tensor(ids).view(4, m.family.length)
    bound = likelihood(m, [rows], progress=False).nats_per_token
    assert bound < math.log(m.tokenizer.vocab_size) - 1.5, bound
