"""torch.compile of SmolLM2-135M's 30 decoder layers around setdlm's int8 products, against eager, at one decode
step (docs/quantization.md, "Per-step overhead"; issue #44, item 3: "torch.compile of the decode step, fewer
kernels per layer, a fused int8 path: measure each").

    PYTHONPATH=src python benchmarks/compiled_layers.py --rows 1 3 --threads 1

torch.compile breaks the graph at every fbgemm call of the real model (the packed weight is a script object), so
here the int8 product (``setdlm.formats.quantize.Int8Linear``'s arithmetic: per-row 7-bit activations, fbgemm's
GEMM) is registered as a custom op taking the packed weight's index, and the layer's other work (RMSNorm, RoPE on
the fused q|k, float64 attention over a 100-entry cache, the SwiGLU, the residuals) is what Inductor may fuse. SmolLM2's
shapes, random weights, batch 1, ``--rows`` query positions (1: an AR step, 3: a drafted step at ``window=3``).
Prints CPU milliseconds per forward of the 30 layers (``time.process_time``, best of 3 rounds of 20 forwards: a
shared machine slows a wall clock more than a CPU clock at one thread), the compile time and how far the outputs
lie apart (compiled kernels round differently, and the int8 quantizer turns a last-bit difference on a rounding
boundary into a whole level: the numbers are not eager's).
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import torch.nn.functional as F

from setdlm.formats.quantize import ACT_SCALE, ACT_ZERO, _INT8_GEMM, _TINY, Int8Linear

D, HD, H, HKV, FF, LAYERS = 576, 64, 9, 3, 1536, 30  # SmolLM2-135M
PACKED: list = []  # the packed weights, by index (the custom op's argument)
WIDTHS: list[int] = []  # their output widths (the fake op's shape)


@torch.library.custom_op("setdlm_bench::int8_linear", mutates_args=())
def int8_linear(x: torch.Tensor, idx: int) -> torch.Tensor:
    return _product(x, idx)


@int8_linear.register_fake
def _(x, idx):
    return x.new_empty(*x.shape[:-1], WIDTHS[idx])


def _product(x: torch.Tensor, idx: int) -> torch.Tensor:
    """Int8Linear's product: each row over its absolute maximum, 7-bit, fbgemm, times the maximum."""
    x2 = x.reshape(-1, x.shape[-1])
    m = x2.abs().amax(1, keepdim=True).clamp_(min=_TINY)
    return (_INT8_GEMM(x2 / m, ACT_SCALE, ACT_ZERO, PACKED[idx]) * m).view(*x.shape[:-1], -1)


def _pack(n: int, k: int) -> int:
    PACKED.append(Int8Linear(torch.randn(n, k) * 0.05, None)._packed)
    WIDTHS.append(n)
    return len(PACKED) - 1


def _rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def layers_forward(layers, x, cos, sin, ks, vs, lin):
    """The decoder layers at one step, as setdlm.formats.hf runs them under int8 (fused q|k|v and gate|up)."""
    B, T, _ = x.shape
    for i, w in enumerate(layers):
        h = F.rms_norm(x, (D,), w["n1"], 1e-5)
        qkv = lin(h, w["qkv"])
        qk = _rope(qkv[..., : (H + HKV) * HD].view(B, T, -1, HD), cos, sin).transpose(1, 2)
        q, k = qk[:, :H], qk[:, H:]
        v = qkv[..., (H + HKV) * HD:].view(B, T, -1, HD).transpose(1, 2)
        kk, vv = torch.cat([ks[i], k.double()], 2), torch.cat([vs[i], v.double()], 2)
        y = F.scaled_dot_product_attention(q.double(), kk, vv, enable_gqa=True).to(x.dtype)
        x = x + lin(y.transpose(1, 2).reshape(B, T, H * HD), w["o"])
        g, u = lin(F.rms_norm(x, (D,), w["n2"], 1e-5), w["gu"]).chunk(2, dim=-1)
        x = x + lin(F.silu(g) * u, w["dn"])
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    layers = [dict(qkv=_pack((H + 2 * HKV) * HD, D), o=_pack(D, D), gu=_pack(2 * FF, D), dn=_pack(D, FF),
                   n1=torch.ones(D), n2=torch.ones(D)) for _ in range(LAYERS)]
    ks = [torch.randn(1, HKV, 100, HD, dtype=torch.float64) for _ in range(LAYERS)]
    vs = [torch.randn(1, HKV, 100, HD, dtype=torch.float64) for _ in range(LAYERS)]
    custom = torch.ops.setdlm_bench.int8_linear
    for T in args.rows:
        x, cos, sin = torch.randn(1, T, D), torch.randn(1, T, 1, HD), torch.randn(1, T, 1, HD)
        compiled = torch.compile(lambda *a: layers_forward(layers, *a, custom), dynamic=False)
        t0 = time.perf_counter()
        yc = compiled(x, cos, sin, ks, vs)
        seconds = time.perf_counter() - t0
        ye = layers_forward(layers, x, cos, sin, ks, vs, _product)
        best = {}
        calls = {"eager": (layers_forward, (layers, x, cos, sin, ks, vs, _product)),
                 "compiled": (compiled, (x, cos, sin, ks, vs))}
        for _ in range(3):
            for name, (f, a) in calls.items():
                t = time.process_time()
                for _ in range(20):
                    f(*a)
                best[name] = min(best.get(name, 1e9), (time.process_time() - t) / 20 * 1000)
        print(f"rows {T}: eager {best['eager']:.2f} ms, compiled {best['compiled']:.2f} ms CPU per forward "
              f"({best['eager'] / best['compiled']:.2f}x); compile {seconds:.0f} s; outputs apart by "
              f"{((ye - yc).norm() / ye.norm()).item():.1e} in relative norm, bit-equal: {torch.equal(ye, yc)}",
              flush=True)


if __name__ == "__main__":
    main()
