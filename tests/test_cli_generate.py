"""`setdlm generate` / `setdlm infill` with real decoding: the CLI gives exactly what the library gives.

These need ``setdlm.decoding`` (the decoders); the module is skipped where it does not exist yet.
"""

import json
import subprocess
import sys

import pytest

import setdlm
from setdlm.cli import main

from support import run, save_tiny, subprocess_env

decoding = pytest.importorskip("setdlm.decoding")

FLAGS = {"setdlm": (["--window", "2"], {"window": 2}), "bd3lm": (["--block-size", "4"], {"block_size": 4}),
         "mdlm": (["--block-size", "4"], {"block_size": 4}), "ar": ([], {})}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ck")
    return {f: save_tiny(root / f, f) for f in FLAGS}


@pytest.mark.parametrize("family", list(FLAGS))
def test_generate_matches_the_library(family, ckpts, tmp_path, capsys):
    flags, kw = FLAGS[family]
    out = tmp_path / "gen.jsonl"
    code, _, err = run(["generate", ckpts[family], "--prompt", "ab", "--prompt", "the q", "--max-new-tokens", "6",
                        "--temperature", "0", "--seed", "3", *flags, "--output", str(out)], capsys)
    assert code == 0, err
    assert "nfe=" in err and "tokens/s=" in err
    rows = [json.loads(r) for r in out.read_text().splitlines()]
    ref = decoding.generate(setdlm.load(ckpts[family]), ["ab", "the q"], max_new_tokens=6, temperature=0.0, seed=3, **kw)
    assert [r["prompt"] for r in rows] == ["ab", "the q"]
    assert [r["text"] for r in rows] == list(ref.texts)
    assert [r["tokens"] for r in rows] == [[int(t) for t in ids] for ids in ref.tokens]
    assert all(len(r["tokens"]) <= 6 for r in rows)


def test_generate_reads_stdin_and_prints_texts(ckpts):
    proc = subprocess.run([sys.executable, "-m", "setdlm", "generate", ckpts["setdlm"], "--input", "-",
                           "--max-new-tokens", "4", "--temperature", "0"], input="ab\nthe\n".encode(),
                          env=subprocess_env(), capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    ref = decoding.generate(setdlm.load(ckpts["setdlm"]), ["ab", "the"], max_new_tokens=4, temperature=0.0, seed=0)
    assert proc.stdout.decode() == "\n\n".join(ref.texts) + "\n"


def test_generate_same_seed_same_samples(ckpts, capsys):
    args = ["generate", ckpts["setdlm"], "--prompt", "ab", "--max-new-tokens", "6", "--temperature", "1.0",
            "--top-k", "5", "--seed", "11"]
    first, second = run(args, capsys), run(args, capsys)
    assert first[0] == second[0] == 0 and first[1] == second[1]


@pytest.mark.parametrize("family", ["setdlm", "bd3lm", "mdlm"])
def test_infill_matches_the_library(family, ckpts, tmp_path, capsys):
    flags, kw = FLAGS[family]
    rows_in = tmp_path / "rows.jsonl"
    rows_in.write_text(json.dumps({"prefix": "the ", "suffix": " dog", "length": 4}) + "\n"
                       + json.dumps({"prefix": "a", "suffix": "", "length": 3}) + "\n")
    out = tmp_path / "fill.jsonl"
    code, _, err = run(["infill", ckpts[family], "--input", str(rows_in), "--temperature", "0", *flags,
                        "--output", str(out)], capsys)
    assert code == 0, err
    rows = [json.loads(r) for r in out.read_text().splitlines()]
    ref = decoding.infill(setdlm.load(ckpts[family]), ["the ", "a"], [" dog", ""], [4, 3], temperature=0.0, seed=0, **kw)
    assert [r["text"] for r in rows] == list(ref.texts)
    assert [r["length"] for r in rows] == [4, 3]


def test_generate_after_training(tmp_path, capsys):
    """Train a tiny model through the CLI, then decode from the run folder."""
    data = tmp_path / "d.txt"
    data.write_text("the cat sat on the mat. " * 200)
    run_dir = str(tmp_path / "run")
    assert main(["train", "--out", run_dir, "--data", str(data), "--steps", "20", "--length", "32", "--hidden-size",
                 "32", "--batch-size", "8", "--lr", "3e-3", "--eval-every", "0", "--save-every", "0"]) == 0
    code, stdout, err = run(["generate", run_dir, "--prompt", "the cat", "--max-new-tokens", "8", "--temperature", "0"],
                            capsys)
    assert code == 0, err
    assert "nfe=" in err
    ref = decoding.generate(setdlm.load(run_dir), ["the cat"], max_new_tokens=8, temperature=0.0, seed=0)
    assert stdout == ref.texts[0] + "\n"


def test_generate_speculate_next_token_is_the_ar_decode_of_the_same_weights(tmp_path, capsys):
    """``--speculate-next-token`` (``speculate="next_token"``) on a model trained with a next-token head prints the AR
    decode of its weights; ``--speculate`` stays the window=1 decode; without the head the error names the flag."""
    import dataclasses

    from setdlm import Model
    from setdlm.family import FamilyConfig

    plain = setdlm.load(save_tiny(tmp_path / "plain", "setdlm"))
    head = Model(plain.backbone, dataclasses.replace(plain.family, ar_weight=1.0), plain.tokenizer)
    head.save(tmp_path / "head")
    ar = Model(plain.backbone, FamilyConfig("ar", plain.family.length, plain.family.mask_token_id), plain.tokenizer)
    ref = decoding.generate(ar, ["ab", "the q"], max_new_tokens=8)
    out = tmp_path / "gen.jsonl"
    code, _, err = run(["generate", str(tmp_path / "head"), "--prompt", "ab", "--prompt", "the q", "--max-new-tokens",
                        "8", "--window", "3", "--speculate-next-token", "--output", str(out)], capsys)
    assert code == 0, err
    assert [json.loads(r)["tokens"] for r in out.read_text().splitlines()] == ref.tokens
    w1 = decoding.generate(head, ["ab"], max_new_tokens=8, window=1)
    code, _, err = run(["generate", str(tmp_path / "head"), "--prompt", "ab", "--max-new-tokens", "8", "--speculate",
                        "--output", str(out)], capsys)
    assert code == 0 and json.loads(out.read_text())["tokens"] == w1.tokens[0], err
    code, _, err = run(["generate", str(tmp_path / "plain"), "--prompt", "ab", "--speculate-next-token"], capsys)
    assert code != 0 and "--speculate-next-token verifies" in err and "not trained" in err and "use --speculate" in err
