"""The command line: commands listed, train/eval/resume end to end, and the bad-input matrix (one-line error
naming the bad value, exit code 2, nothing written)."""

import json
import subprocess
import sys

import pytest

from support import assert_one_line_error, run, save_tiny, subprocess_env, write_hamlet

SMALL = ["--length", "32", "--hidden-size", "32", "--batch-size", "8", "--eval-fraction", "0.1", "--eval-max", "16",
         "--eval-every", "0", "--save-every", "0", "--log-every", "2"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_hamlet(tmp_path_factory.mktemp("data") / "hamlet.txt", 8000)


def test_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "setdlm", "--help"], env=subprocess_env(),
                         capture_output=True, text=True)
    assert out.returncode == 0
    for cmd in ("train", "eval", "generate", "infill", "schedule"):
        assert cmd in out.stdout
    tr = subprocess.run([sys.executable, "-m", "setdlm", "train", "--help"], env=subprocess_env(),
                        capture_output=True, text=True)
    for flag in ("--preset", "--family", "--D", "--block-size", "--bf16", "--resume", "--grad-accum", "--ema"):
        assert flag in tr.stdout


def test_train_eval_resume_through_the_cli(corpus, tmp_path, capsys):
    out = str(tmp_path / "run")
    code, stdout, err = run(["train", "--out", out, "--data", corpus, "--family", "bd3lm", "--block-size", "4",
                             "--steps", "4", *SMALL], capsys)
    assert code == 0, err
    assert "step 4: loss" in stdout and "held-out nelbo" in stdout
    code, stdout, err = run(["train", "--out", out, "--resume", "--steps", "6"], capsys)  # the saved arguments
    assert code == 0, err
    assert "resuming from" in err and "step 6" in stdout
    cfg = json.loads((tmp_path / "run/checkpoints/step-00000006/config.json").read_text())
    assert cfg["training"]["family"] == "bd3lm" and cfg["training"]["steps"] == 6
    code, stdout, err = run(["eval", out, "--data", corpus, "--output", str(tmp_path / "e" / "r.json")], capsys)
    assert code == 0, err
    res = json.loads(stdout.strip())
    assert res["task"] == "likelihood" and res["family"] == "bd3lm" and res["tokens"] > 1000
    assert json.loads((tmp_path / "e" / "r.json").read_text()) == res
    code, _, err = run(["train", "--out", out, "--resume", "--steps", "8", "--hidden-size", "64"], capsys)
    assert_one_line_error(code, err, "cannot resume: hidden_size=64")


@pytest.mark.parametrize("args, needles", [
    (["--family", "gpt"], ["invalid choice: 'gpt'"]),
    (["--preset", "huge"], ["invalid choice: 'huge'"]),
    (["--n-layers", "0"], ["--n-layers must be a positive integer, got 0"]),
    (["--hidden-size", "-32"], ["--hidden-size must be a positive integer, got -32"]),
    (["--steps", "0"], ["--steps must be a positive integer, got 0"]),
    (["--batch-size", "0"], ["--batch-size must be a positive integer, got 0"]),
    (["--length", "-1"], ["--length must be a positive integer, got -1"]),
    (["--D", "0"], ["--D must be a positive integer, got 0"]),
    (["--lr", "-0.1"], ["--lr must be positive, got -0.1"]),
    (["--n-layers", "two"], ["invalid int value: 'two'"]),
    (["--D", "8", "--M", "4"], ["D=8, M=4"]),
    (["--M", "64", "--length", "32"], ["M=64, L=32"]),
    (["--family", "bd3lm", "--block-size", "5"], ["multiple of the block size 5"]),
    (["--family", "ar", "--D", "2"], ["--D applies to setdlm", "'ar'"]),
    (["--family", "ar", "--block-size", "4"], ["--block-size applies to bd3lm and mdlm, not to family 'ar'"]),
    (["--batch-size", "6", "--grad-accum", "4"], ["--batch-size 6 is not divisible by --grad-accum 4"]),
    (["--tokenizer", "wordpiece"], ["unknown tokenizer 'wordpiece'"]),
    (["--data", "EMPTY"], ["empty corpus", "empty.txt"]),
    (["--data", "LATIN1"], ["latin1.txt: not UTF-8 text (byte 0xe9"]),
    (["--data", "MISSING"], ["missing.txt", "neither an existing file"]),
    (["--data", ""], ["--data must name a text source", "got ''"]),
    (["--k", "-1"], ["k must be a positive number, got -1.0"]),
])
def test_train_bad_inputs(args, needles, corpus, tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("  \n\n")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9 cr\u00e8me".encode("latin-1"))
    subst = {"EMPTY": str(tmp_path / "empty.txt"), "LATIN1": str(tmp_path / "latin1.txt"),
             "MISSING": str(tmp_path / "missing.txt")}
    args = [subst.get(a, a) for a in args]
    data = [] if "--data" in args else ["--data", corpus]
    out = tmp_path / "out"
    code, _, err = run(["train", "--out", str(out), *data, "--steps", "2", *SMALL[:6], *args], capsys)
    assert_one_line_error(code, err, *needles)
    assert not out.exists()


# -- generate / infill input checks (no decoding needed) ------------------------------------------------------


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ck")
    return {f: save_tiny(root / f, f) for f in ("setdlm", "ar")}


@pytest.mark.parametrize("cmd, args, needles", [
    ("generate", ["--prompt", "ab", "--window", "0"], ["--window must be a positive integer, got 0"]),
    ("generate", ["--prompt", "abcdefghijklmnopq"], ["prompt 0 is 18 tokens long", "L=16"]),
    ("generate", ["--prompt", "ab", "--prompt", "a" * 15], ["prompt 1 is 16 tokens long"]),
    ("generate", ["--prompt", "ab", "--max-new-tokens", "0"], ["--max-new-tokens must be a positive integer, got 0"]),
    ("generate", ["--prompt", "ab", "--top-p", "0"], ["--top-p must lie in (0, 1], got 0.0"]),
    ("generate", ["--prompt", "ab", "--temperature", "-1"], ["--temperature must be a finite number >= 0, got -1.0"]),
    ("generate", ["--prompt", "ab", "--threshold", "1.5"], ["--threshold must lie in (0, 1] or be left out (off), got 1.5"]),
    ("generate", ["--prompt", "ab", "--block-size", "4"], ["--block-size applies to bd3lm/mdlm", "'setdlm'"]),
    ("generate", ["--input", "LATIN1"], ["latin1.txt: not UTF-8 text (byte 0xe9 at offset 3)"]),
    ("generate", ["--input", "MISSING"], ["input file", "missing.txt", "does not exist"]),
    ("generate", ["--input", "BADJSONL"], ["bad.jsonl:2: not valid JSON"]),
    ("generate", [], ["no prompts"]),
    ("infill", ["--prefix", "ab", "--suffix", "c", "--length", "0"], ["infill length must be a positive integer, got 0"]),
    ("infill", ["--prefix", "abcdef", "--suffix", "abc", "--length", "8"], ["= 18 tokens, more than the context length L=16"]),
    ("infill", ["--prefix", "ab", "--suffix", "c"], ["--length is required"]),
    ("infill", ["--prefix", "ab", "--suffix", "c", "--length", "2", "--window", "0"], ["--window must be a positive integer, got 0"]),
    ("infill", ["--input", "LATIN1"], ["latin1.txt: not UTF-8 text"]),
])
def test_decode_bad_inputs(cmd, args, needles, ckpts, tmp_path, capsys):
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9".encode("latin-1"))
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{nope\n')
    subst = {"LATIN1": str(tmp_path / "latin1.txt"), "MISSING": str(tmp_path / "missing.txt"),
             "BADJSONL": str(tmp_path / "bad.jsonl")}
    out = tmp_path / "out"
    code, _, err = run([cmd, ckpts["setdlm"], *[subst.get(a, a) for a in args], "--output", str(out / "o.jsonl")], capsys)
    assert_one_line_error(code, err, *needles)
    assert not out.exists()


def test_decode_flag_for_the_wrong_family_and_missing_checkpoint(ckpts, tmp_path, capsys):
    code, _, err = run(["generate", ckpts["ar"], "--prompt", "ab", "--window", "2"], capsys)
    assert_one_line_error(code, err, "--window applies to setdlm models, not to this 'ar' model")
    code, _, err = run(["generate", str(tmp_path / "nope"), "--prompt", "ab"], capsys)
    assert_one_line_error(code, err, "nope", "does not exist")
    code, _, err = run(["eval", ckpts["ar"]], capsys)  # saved by Model.save: no training data recorded
    assert_one_line_error(code, err, "records no training run (its held-out rows): pass --data")


def test_non_utf8_stdin_is_one_line_exit_2(ckpts, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "setdlm", "generate", ckpts["setdlm"], "--input", "-",
                           "--output", str(tmp_path / "out" / "o.jsonl")], input=b"ok\n\xff\xfe\n",
                          env=subprocess_env(), capture_output=True)
    assert proc.returncode == 2
    assert proc.stderr.decode().strip() == "setdlm generate: error: <stdin>: not UTF-8 text (byte 0xff at offset 3)"
    assert not (tmp_path / "out").exists()
