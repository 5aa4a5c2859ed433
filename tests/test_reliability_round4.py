"""Reliability round 4 (docs/errors.md): what the probes provoked as a traceback, or as a result line followed
by an error, is one clear line (exit 2) naming the problem. Each test fails on the code before it."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import setdlm
from setdlm.errors import UserError

from support import assert_one_line_error, run, save_tiny, subprocess_env
from test_gguf import cache, write_tiny_gguf  # noqa: F401  (cache: a fixture)


def test_a_prompt_that_is_not_utf8_is_one_line():
    """The shell passes bytes; Python keeps a non-UTF-8 byte as a lone surrogate, which the BPE tokenizer
    refused with a TypeError traceback."""
    r = subprocess.run([sys.executable, "-m", "setdlm", "generate", "--prompt", b"\xff\xfeab", "--max-new-tokens", "2"],
                       capture_output=True, env=subprocess_env())
    err = r.stderr.decode()
    assert r.returncode == 2 and err.count("\n") == 1 and r.stdout == b"", err
    assert "prompt 0 holds the byte 0xff (at character 0), which is not UTF-8" in err


def test_a_lone_surrogate_in_a_python_prompt_names_it():
    model = setdlm.load("shakespeare-ar")
    with pytest.raises(UserError, match=r"prompt 1 holds a lone surrogate \(\\ud800 at character 1\)"):
        model.generate(["ROMEO:", "a\ud800b"], max_new_tokens=2)
    with pytest.raises(UserError, match="suffix 0 holds a lone surrogate"):
        model.infill(["a"], ["\udfff"], lengths=2)


@pytest.mark.parametrize("declare, reshape, needle", [
    ({"head_count": 0}, None, "declares llama.attention.head_count = 0"),
    ({"embedding_length": 24}, None, "'token_embd.weight' is 16 wide but the header declares embedding_length 24"),
    ({"head_count": 3}, None, "embedding_length 16, which its head_count 3 does not divide"),
    ({"block_count": 10**6}, None, "declares 1,000,000 blocks of width 16"),
    ({"feed_forward_length": 10**9}, None, "(about 48,000,004,912 weights) but the file holds 6,496"),
    (None, {"blk.0.attn_q.weight": (8, 16)}, "a tensor's shape does not match the architecture the header declares"),
])
def test_a_gguf_file_that_contradicts_itself_is_one_line(cache, tmp_path, capsys, declare, reshape, needle):  # noqa: F811
    path = write_tiny_gguf(tmp_path / "bad.gguf", declare=declare, reshape=reshape)
    with pytest.raises(UserError, match="bad.gguf: "):
        setdlm.load(str(path))
    assert_one_line_error(*run(["generate", str(path), "--prompt", "hi"], capsys)[::2], needle)


def test_exporting_a_truncated_sharded_checkpoint_is_one_line(tmp_path, capsys):
    """A checkpoint in the FSDP layout (sharded/, written here by one process) cut short: the export said
    EOFError in a traceback (and DCP logged more tracebacks)."""
    import torch.distributed.checkpoint as dcp

    from setdlm.formats import layout
    from setdlm.cli import main

    folder = Path(save_tiny(tmp_path / "ck"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": setdlm.load(folder).backbone.state_dict()}, checkpoint_id=folder / layout.SHARDED)
    (folder / layout.WEIGHTS).unlink()
    shard = next((folder / layout.SHARDED).glob("*.distcp"))
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    capsys.readouterr()
    assert main(["export", str(folder)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert "its sharded weights cannot be read (EOFError" in err and "truncated or corrupt" in err
    shard.write_bytes(data)
    assert main(["export", str(folder)]) == 0 and (folder / layout.WEIGHTS).is_file()  # the whole file exports


def test_a_json_schema_folder_is_named_a_folder(tmp_path, capsys):
    assert_one_line_error(*run(["generate", "arith-ar", "--prompt", "x", "--json-schema", str(tmp_path)], capsys)[::2],
                          f"--json-schema file '{tmp_path}' is a folder, not a file")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="Linux's /dev/full")
@pytest.mark.parametrize("command", [["generate", "arith-ar", "--prompt", "x", "--max-new-tokens", "2"],
                                     ["eval", "arith-ar", "--task", "reasoning", "--n", "1"]])
def test_output_to_dev_full_fails_before_any_work(capsys, command):
    code, out, err = run([*command, "--output", "/dev/full"], capsys)
    assert out == ""  # no result line before the error
    assert_one_line_error(code, err, "--output '/dev/full': cannot write (the device is always full)")
