"""Quantized decoding (docs/quantization.md): each kernel computes the documented arithmetic, a row's output
depends on that row alone, and the decoders' exactness contract holds within the quantized model: every
cached step equals the from-scratch forward, and a row decoded in a batch equals the row decoded alone, on
the DiT and on Hugging Face backbones."""

import warnings

import pytest
import torch

from setdlm import FamilyConfig, Model, load
from setdlm.decoding import generate
from setdlm.formats.quantize import (INT4_GROUP, Int4Linear, Int8Linear, Int8WeightLinear, int4_groups, quantization_of,
                                     quantize, self_check)

from support import (MASK, PROMPTS, assert_bd3lm_steps_exact, assert_one_line_error, assert_setdlm_steps_exact,
                     recorded, run, save_tiny, tiny_hf, tiny_model)

TOL = 1e-5  # float64 model, float32 kernels: cached vs recomputed differ by float32 rounding only


def _weights(out=40, inp=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out, inp, generator=g), torch.randn(out, generator=g)


def test_int8_is_per_channel_weights_times_per_row_activations():
    """y = deq(x) · deq(W)ᵀ + b: W symmetric int8 per output channel; each row of x scaled by its own absolute
    maximum into [-1, 1] and rounded to the grid of step 2/127 (zero point 64: uint8 levels 0..128)."""
    w, b = _weights()
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1)) * torch.tensor([[1.0], [10], [0.1], [3], [1]])
    lin = Int8Linear(w, b)
    s_w = w.abs().amax(1, keepdim=True) / 127
    w_deq = torch.round(w / s_w).clamp(-127, 127) * s_w  # (out, in)
    assert torch.allclose(lin.weight, w_deq, atol=1e-6, rtol=0)
    m = x.abs().amax(1, keepdim=True)
    step, zero = 2 / 127, 64
    x_deq = (torch.round(x / m / step + zero) - zero) * step * m  # levels 0..128 of uint8
    ref = x_deq.double() @ w_deq.double().T + b.double()
    assert torch.allclose(lin(x).double(), ref, atol=1e-4, rtol=0)
    assert (lin(x) - (x @ w.T + b)).abs().max() > 1e-3  # it is quantized, not the float product


def test_int4_is_groupwise_asymmetric_weights():
    """y = x · deq(W)ᵀ + b with W in groups of 32 input channels, w = q·s + min, q in 0..15: on the kernel's
    vectorized path (quantize="int4") with bfloat16 scales and offsets, the row rounded to bfloat16 going in and
    the product coming out; with groups given (a GGUF file's) on its float32 path, exactly as given."""
    w, b = _weights(out=40)  # 40 output channels: padded to 48 inside, sliced back
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    g = w.view(40, -1, INT4_GROUP)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    s = (hi - lo) / 15
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the float32 path's slowness warning
        exact = Int4Linear(w, b, int4_groups(w))  # float32 path
    assert exact.activations == torch.float32 and exact._sz.dtype == torch.float32
    w_deq = (torch.round((g - lo) / s) * s + lo).view(40, 64)
    assert torch.allclose(exact.weight, w_deq, atol=1e-5, rtol=0)
    assert torch.allclose(exact(x).double(), x.double() @ w_deq.double().T + b.double(), atol=1e-4, rtol=0)

    fast = Int4Linear(w, b)  # quantize="int4": bfloat16 scales, offsets and activations
    assert fast.activations == torch.bfloat16 and fast._sz.dtype == torch.bfloat16
    sb = s.bfloat16().float()
    zb = (lo + 8 * sb).bfloat16().float()  # the kernel's offset, w = (q − 8)·s + z
    w_bf = ((torch.round((g - (zb - 8 * sb)) / sb).clamp(0, 15) - 8) * sb + zb).view(40, 64)
    assert torch.allclose(fast.weight, w_bf, atol=1e-6, rtol=0)
    assert (fast.weight - w_deq).abs().max() > 1e-4  # the bfloat16 scales are not the float32 ones
    ref = x.bfloat16().double() @ w_bf.double().T  # (3, 40) the row rounded going in
    assert torch.allclose((fast(x) - b).double(), ref, atol=1e-6, rtol=2 ** -8)  # and the product going out
    bare = Int4Linear(w, None)(x)
    assert torch.equal(bare, bare.bfloat16().float())
    assert fast(x).shape == (3, 40)


def test_int4s_head_is_int8_weights_without_quantized_activations():
    """Int8WeightLinear (int4's output head): y = x · (q·s)ᵀ + b with q in -127..127 per output channel and s in
    bfloat16, the row rounded to bfloat16 going in and the product coming out, the row itself not quantized."""
    w, b = _weights(out=40)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1)) * torch.tensor([1.0, 1e-3, 1e3])[:, None]
    x[:, 5] *= 50  # an outlier channel: per-row activation quantization (Int8Linear) loses the small ones
    lin = Int8WeightLinear(w, b)
    s = (w.abs().amax(1) / 127).bfloat16().float()
    w_q = torch.round(w / s[:, None]).clamp(-127, 127) * s[:, None]
    assert torch.equal(lin.weight, w_q) and lin._q.dtype == torch.int8 and lin._s.dtype == torch.bfloat16
    ref = x.bfloat16().double() @ w_q.double().T  # (3, 40)
    got = (lin(x) - b).double()
    assert torch.allclose(got, ref, atol=1e-3 * ref.abs().amax().item() * 2 ** -8, rtol=2 ** -8)
    assert lin.engine.startswith("aten int8 weight-only GEMM")
    act = Int8Linear(w, None)(x).double()  # the per-row 7-bit activations: far off on the quiet channels
    full = x.double() @ w.double().T
    assert (act - full).norm() > 4 * ((got - full).norm())


@pytest.mark.parametrize("kernel", [Int8Linear, Int4Linear, Int8WeightLinear])
def test_a_row_is_a_function_of_itself_alone(kernel):
    """Batched == alone bit for bit, and scaling one row changes no other row (PyTorch's dynamic int8 Linear,
    one activation range per tensor, fails this)."""
    w, b = _weights()
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(2))
    lin = kernel(w, b)
    alone = torch.cat([lin(x[i: i + 1]) for i in range(6)])
    assert torch.equal(lin(x), alone)
    loud = x.clone()
    loud[3] *= 100
    assert torch.equal(lin(loud)[:3], lin(x)[:3]) and torch.equal(lin(loud)[4:], lin(x)[4:])


def test_quantize_replaces_every_linear_layer_and_keeps_the_rest():
    model = tiny_model("setdlm", D=3)
    bb = quantize(model.backbone, "int8")
    assert quantization_of(bb) == "int8" and not bb.training
    kinds = {type(m).__name__ for m in bb.modules()}
    assert "Linear" not in kinds and "Int8Linear" in kinds
    four = quantize(tiny_model("setdlm", D=3).backbone, "int4")  # int4: the head's weights in int8, weight-only
    assert isinstance(four.head, Int8WeightLinear) and isinstance(four.blocks[0].attn_qkv, Int4Linear)
    assert bb.embed.weight.dtype == torch.float64 and bb.new_cache(1).k[0].dtype == torch.float64
    with pytest.raises(ValueError, match="already int8-quantized"):
        quantize(bb, "int4")


@pytest.mark.parametrize("q", ["int8", "int4"])
def test_quantized_logits_stay_close_to_full_precision(q):
    """A sanity bound on the cost: the quantized model's logits track the float ones (the measured quality
    cost on real models is in benchmarks/RESULTS.md)."""
    full = tiny_model("ar")
    ids = torch.tensor([PROMPTS[1]])
    with torch.no_grad():
        ref = full.backbone(ids)
        got = quantize(tiny_model("ar").backbone, q)(ids)
    err = ((got - ref).norm() / ref.norm()).item()
    assert 1e-4 < err < (0.05 if q == "int8" else 0.2)


@pytest.mark.parametrize("q", ["int8", "int4"])
def test_setdlm_steps_exact_on_a_quantized_dit(q):
    model = tiny_model("setdlm", D=3)
    quantize(model.backbone, q)
    model, rec = recorded(model)
    out = generate(model, PROMPTS, max_new_tokens=8, ignore_eos=True, trace=True, threshold=0.3)
    for r, prompt in enumerate(PROMPTS):
        assert_setdlm_steps_exact(model.backbone.inner, rec, out, len(prompt), r, tol=TOL)


@pytest.mark.parametrize("q", ["int8", "int4"])
def test_bd3lm_steps_exact_on_a_quantized_hf_backbone(q):
    from setdlm.formats import hf

    S = 4
    model = Model(quantize(hf.HFBackbone(tiny_hf("llama")), q), FamilyConfig("bd3lm", 32, MASK, block_size=S))
    model, rec = recorded(model)
    out = generate(model, PROMPTS, max_new_tokens=8, ignore_eos=True, trace=True)
    for r, prompt in enumerate(PROMPTS):
        assert_bd3lm_steps_exact(model.backbone.inner, rec, out, r, range(len(prompt)), block_size=S,
                                 prefilled=len(rec.calls) - out.nfe, tol=TOL)


@pytest.mark.parametrize("kind,family", [("llama", "setdlm"), ("gpt2", "ar"), ("qwen3", "bd3lm")])
@pytest.mark.parametrize("q", ["int8", "int4"])
def test_batch_equals_rows_alone_quantized(kind, family, q):
    from setdlm.formats import hf

    model = Model(quantize(hf.HFBackbone(tiny_hf(kind)), q), FamilyConfig(family, 32, MASK, D=2, block_size=4))
    kw = dict(max_new_tokens=8, ignore_eos=True)
    batch = generate(model, PROMPTS, **kw)
    assert batch.tokens == [generate(model, [p], **kw).tokens[0] for p in PROMPTS]


def test_load_quantize_and_its_errors(tmp_path):
    path = save_tiny(tmp_path / "m")
    model = load(path, quantize="int4")
    assert quantization_of(model.backbone) == "int4"
    assert len(generate(model, ["ab"], max_new_tokens=4, ignore_eos=True).tokens[0]) == 4
    with pytest.raises(ValueError, match="quantize must be one of int8, int4"):
        load(path, quantize="int3")
    with pytest.raises(ValueError, match="decodes only and is not saved"):
        model.save(tmp_path / "q")
    model.backbone(torch.tensor([[1, 2]]))  # an eval-mode forward runs
    with pytest.raises(RuntimeError, match="decodes only"):
        model.backbone.train()(torch.tensor([[1, 2]]))


def test_cli_quantize_flag(tmp_path, capsys):
    path = save_tiny(tmp_path / "m")
    code, out, err = run(["generate", path, "--prompt", "ab", "--max-new-tokens", "3", "--quantize", "int8"], capsys)
    assert code == 0, err
    assert_one_line_error(*run(["generate", path, "--prompt", "ab", "--quantize", "fp8"], capsys)[::2], "--quantize")


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("q", ["int8", "int4"])
def test_fused_projections_give_the_same_numbers(kind, q):
    """quantize fuses q/k/v and gate/up into one product each (fewer calls per step); each output channel
    sees the same quantized input row, so the logits equal those of the unfused quantized layers bit for bit."""
    from setdlm.formats import hf
    from setdlm.formats.quantize import head_names, kept_float, kernel_of, linear_layers, replace_layer

    fused = quantize(hf.HFBackbone(tiny_hf(kind)), q)
    plain = hf.HFBackbone(tiny_hf(kind)).eval()
    for name, (w, b) in linear_layers(plain):
        if name not in kept_float(plain, q):
            replace_layer(plain, name, kernel_of(q, name in head_names(plain))(w, b))
    attn = fused.hf.model.layers[0].self_attn
    assert hasattr(attn, "qkv_proj") and not hasattr(attn, "q_proj")
    ids = torch.tensor([PROMPTS[1], PROMPTS[1][::-1]])
    with torch.no_grad():
        assert torch.equal(fused(ids), plain(ids))


class _PerTensorInt8(Int8Linear):
    """The trap of docs/quantization.md: one activation range for the whole input (PyTorch's dynamic Linear),
    so a row's output moves with the other rows."""

    def _matmul(self, x):
        from setdlm.formats.quantize import _INT8_GEMM, ACT_SCALE, ACT_ZERO

        m = x.abs().amax()  # one maximum for the whole input
        return _INT8_GEMM(x / m, ACT_SCALE, ACT_ZERO, self._packed) * m


def test_the_self_check_puts_a_batch_dependent_kernel_back_in_float():
    """check_kernels: a kernel whose rows depend on each other is replaced by the float layer of the same
    weights, with one warning naming kernel and layer; the row-independent kernels stay."""
    from torch import nn

    from setdlm.formats.quantize import check_kernels

    w, b = _weights()
    assert self_check(Int8Linear(w, b)) == 0.0 and self_check(Int4Linear(w, b)) == 0.0
    bad = _PerTensorInt8(w, b)
    assert self_check(bad) > 1e-3
    root = nn.Sequential(bad, nn.ReLU(), Int8Linear(torch.randn(40, 40), None))
    with pytest.warns(RuntimeWarning, match=r"int8 kernel \(fbgemm.*64->40 layer.*0 runs in float32"):
        check_kernels(root)
    assert type(root[0]) is nn.Linear and isinstance(root[2], Int8Linear)
    assert torch.equal(root[0].weight, bad.weight)


def test_int8_packs_for_fbgemm_whatever_engine_is_set():
    """The int8 kernel is chosen, not inherited: with another quantized engine in force the packing still
    targets fbgemm (the engine is put back after), and repr names the kernel and the CPU level."""
    w, b = _weights()
    before = torch.backends.quantized.engine
    x = torch.randn(3, 64)
    ref = Int8Linear(w, b)(x)
    for engine in ("qnnpack", "onednn"):
        if engine not in torch.backends.quantized.supported_engines:
            continue
        torch.backends.quantized.engine = engine
        try:
            lin = Int8Linear(w, b)
            assert torch.backends.quantized.engine == engine
            assert torch.equal(lin(x), ref)
        finally:
            torch.backends.quantized.engine = before
    text = repr(Int8Linear(w, b))
    assert "int8 (fbgemm u8s8 GEMM" in text and torch.backends.cpu.get_cpu_capability() in text


def test_quantized_backbones_attend_in_float64_and_say_which_engines_run():
    """The attention of a quantized model rounds once from float64, so a row's keys padded or not give the
    same float32 numbers, which the per-row int8 quantizer then sees alike."""
    from setdlm.model import attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 5, 16, generator=g) for _ in range(3))
    pad = torch.randn(1, 4, 27, 16, generator=g)
    keys, vals = torch.cat([k, pad], 2), torch.cat([v, pad], 2)
    mask = torch.zeros(1, 1, 5, 32, dtype=torch.bool)
    mask[..., :5] = torch.ones(5, 5, dtype=torch.bool).tril()
    alone = attention(q, k, v, mask[..., :5], wide=True)
    assert torch.equal(attention(q, keys, vals, mask, wide=True), alone)
    assert alone.dtype == torch.float32
    bb = quantize(tiny_model("ar").backbone.float(), "int8")
    assert all(blk.wide_attention for blk in bb.blocks)
    assert bb.quantization_engine.startswith("int8: fbgemm u8s8 GEMM")


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_a_float64_cache_and_additive_mask_give_the_numbers_of_a_float32_cache_and_boolean_mask(kind):
    """A quantized float32 HF backbone keeps its cache in float64 and hands SDPA a 0/−inf float64 mask made once
    per step (fewer conversions a step): its cached decode gives bit for bit what a float32 cache gives, and
    the additive mask what SDPA makes of the boolean one (a 20-key step: past the 16 where a float32 mask on
    float64 queries goes wrong)."""
    from setdlm.formats import hf
    from setdlm.masks import causal_mask, with_cache
    from setdlm.model import KVCache, attention

    bb = quantize(hf.HFBackbone(tiny_hf(kind, dtype=torch.float32)), "int8")
    cache = bb.new_cache(2, capacity=40)
    assert cache.k[0].dtype == torch.float64
    narrow = KVCache(bb.n_layers, 2, bb.n_kv_heads, bb.head_dim, dtype=torch.float32, capacity=40)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (2, 20), generator=g)
    real = torch.ones(2, 20, dtype=torch.bool)
    real[1, 14:] = False  # a ragged second row
    with torch.no_grad():
        steps = []
        for c in (cache, narrow):
            first = bb(ids, None, causal_mask(real), c, keep=real.sum(-1))
            pos = c.lengths[:, None] + torch.arange(3)  # (2, 3)
            nxt = bb(ids[:, :3], pos, with_cache(torch.ones(2, 3, 3, dtype=torch.bool).tril(), c.width), c)
            steps.append((first, nxt))
    assert torch.equal(steps[0][0], steps[1][0]) and torch.equal(steps[0][1], steps[1][1])
    q, k, v = (torch.randn(2, 4, 20, 16, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(2, 1, 20, 20, generator=g) < 0.6
    mask |= torch.eye(20, dtype=torch.bool)
    additive = torch.zeros(mask.shape, dtype=torch.float64).masked_fill_(~mask, float("-inf"))
    assert torch.equal(attention(q, k, v, mask), attention(q, k, v, additive))


def test_the_int8_product_is_called_through_its_overload():
    """The int8 product is the op's overload, not its packet: a packet whose op takes a packed-weight object
    inspects every call's arguments in Python first (docs/quantization.md, "Per-step overhead")."""
    from setdlm.formats.quantize import _INT8_GEMM

    assert isinstance(_INT8_GEMM, torch._ops.OpOverload)
