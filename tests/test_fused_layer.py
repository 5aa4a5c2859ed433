"""The fused layer (docs/quantization.md, "The fused layer"): a Llama layer of an int8 or int4 backbone as one
compiled op gives the same bits as the Python layer (logits and every KV cache entry), in prefill and in decode
steps of one and several tokens, batched and ragged; it is off where the op does not compute the layer, with
SETDLM_FUSED=0, and where it cannot be built (a broken compiler: one log line, the Python layer)."""

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from setdlm import FamilyConfig, Model
from setdlm.decoding import generate
from setdlm.formats import hf
from setdlm.formats import quantize as quantize_module
from setdlm.formats import fused
from setdlm.formats.fused import fused_ops
from setdlm.formats.quantize import Int4Linear, int4_groups, quantize
from setdlm.masks import causal_mask

from support import MASK, tiny_hf

pytest.importorskip("transformers")
BUILDS = shutil.which(os.environ.get("CXX", "c++")) is not None and (
    shutil.which("ninja") is not None or importlib.util.find_spec("ninja") is not None)
needs_build = pytest.mark.skipif(not BUILDS, reason="no C++ compiler or ninja: the op cannot be built here")


def _quantized(q="int8", kind="llama", seed=0):
    return quantize(hf.HFBackbone(tiny_hf(kind, seed=seed, dtype=torch.float32)), q)


def _int8(kind="llama", seed=0):
    return _quantized("int8", kind, seed)


@pytest.fixture
def unfused(monkeypatch):
    """``_quantized`` as it quantizes without the op: whole quantized products, the Python layer."""
    def make(q="int8", kind="llama", seed=0):
        with monkeypatch.context() as m:
            m.setattr(quantize_module, "prepare_fused", lambda backbone: None)
            return _quantized(q, kind, seed)
    return make


def _steps(bb, T: int):
    """A ragged batch of 3 rows: a prefill (row lengths 9, 6, 4 under a padded causal mask), then 3 steps of T
    tokens each; the logits of every forward and the cache."""
    g = torch.Generator().manual_seed(1)
    cache, lengths = bb.new_cache(3, 16), torch.tensor([9, 6, 4])
    ids = torch.randint(0, 100, (3, 9), generator=g)
    pos = torch.arange(9).expand(3, 9)
    outs = [bb(ids, pos, causal_mask(pos < lengths[:, None]), cache, keep=lengths)]  # mask (3, 1, 9, 9)
    for _ in range(3):
        start = cache.lengths.clone()
        pos = start[:, None] + torch.arange(T)  # (3, T)
        seen = torch.arange(cache.width)[None] < start[:, None]  # (3, C)
        tri = torch.ones(T, T, dtype=torch.bool).tril()[None, None].expand(3, 1, T, T)
        mask = torch.cat([seen[:, None, None].expand(3, 1, T, -1), tri], -1)  # (3, 1, T, C + T)
        outs.append(bb(torch.randint(0, 100, (3, T), generator=g), pos, mask, cache))
    return outs, cache


@needs_build
@pytest.mark.parametrize("q", ["int8", "int4"])
@pytest.mark.parametrize("T", [1, 3])
def test_fused_layer_gives_the_python_layers_bits(T, q, unfused):
    fused, plain = _quantized(q), unfused(q)
    assert fused.fused_layers is not None and len(fused.fused_layers) == 2 and plain.fused_layers is None
    with torch.no_grad():
        (a, ca), (b, cb) = _steps(fused, T), _steps(plain, T)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert torch.equal(ca.lengths, cb.lengths)
    for x, y in zip(ca.k + ca.v, cb.k + cb.v):
        assert torch.equal(x, y)


@needs_build
@pytest.mark.parametrize("q", ["int8", "int4"])
def test_fused_decode_equals_python_decode_batched_and_alone(q, unfused):
    fused, plain = (Model(bb, FamilyConfig("ar", 32, MASK)) for bb in (_quantized(q, seed=3), unfused(q, seed=3)))
    prompts = [[5, 6, 7, 8, 9], [11, 12], [20, 21, 22, 23]]
    out = generate(fused, prompts, max_new_tokens=12)
    alone = [generate(fused, [p], max_new_tokens=12).tokens[0] for p in prompts]
    assert out.tokens == generate(plain, prompts, max_new_tokens=12).tokens == alone


@needs_build
def test_fused_only_where_it_computes_the_layer():
    assert _int8("qwen3").fused_layers is None  # per-head q/k norms: not the op's layer
    assert _int8("qwen2").fused_layers is None  # biases on q/k/v
    assert _quantized("int4", "qwen3").fused_layers is None
    layer = _quantized("int4").hf.model.layers[0]
    assert fused._layer_args(layer) is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the float32 path's slowness warning
        w = layer.self_attn.qkv_proj.weight
        layer.self_attn.qkv_proj = Int4Linear(w, None, int4_groups(w))  # a GGUF file's own Q4 blocks: float32 path
    assert fused._layer_args(layer) is None
    bb = _int8()
    with torch.no_grad():  # float64 activations (a float64 model quantized): the Python layer
        x = bb.hf.model.embed_tokens(torch.tensor([[1, 2]])).double()
        step = type("S", (), {"mask": None})()
        assert bb._fused(x, x, step, bb.new_cache(1, 4)) is None
        assert bb._fused(x.float(), x.float(), step, bb.new_cache(1, 4)) is not None
        assert bb._fused(x.float(), x.float(), step, None) is None  # no cache: a training-shaped forward


def _child(env: dict) -> str:
    code = textwrap.dedent("""
        import logging, sys, torch
        logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(message)s")
        sys.path.insert(0, "tests")
        from support import tiny_hf
        from setdlm.formats import hf
        from setdlm.formats.quantize import quantize
        bb = quantize(hf.HFBackbone(tiny_hf("llama", dtype=torch.float32)), "int8")
        print("FUSED", bb.fused_layers is not None)
        print("LOGITS", bb(torch.tensor([[1, 2, 3]]), cache=bb.new_cache(1, 4)).shape)
    """)
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_fused_off_by_environment(tmp_path):
    out = _child({"SETDLM_FUSED": "0", "SETDLM_CACHE": str(tmp_path)})
    assert "FUSED False" in out and "LOGITS torch.Size([1, 3, 100])" in out


def test_unbuildable_op_falls_back_to_the_python_layer_with_one_line(tmp_path):
    out = _child({"CXX": "/bin/false", "SETDLM_CACHE": str(tmp_path)})  # a fresh cache: it must compile, and fails
    assert "FUSED False" in out and "LOGITS torch.Size([1, 3, 100])" in out
    assert "the fused layer could not be built" in out


@needs_build
def test_fused_op_is_built_where_a_compiler_is():
    ops = fused_ops()
    assert ops is not None and ops.llama_int8_layer.default is not None and ops.llama_int4_layer.default is not None
