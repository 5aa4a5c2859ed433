"""Reliability (docs/errors.md): the documented resume command works, every failure is one clear line
(exit 2; Ctrl-C exit 130), nothing is lost, and the Python API checks what the CLI checks. One section per
case of the reliability round; each test fails on the code before it."""

import fcntl
import json
import os
import pty
import resource
import signal
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest
import torch

import setdlm
from setdlm.formats import checkpoint as ckpt
from setdlm.data import char_tokenizer
from setdlm.decoding import generate, infill
from setdlm.family import FamilyConfig
from setdlm.lm import Model
from setdlm.outputs import write_text_atomic
from setdlm.training import TrainConfig

from support import make_model, run, subprocess_env, write_hamlet

TINY = ["--length", "32", "--hidden-size", "32", "--n-layers", "1", "--batch-size", "4", "--eval-fraction", "0.1",
        "--eval-max", "8", "--eval-every", "0", "--log-every", "1", "--tokenizer", "char"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_hamlet(tmp_path_factory.mktemp("data") / "hamlet.txt", 4000)


def one_line(code, err, *needles, exit_code=2) -> str:
    assert code == exit_code, err
    lines = [x for x in err.strip().splitlines() if not x.startswith("warning:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def tiny_checkpoint(path, family="setdlm", heads=2, text="abcdefghijklmnopqrstuvwxyz .") -> str:
    tok = char_tokenizer([text])
    kw = {"setdlm": dict(D=2), "bd3lm": dict(block_size=4), "mdlm": {}, "ar": {}}[family]
    Model(make_model(vocab=tok.vocab_size, heads=heads, dtype=torch.float32),
          FamilyConfig(family, length=16, mask_token_id=tok.mask_token_id, **kw), tok).save(path)
    return str(path)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ck")
    return {f: tiny_checkpoint(root / f, f) for f in ("setdlm", "ar")}


def cli_proc(args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "setdlm", *args], env=subprocess_env(), text=True, **kw)


# -- 1. `setdlm train --out RUN --resume` resumes with the saved configuration -----------------------------


def test_resume_a_run_of_another_preset_with_only_out_and_resume(corpus, tmp_path, capsys):
    out = str(tmp_path / "run")
    code, _, err = run(["train", "--preset", "small", "--out", out, "--data", corpus, "--steps", "2", *TINY,
                        "--n-heads", "2", "--vocab-size", "64"], capsys)
    assert code == 0, err
    code, stdout, err = run(["train", "--out", out, "--resume", "--steps", "3"], capsys)
    assert code == 0, err
    assert "resuming from" in err and "step 3" in stdout
    saved = json.loads((tmp_path / "run/checkpoints/step-00000003/config.json").read_text())["training"]
    assert saved["preset"] == "small" and saved["n_layers"] == 1
    code, _, err = run(["train", "--out", out, "--resume", "--steps", "4", "--preset", "tiny"], capsys)
    one_line(code, err, "cannot resume: preset='tiny'", "preset='small'")  # a flag given IS compared


def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_from_scratch(corpus, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 4.0}) + "\n")  # the dead attempt's log
    code, stdout, err = run(["train", "--out", str(run_dir), "--resume", "--data", corpus, "--steps", "2", *TINY],
                            capsys)
    assert code == 0, err
    assert "no checkpoint to resume from yet; starting from scratch" in err and "step 2" in stdout
    steps = [json.loads(r)["step"] for r in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[:2] == [1, 2]  # the log restarted: the dead attempt's row was dropped


# -- 2. a config.json missing a key or holding a wrong type is an error naming both -------------------------


@pytest.mark.parametrize("edit, needles", [
    (lambda c: c["architecture"].pop("n_heads"), ["lacks the key 'n_heads'"]),
    (lambda c: c["architecture"].update(n_heads="2"), ["architecture.n_heads must be int", '"2"']),
    (lambda c: c["architecture"].update(dropout=None), ["architecture.dropout must be float"]),
    (lambda c: c["family"].pop("mask_token_id"), ["'family' lacks the key 'mask_token_id'"]),
    (lambda c: c["family"].update(D=2.0), ["family.D must be int or null"]),
    (lambda c: c["family"].update(keep_clean_bos="no"), ["family.keep_clean_bos must be bool", '"no"']),
])
def test_config_with_a_missing_or_mistyped_key_is_refused(edit, needles, tmp_path, capsys):
    path = tiny_checkpoint(tmp_path / "ck", heads=2)
    cfg = json.loads((tmp_path / "ck/config.json").read_text())
    edit(cfg)
    (tmp_path / "ck/config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as e:
        setdlm.load(path)
    for n in [*needles, "config.json"]:
        assert n in str(e.value)
    code, _, err = run(["eval", path, "--data", str(tmp_path / "ck/README.md")], capsys)
    one_line(code, err, *needles)


def test_a_config_saved_before_keep_clean_bos_existed_loads_with_it_off(tmp_path):
    path = tiny_checkpoint(tmp_path / "ck", heads=2)
    cfg = json.loads((tmp_path / "ck/config.json").read_text())
    assert cfg["family"].pop("keep_clean_bos") is False  # a key the format gained later: absent = off
    (tmp_path / "ck/config.json").write_text(json.dumps(cfg))
    assert setdlm.load(path).family.keep_clean_bos is False


# -- 3. two processes training into one folder: the second is refused, naming the holder -----------------


def test_a_second_training_into_the_same_folder_is_refused(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(  # another process holding the run's lock, as a trainer does
        [sys.executable, "-c", "import fcntl, os, sys; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
         "f.write(f'pid {os.getpid()} on a host'); f.flush(); print('locked', flush=True); sys.stdin.read()",
         str(out / ".lock")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # holds until killed
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, _, err = run(["train", "--out", str(out), "--data", corpus, "--steps", "2", *TINY], capsys)
        one_line(code, err, "another training run is writing into this folder", f"pid {holder.pid}")
        assert not (out / "checkpoints").exists()
    finally:
        holder.kill()
        holder.wait()
    code, _, err = run(["train", "--out", str(out), "--data", corpus, "--steps", "2", *TINY], capsys)
    assert code == 0, err  # the kernel dropped the dead holder's lock


# -- 4. output paths are checked before any work; a failed write loses nothing -----------------------------


def test_output_paths_are_checked_before_loading(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    missing = str(tmp_path / "no-such-checkpoint")  # never reached: the output check comes first
    code, _, err = run(["generate", missing, "--prompt", "ab", "--output", str(tmp_path / "adir")], capsys)
    one_line(code, err, "--output", "adir", "is a folder")
    code, _, err = run(["infill", missing, "--prefix", "a", "--suffix", "b", "--length", "2", "--output",
                        str(tmp_path / "afile" / "o.jsonl")], capsys)
    one_line(code, err, "--output", "afile", "is a file")
    code, _, err = run(["eval", missing, "--output", str(tmp_path / "afile" / "sub" / "r.json")], capsys)
    one_line(code, err, "--output", "afile", "is a file")
    code, _, err = run(["bench", missing, "--task", "reasoning", "--out", str(tmp_path / "afile" / "b")], capsys)
    one_line(code, err, "--out", "afile", "is a file")


def file_size_limit(n: int):
    """A child's file-size limit of ``n`` bytes: larger writes fail (EFBIG) the way they do on a full disk."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))
    return limit


def test_a_write_that_fails_after_decoding_names_the_path_and_keeps_the_text(ckpts, tmp_path):
    out = tmp_path / "o.jsonl"
    proc = subprocess.run([sys.executable, "-m", "setdlm", "generate", ckpts["setdlm"], "--prompt", "ab",
                           "--max-new-tokens", "8", "--output", str(out)], env=subprocess_env(), capture_output=True,
                          text=True, preexec_fn=file_size_limit(64))
    one_line(proc.returncode, proc.stderr.replace("nfe=", "warning: nfe="), str(out), "cannot write")
    row = json.loads(proc.stdout)  # the result is on stdout
    assert row["prompt"] == "ab" and len(row["tokens"]) == 8
    assert not out.exists() and not list(tmp_path.glob(".o.jsonl*"))


def test_a_checkpoint_that_cannot_be_written_is_one_line(corpus, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "setdlm", "train", "--out", str(out), "--data", corpus, "--steps", "1",
                           *TINY], env=subprocess_env(), capture_output=True, text=True,
                          preexec_fn=file_size_limit(20000))  # the log fits, the weights do not
    one_line(proc.returncode, proc.stderr.replace("step 1:", "warning: step 1:"), str(out / "checkpoints"),
             "cannot write the checkpoint", "File too large")
    assert not list((out / "checkpoints").iterdir())  # no half-written folder left


# -- 5. Ctrl-C: exit 130, one line saying what is left ------------------------------------------------------


@pytest.fixture
def sigint_raises():
    """Python's own SIGINT handler (KeyboardInterrupt) for the test, whatever the suite inherited: a suite
    started in the background of a non-interactive shell has SIGINT ignored, and Python then keeps it so."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_ctrl_c_during_training_names_the_latest_checkpoint(corpus, tmp_path, capsys, sigint_raises):
    out = tmp_path / "run"

    def press_ctrl_c():  # a real SIGINT to this process once the first checkpoint is there
        while not (out / "latest").is_file():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press_ctrl_c, daemon=True).start()
    code, _, err = run(["train", "--out", str(out), "--data", corpus, "--steps", "100000", "--save-every", "1",
                        "--keep", "1", *TINY], capsys)
    line = one_line(code, err, "setdlm train: interrupted; the latest checkpoint is", "setdlm train --out",
                    "--resume", exit_code=130)
    assert str(out / "checkpoints" / "step-") in line


def test_ctrl_c_during_generation_keeps_the_rows_that_finished(ckpts):
    """Ctrl-C at a known moment (a forward of the backbone raises it): the rows of the chunks done are kept,
    with the tokens an uninterrupted call gives them."""
    from setdlm.decoding.api import DecodingInterrupted

    model = setdlm.load(ckpts["ar"])
    full = generate(model, ["ab", "cd", "ef"], max_new_tokens=5, ignore_eos=True, batch_size=1)
    calls, stop_at = [0], [None]

    def backbone(*a, **kw):  # the model's backbone, counting its forwards
        calls[0] += 1
        if calls[0] == stop_at[0]:
            raise KeyboardInterrupt
        return model.backbone(*a, **kw)

    for name in ("new_cache", "parameters", "train", "eval"):
        setattr(backbone, name, getattr(model.backbone, name))
    backbone.training = False
    counted = Model(backbone, model.family, model.tokenizer)
    generate(counted, ["ab"], max_new_tokens=5, ignore_eos=True)
    calls[0], stop_at[0] = 0, 2 * calls[0] + 1  # rows 0 and 1 done, row 2 begun
    with pytest.raises(DecodingInterrupted) as e:
        generate(counted, ["ab", "cd", "ef"], max_new_tokens=5, ignore_eos=True, batch_size=1)
    assert e.value.tokens == {0: full.tokens[0], 1: full.tokens[1]} and e.value.total == 3
    assert e.value.texts == {0: full.texts[0], 1: full.texts[1]}


def test_ctrl_c_during_generate_is_one_line_exit_130(ckpts, capsys, sigint_raises, monkeypatch):
    from setdlm.model import Transformer

    decoding = threading.Event()
    forward = Transformer.forward

    def observed(self, *a, **kw):  # the real forward; the gate opens once decoding has begun
        decoding.set()
        return forward(self, *a, **kw)

    monkeypatch.setattr(Transformer, "forward", observed)

    def press_ctrl_c():  # a real SIGINT once the decoder runs its forwards, however long loading took
        decoding.wait()
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press_ctrl_c, daemon=True).start()
    code, _, err = run(["generate", ckpts["ar"], "--prompt", "ab", "--max-new-tokens", "100000", "--ignore-eos"],
                       capsys)
    err = "\n".join(l for l in err.splitlines() if ": warning: " not in l)  # decoding past L=16 says so first
    one_line(code, err, "setdlm generate: interrupted; 0 of 1 rows had finished; nothing was printed or written",
             exit_code=130)


# -- 6. one-line errors: no CUDA, no transformers, corrupt weights, sizes that cannot fit --------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda(ckpts, corpus, tmp_path, capsys):
    code, _, err = run(["generate", ckpts["ar"], "--prompt", "ab", "--device", "cuda"], capsys)
    one_line(code, err, "device 'cuda': CUDA is not available", "--device cpu")
    code, _, err = run(["train", "--out", str(tmp_path / "r"), "--data", corpus, "--device", "cuda:0", *TINY], capsys)
    one_line(code, err, "device 'cuda:0': CUDA is not available")
    assert not (tmp_path / "r").exists()


def test_init_from_a_hf_folder_without_transformers(tmp_path, corpus, capsys, monkeypatch):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf/config.json").write_text(json.dumps({"model_type": "llama"}))
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if the package were not installed
    code, _, err = run(["train", "--init-from", str(tmp_path / "hf"), "--out", str(tmp_path / "r"), "--data",
                        corpus, *TINY], capsys)
    one_line(code, err, "needs transformers", 'pip install "setdlm[hf]"')


def test_truncated_weights_of_an_init_from_hf_folder(tmp_path, corpus, capsys):
    transformers = pytest.importorskip("transformers")
    m = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2))
    m.save_pretrained(tmp_path / "hf")
    w = tmp_path / "hf/model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    code, _, err = run(["train", "--init-from", str(tmp_path / "hf"), "--out", str(tmp_path / "r"), "--data",
                        corpus, *TINY], capsys)
    one_line(code, err, "model.safetensors: corrupt or truncated safetensors file")


def test_truncated_weights_of_an_init_from_hub_id_in_the_cache(tmp_path, corpus, capsys, no_network):
    """A Hub id whose cached snapshot holds a truncated file: one line naming it, as for a local folder."""
    transformers = pytest.importorskip("transformers")
    m = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2))
    commit = "1" * 40
    snap = no_network / "models--someone--tiny-llama" / "snapshots" / commit
    m.save_pretrained(snap)
    (no_network / "models--someone--tiny-llama" / "refs").mkdir()
    (no_network / "models--someone--tiny-llama" / "refs" / "main").write_text(commit)
    w = snap / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    code, _, err = run(["train", "--init-from", "someone/tiny-llama", "--out", str(tmp_path / "r"), "--data",
                        corpus, *TINY], capsys)
    one_line(code, err, "model.safetensors: corrupt or truncated safetensors file")


@pytest.mark.parametrize("args, needles", [
    (["--hidden-size", "1000000", "--n-heads", "2"], ["parameters", "needs at least", "--hidden-size"]),
    (["--batch-size", "100000000"], ["micro-batches of 100000000 rows", "needs at least", "--batch-size"]),
])
def test_training_sizes_that_cannot_fit_are_refused_up_front(args, needles, corpus, tmp_path, capsys):
    code, _, err = run(["train", "--out", str(tmp_path / "r"), "--data", corpus, *TINY, *args], capsys)
    one_line(code, err, *needles)
    assert not (tmp_path / "r").exists()


def test_a_generation_that_cannot_fit_is_refused_up_front(ckpts, capsys):
    code, _, err = run(["generate", ckpts["ar"], "--prompt", "ab", "--max-new-tokens", "1000000000"], capsys)
    one_line(code, err, "up to 1,000,000,000 new tokens needs at least", "lower --max-new-tokens")


# -- 7. a pickle is refused, never loaded, and torch's advice is not passed on ---------------------------


def test_a_pickle_is_refused_on_every_loading_path(ckpts, tmp_path, corpus, capsys):
    path = tiny_checkpoint(tmp_path / "ck")
    torch.save(setdlm.load(path).backbone.state_dict(), tmp_path / "ck/model.safetensors")  # a pickle in disguise
    code, _, err = run(["generate", path, "--prompt", "ab"], capsys)
    line = one_line(code, err, "model.safetensors: is a pickle file", "does not load pickles")
    assert "weights_only" not in line
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf/config.json").write_text(json.dumps({"model_type": "llama"}))
    torch.save({"w": torch.zeros(2)}, tmp_path / "hf/pytorch_model.bin")
    code, _, err = run(["train", "--init-from", str(tmp_path / "hf"), "--out", str(tmp_path / "r"), "--data",
                        corpus, *TINY], capsys)
    one_line(code, err, "pytorch_model.bin: is a pickle file")


def test_an_authors_pickle_holding_objects_is_not_loaded(tmp_path, capsys):
    import shutil
    from pathlib import Path

    from setdlm.formats.convert import read_reference_weights

    ref = tmp_path / "ref"
    shutil.copytree(Path(__file__).parent / "fixtures" / "reference-dit-tiny", ref)
    for f in ref.glob("*.safetensors"):
        f.unlink()
    torch.save({"state_dict": {"w": torch.zeros(2)}, "callback": FamilyConfig("ar", 4, 0)}, ref / "pytorch_model.bin")
    with pytest.raises(ValueError) as e:
        read_reference_weights(ref)
    assert "a pickle holding more than tensors; it is not loaded" in str(e.value)
    assert "weights_only" not in str(e.value)


# -- 8. bf16 on a CPU without native bf16: a warning ------------------------------------------------------


def test_bf16_on_a_cpu_without_native_bf16_warns(corpus, tmp_path, capsys):
    code, _, err = run(["train", "--out", str(tmp_path / "r"), "--data", corpus, "--steps", "1", "--bf16", *TINY],
                       capsys)
    assert code == 0, err
    from setdlm.resources import native_bf16

    warned = "without native bf16" in err
    assert warned == (not native_bf16(torch.device("cpu")))


# -- 9. messages that name the thing --------------------------------------------------------------------


def test_a_bad_metrics_log_is_named_and_another_runs_log_is_never_truncated(corpus, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\nnot json\n')
    code, _, err = run(["train", "--out", str(run_dir), "--resume", "--data", corpus, "--steps", "2", *TINY], capsys)
    one_line(code, err, "metrics.jsonl:2: not a metrics row")
    other = json.dumps({"step": 5, "loss": 1.0}) + "\n"
    (run_dir / "metrics.jsonl").write_text(other)
    code, _, err = run(["train", "--out", str(run_dir), "--data", corpus, "--steps", "2", *TINY], capsys)
    one_line(code, err, "metrics.jsonl: holds 1 rows of another run", "--resume")
    assert (run_dir / "metrics.jsonl").read_text() == other


def test_a_bad_latest_file_is_named(ckpts, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run/latest").write_bytes(b"\xff\xfe\x00")
    code, _, err = run(["generate", str(tmp_path / "run"), "--prompt", "ab"], capsys)
    one_line(code, err, "latest: not a text file")
    (tmp_path / "run/latest").write_text("/etc\n")
    code, _, err = run(["generate", str(tmp_path / "run"), "--prompt", "ab"], capsys)
    one_line(code, err, "latest: '/etc' is not a checkpoint folder inside")


def test_messages_name_what_the_user_set(tmp_path, corpus, capsys):
    code, _, err = run(["train", "--out", str(tmp_path / "r"), "--data", corpus, "--length", "1"], capsys)
    line = one_line(code, err, "--length must be at least 2 (L: a BOS and one token to learn), got 1")
    assert "M" not in line.replace("setdlm", "")
    code, _, err = run(["train", "--out", str(tmp_path / "r"), "--data", corpus, "--length", "3"], capsys)
    one_line(code, err, "D=4, L=3")
    code, _, err = run(["demo", "--models", str(tmp_path / "nosuch")], capsys)
    one_line(code, err, "nosuch", "no such folder")
    code, _, err = run(["bench", str(tmp_path / "nosuch"), "--task", "reasoning", "--thresholds", "1.5", "--out",
                        str(tmp_path / "b")], capsys)
    one_line(code, err, "thresholds must lie in (0, 1]")  # the setting, not the missing checkpoint


# -- 10. checkpoints get the user's umask permissions --------------------------------------------------------


def test_checkpoint_permissions_follow_the_umask(ckpts, tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "ck"
        setdlm.load(ckpts["ar"]).save(path)
        write_text_atomic(tmp_path / "latest", "ck\n")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o755
    assert {f.stat().st_mode & 0o777 for f in path.iterdir()} == {0o644}
    assert (tmp_path / "latest").stat().st_mode & 0o777 == 0o644


# -- 11. the Python API checks what the CLI checks -----------------------------------------------------------


@pytest.mark.parametrize("call, error, needle", [
    (lambda m: generate(m["ar"], [[1, 2, 999]]), ValueError, "token id 999, outside the model's vocabulary"),
    (lambda m: generate(m["ar"], b"ab"), TypeError, "got bytes"),
    (lambda m: generate(m["ar"], [b"ab"]), TypeError, "prompt 0 must be a string"),
    (lambda m: generate(m["ar"], None), TypeError, "got NoneType"),
    (lambda m: generate(m["ar"], [None]), TypeError, "prompt 0 must be a string"),
    (lambda m: infill(m["setdlm"], ["ab"], ["c"], 2.5), TypeError, "lengths must be an int"),
    (lambda m: infill(m["setdlm"], ["ab"], ["c"], [2.0]), TypeError, "lengths[0] must be an int"),
    (lambda m: infill(m["setdlm"], ["ab"], ["c"], 0), ValueError, "lengths[0] must be a positive integer"),
    (lambda m: generate(m["ar"], ["ab"], window=2), ValueError, "window applies to setdlm models, not to this 'ar'"),
    (lambda m: generate(m["ar"], ["ab"], threshold=0.9), ValueError, "threshold applies to setdlm/bd3lm/mdlm"),
    (lambda m: infill(m["setdlm"], ["ab"], ["c"], 2, block_size=2), ValueError, "block_size applies to bd3lm/mdlm"),
    (lambda m: infill(m["setdlm"], None, ["c"], 2), TypeError, "prefixes must be strings or token-id lists"),
    (lambda m: generate(m["ar"], 5), TypeError, "prompts must be strings or token-id lists, got int"),
    (lambda m: generate(m["ar"], ["ab"], stop=5), TypeError, "stop must be a string or a list of strings"),
    (lambda m: generate(m["ar"], ["ab"], eos_token_id=999), ValueError, "eos_token_id must be a token id"),
    (lambda m: generate(m["ar"], ["ab"], length_penalty=5), TypeError, "length_penalty must be a pair"),
    (lambda m: setdlm.load(None), TypeError, "path must be a checkpoint folder"),
    (lambda m: setdlm.load(""), TypeError, "path must be a checkpoint folder"),
    (lambda m: TrainConfig(out="r", lr="a"), TypeError, "lr must be a number, got str 'a'"),
    (lambda m: TrainConfig(out="r", bf16="yes"), TypeError, "bf16 must be True or False"),
])
def test_python_api_checks_its_inputs(call, error, needle, ckpts):
    models = {k: setdlm.load(v) for k, v in ckpts.items()}
    with pytest.raises(error) as e:
        call(models)
    assert needle in str(e.value)


# -- 12. progress bars on a terminal only ---------------------------------------------------------------------


def test_generate_shows_a_bar_on_a_terminal(ckpts):
    main_fd, tty = pty.openpty()
    fcntl.ioctl(tty, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal 100 columns wide
    proc = cli_proc(["generate", ckpts["ar"], "--prompt", "ab", "--max-new-tokens", "50", "--ignore-eos"],
                    stdout=subprocess.DEVNULL, stderr=tty)
    os.close(tty)
    seen = b""
    while True:
        try:
            chunk = os.read(main_fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    proc.wait()
    os.close(main_fd)
    assert proc.returncode == 0
    assert b"ar decoding" in seen and b"50/50" in seen


def test_bench_writes_no_carriage_returns_to_a_log(tmp_path, capsys):
    from setdlm.data.tasks import reasoning_split

    text = "".join(e.question + e.solution for e in reasoning_split("test", 50, level="easy", seed=0))
    path = tiny_checkpoint(tmp_path / "ck", "ar", text=text)
    cfg = json.loads((tmp_path / "ck/config.json").read_text())
    cfg["family"]["length"] = 256
    (tmp_path / "ck/config.json").write_text(json.dumps(cfg))
    code, _, err = run(["bench", path, "--task", "reasoning", "--level", "easy", "--n", "3", "--max-new-tokens", "4",
                        "--thresholds", "off", "--warmup", "1", "--out", str(tmp_path / "b")], capsys)
    assert code == 0, err
    assert "\r" not in err  # stderr is not a terminal here
