"""The terminal view (`setdlm generate --show-order --trace`) and the `setdlm serve` command as a user runs it."""

import json
import os
import re
import subprocess
import sys
import urllib.request

import pytest

from setdlm.cli import main
from setdlm.formats.loading import load

from support import Output, free_port


def test_show_order_marks_every_token_with_its_step_and_trace_file_holds_the_sets(tmp_path, capsys):
    trace = tmp_path / "t.json"
    args = ["generate", "--prompt", "ROMEO:", "--max-new-tokens", "12", "--threshold", "0.1", "--ignore-eos"]
    assert main(args + ["--show-order", "--trace", str(trace)]) == 0
    shown = capsys.readouterr().out.rstrip("\n")
    assert main(args) == 0
    plain = capsys.readouterr().out.rstrip("\n")
    (row,) = json.loads(trace.read_text())
    assert row["text"] == plain
    marks = re.findall(r"\[(\d+)\]", shown)
    assert len(marks) == len(row["tokens"]) == 12
    step_of = {p: s["step"] for s in row["steps"] for p in s["positions"]}
    assert [int(m) for m in marks] == [step_of[j] for j in range(12)]
    assert sorted(step_of) == list(range(12))  # every position decided exactly once
    assert sum(len(s["positions"]) for s in row["steps"]) == 12
    assert len(row["steps"]) < 12  # threshold 0.1: some steps committed several tokens
    out = load("shakespeare-setdlm-smax8").generate("ROMEO:", max_new_tokens=12, threshold=0.1, ignore_eos=True,
                                                    trace=True)
    assert [s["token_ids"] for s in row["steps"]] == [t.committed_tokens for t in out.trace[0]]


def test_serve_rejects_bad_flags_in_one_line(capsys):
    assert main(["serve", "--max-batch", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "setdlm serve: error: --max-batch must be >= 1, got 0"


def test_setdlm_serve_answers_curl_like_requests():
    pytest.importorskip("uvicorn")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath("src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "setdlm", "serve", "shakespeare-setdlm-smax8", "--port", str(port),
                             "--max-batch", "4", "--dtype", "bfloat16"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    out = Output(proc.stdout)
    try:
        url = f"http://127.0.0.1:{port}"
        assert out.ready.wait(300) and not out.ended.is_set(), out.text()[-2000:]  # it listens (a loaded machine: minutes)
        health = json.loads(urllib.request.urlopen(url + "/health", timeout=60).read())
        assert health["model"] == "shakespeare-setdlm-smax8" and health["max_batch"] == 4
        assert health["dtype"] == "bfloat16"  # --dtype: the weights cast before serving
        body = json.dumps({"prompt": "ROMEO:", "max_tokens": 16, "threshold": 0.5}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        out = json.loads(urllib.request.urlopen(req, timeout=60).read())
        want = load("shakespeare-setdlm-smax8", dtype="bfloat16").generate("ROMEO:", max_new_tokens=16, threshold=0.5)
        assert out["choices"][0]["text"] == want.texts[0]
        page = urllib.request.urlopen(url + "/", timeout=10).read().decode()
        assert "<script>" in page and "http" not in page.replace("http-equiv", "")  # nothing fetched from elsewhere
    finally:
        proc.terminate()
        proc.wait(timeout=30)
