"""Reliability, round 3 (docs/errors.md): absurd sizes are refused by the memory estimate before anything
is allocated; outputs honour what the path names (a symlink is written through, a FIFO or /dev/stdout is
a stream, never replaced by a file); ``--resume`` on changed training data is refused unless asked for;
a refused ``--out`` is left as it was; small API edges (``--version``, numpy ids, a meta-device model).
Each test fails on the code before it."""

import json
import os
import shutil
import stat
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

import setdlm
from setdlm.decoding import generate, infill
from setdlm.outputs import check_file, write_text

from support import CharTokenizer, run, subprocess_env, tiny_model, write_hamlet
from test_reliability import TINY, one_line, tiny_checkpoint


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_hamlet(tmp_path_factory.mktemp("data") / "hamlet.txt", 4000)


# -- absurd sizes: refused by the memory estimate, up front -----------------------------------------------


@pytest.mark.parametrize("key,value", [("n_layers", 10**6), ("hidden_size", 10**6), ("vocab_size", 10**11)])
def test_absurd_config_sizes_are_refused_up_front(tmp_path, capsys, key, value):
    folder = tiny_checkpoint(tmp_path / "ck", "ar")
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    cfg["architecture"][key] = value
    (tmp_path / "ck" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config.json: the architecture \(.* parameters\) needs at least"):
        setdlm.load(folder)
    code, _, err = run(["generate", folder, "--prompt", "ab"], capsys)
    one_line(code, err, "config.json: the architecture", "config.json is corrupt")


def test_absurd_layers_of_a_hugging_face_config_are_refused_up_front(tmp_path):
    pytest.importorskip("transformers")
    from setdlm import FamilyConfig, Model
    from setdlm.formats.hf import adapt, setdlm_tokenizer
    from support import tiny_hf, tiny_tokenizer

    tok = tiny_tokenizer()
    backbone, mask_id = adapt(tiny_hf("qwen3", vocab=len(tok), dtype=torch.float32), tok)
    Model(backbone, FamilyConfig("ar", 16, mask_id), setdlm_tokenizer(tok)).save(tmp_path / "ck")
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    cfg["architecture"]["num_hidden_layers"] = 10**7  # (its layer_types list left short: never built)
    (tmp_path / "ck" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"the architecture \(.* parameters\) needs at least"):
        setdlm.load(tmp_path / "ck")


@pytest.mark.parametrize("family,knob", [("setdlm", "window"), ("bd3lm", "block_size")])
def test_absurd_decoding_sizes_are_refused_up_front(tmp_path, capsys, family, knob):
    model = tiny_model(family, L=32, seed=0)
    model.tokenizer = CharTokenizer()
    for n in (10**9, 10**30):  # a size whose cache cannot fit; one past torch's integers
        with pytest.raises(ValueError, match=knob):
            generate(model, "to be", max_new_tokens=4, **{knob: n})
    mdlm = tiny_model("mdlm", L=32, seed=0)
    with pytest.raises(ValueError, match="block_size must be below 2"):
        generate(mdlm, [[1, 5]], max_new_tokens=4, block_size=10**30)
    folder = tiny_checkpoint(tmp_path / "ck", family)
    code, _, err = run(["generate", folder, "--prompt", "ab", f"--{knob.replace('_', '-')}", str(10**9)], capsys)
    flag = "--" + knob.replace("_", "-")
    one_line(code, err, f"decoding with {flag} 1,000,000,000 needs at least", f"lower {flag}")


# -- outputs: a symlink is written through, a stream is written into --------------------------------------


def test_output_through_a_symlink_keeps_the_link(tmp_path):
    target = tmp_path / "real.jsonl"
    target.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target.name)
    write_text(check_file(link), "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to("sub/made.jsonl")
    write_text(check_file(dangling), "x\n")
    assert dangling.is_symlink() and (tmp_path / "sub" / "made.jsonl").read_text() == "x\n"


def test_output_to_a_fifo_is_a_stream(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, encoding="utf-8").read()), daemon=True)
    reader.start()
    write_text(check_file(fifo), "through the pipe\n")
    reader.join(timeout=60)
    assert got == ["through the pipe\n"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_generate_output_to_the_standard_output_writes_the_stream(ckpts):
    """``--output /dev/fd/1`` (what /dev/stdout links to; a pipe here) gets the JSONL rows as a stream.
    /dev/fd/1 rather than /dev/stdout: the code before this fix, run as root, replaced the machine's
    /dev/stdout link with a regular file; here it fails without harm (nothing can be created in /proc)."""
    proc = subprocess.run([sys.executable, "-m", "setdlm", "generate", ckpts, "--prompt", "ab", "--max-new-tokens",
                           "3", "--output", "/dev/fd/1"], env=subprocess_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == 1 and "text" in rows[0]
    from setdlm.outputs import is_stream

    assert is_stream("/dev/stdout") and is_stream("/dev/null") and not is_stream(ckpts)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("ck") / "ar", "ar")


# -- resume on changed data; a refused --out is left as it was ---------------------------------------------


def test_resume_after_the_training_data_changed(corpus, tmp_path, capsys):
    data = tmp_path / "hamlet.txt"
    shutil.copy(corpus, data)
    out = str(tmp_path / "run")
    flags = ["train", "--out", out, "--data", str(data), *TINY]
    assert run([*flags, "--steps", "2"], capsys)[0] == 0
    assert run(["train", "--out", out, "--resume", "--steps", "3"], capsys)[0] == 0  # same data: resumes
    data.write_text(data.read_text().replace("the", "teh"))
    code, _, err = run(["train", "--out", out, "--resume", "--steps", "4"], capsys)
    one_line(code, err, "cannot resume: the training data changed since", "pass --allow-data-change to continue")
    code, _, err = run(["train", "--out", out, "--resume", "--steps", "4", "--allow-data-change"], capsys)
    assert code == 0, err
    saved = json.loads((tmp_path / "run/checkpoints/step-00000004/training_state.json").read_text())
    assert len(saved["data_sha256"]) == 64  # the new data's digest: resuming on it again needs no flag
    assert run(["train", "--out", out, "--resume", "--steps", "5"], capsys)[0] == 0
    data.write_text(data.read_text().replace("teh", "ten"))
    code, _, err = run(["train", "--out", out, "--resume", "--steps", "6"], capsys)  # the flag is not carried over
    one_line(code, err, "cannot resume: the training data changed")


def _tree(folder):
    return sorted((str(p.relative_to(folder)), p.read_bytes() if p.is_file() else None) for p in folder.rglob("*"))


def test_a_refused_out_is_left_as_it_was(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert run(["train", "--out", str(out), "--data", corpus, "--steps", "2", *TINY], capsys)[0] == 0
    before = _tree(out)
    for target, needle in [(out, "already holds a training run; pass --resume or choose another folder"),
                           (out / "checkpoints" / "step-00000002", "is a checkpoint folder"),
                           (out / "checkpoints", "lies inside the training run"),
                           (out / "checkpoints" / "new", "lies inside the training run")]:
        code, _, err = run(["train", "--out", str(target), "--data", corpus, "--steps", "2", *TINY], capsys)
        one_line(code, err, needle)
        assert _tree(out) == before  # not even the .lock of the other run is touched
    fresh = tmp_path / "fresh"
    code, _, err = run(["train", "--out", str(fresh), "--data", corpus, "--steps", "2", *TINY, "--length", "100000"],
                       capsys)
    assert code == 2 and not fresh.exists()  # refused while starting: no folder, no .lock


# -- small ones ---------------------------------------------------------------------------------------------


def test_version(capsys):
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.strip() == f"setdlm {setdlm.__version__}"


def test_numpy_integer_ids_are_token_ids():
    model = tiny_model("setdlm", L=32, seed=0)
    model.tokenizer = CharTokenizer()
    ids = [1, 5, 7]
    want = generate(model, [ids], max_new_tokens=4, ignore_eos=True).tokens
    for form in (np.array(ids), np.array([ids]), [np.array(ids)], [list(np.array(ids, dtype=np.int32))],
                 [[np.int64(i) for i in ids]]):
        assert generate(model, form, max_new_tokens=4, ignore_eos=True).tokens == want
    with pytest.raises(ValueError, match="non-negative integer token ids"):
        generate(model, [np.array([1.0, 5.0])], max_new_tokens=2)
    with pytest.raises(ValueError, match="non-negative integer token ids"):
        generate(model, [[np.bool_(True), 5]], max_new_tokens=2)


def test_a_meta_device_model_is_a_clear_error():
    model = tiny_model("setdlm", L=32, seed=0)
    model.tokenizer = CharTokenizer()
    model.backbone.to("meta")
    for call in (lambda: generate(model, "to be", max_new_tokens=3), lambda: infill(model, "to", "be", lengths=2)):
        with pytest.raises(ValueError, match="meta device"):
            call()


def test_seeds_are_checked_against_torchs_range():
    model = tiny_model("setdlm", L=32, seed=0)
    model.tokenizer = CharTokenizer()
    kw = dict(max_new_tokens=3, temperature=1.0)
    for ok in (2**64 - 1, -(2**63), np.int64(5)):
        assert len(generate(model, "to be", seed=ok, **kw).tokens[0]) == 3
    for bad, error, needle in [(2**64, ValueError, "seed must lie in"), (-(2**63) - 1, ValueError, "seed must lie in"),
                               (True, TypeError, "seed must be an int.*got bool"),
                               (1.5, TypeError, "seed must be an int or one int per row"),
                               ([1, 2**70], ValueError, r"seed\[1\] must lie in")]:
        with pytest.raises(error, match=needle):
            generate(model, ["to be", "or not"], seed=bad, **kw)
    from setdlm.decoding.session import prepare

    with pytest.raises(ValueError, match="seed must lie in"):
        prepare(model, "to be", seed=2**64, **kw)
