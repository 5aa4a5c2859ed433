"""quantize="gguf" (setdlm.formats.gguf_quant, docs/quantization.md): a GGUF file's Q8_0 / Q4_0 / Q4_1 matrices load
into the int8 / int4 kernels instead of staying dequantized float32; Q4 blocks are taken as they are (the
kernel's weights are the file's weights), the logits stay close to the float path, and the decoders' cache
exactness holds on the result."""

import pytest
import torch

import setdlm
from setdlm import FamilyConfig, Model
from setdlm.decoding import generate
from setdlm.formats.quantize import Int4Linear, Int8Linear, quantization_of, quantize

from support import PROMPTS, assert_bd3lm_steps_exact, recorded
from test_gguf import cache, write_tiny_gguf  # noqa: F401  (cache: a fixture)

LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _linears(model):
    return {n.rsplit(".", 1)[-1]: m for n, m in model.backbone.hf.named_modules() if n.rsplit(".", 1)[-1] in
            (*LAYERS, "lm_head")}


@pytest.mark.parametrize("qtype,kernel", [("Q8_0", Int8Linear), ("Q4_0", Int4Linear), ("Q4_1", Int4Linear)])
def test_a_quantized_gguf_file_loads_into_its_kernel(cache, tmp_path, qtype, kernel):  # noqa: F811
    path = write_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", d=64, qtype=qtype)
    full, quant = setdlm.load(str(path)), setdlm.load(str(path), quantize="gguf")
    assert quantization_of(quant.backbone) == "gguf"
    assert set(quant.backbone.gguf_types.values()) == {qtype} and len(quant.backbone.gguf_types) == 7
    for name, layer in _linears(quant).items():
        if name == "lm_head":  # the output head stays float32: the file's weights dequantized, exactly
            assert type(layer) is torch.nn.Linear and torch.equal(layer.weight, _linears(full)[name].weight)
            continue
        assert isinstance(layer, kernel), name
        if kernel is Int4Linear:  # the file's blocks as they are: the weights of the float path (to rounding)
            assert torch.allclose(layer.weight, _linears(full)[name].weight, atol=1e-7, rtol=0), name
    ids = torch.tensor([[5, 40, 77, 3, 120, 9, 200, 31]])
    keep = torch.arange(full.backbone.vocab_size) != full.family.mask_token_id  # the MASK row is not the file's
    with torch.no_grad():
        a, b = quant.backbone(ids)[..., keep], full.backbone(ids)[..., keep]
    err = ((a - b).norm() / b.norm()).item()
    assert err < (0.05 if qtype == "Q8_0" else 1e-5), err  # Q4: the same weights; Q8_0: 7-bit activations too
    if qtype == "Q8_0":
        assert err > 1e-5  # it runs the int8 kernel, not the float path


def test_cache_exactness_on_a_q8_0_gguf_model(cache, tmp_path):  # noqa: F811
    """BD3LM on the loaded Q8_0 model: every cached step equals the two-stream forward from scratch."""
    base = setdlm.load(str(write_tiny_gguf(tmp_path / "q8.gguf", d=64, qtype="Q8_0")), quantize="gguf",
                       dtype=torch.float64)  # float64 around the kernels: cached vs recomputed differ by rounding only
    S = 4
    model = Model(base.backbone, FamilyConfig("bd3lm", 64, base.family.mask_token_id, block_size=S))
    model, rec = recorded(model)
    out = generate(model, PROMPTS, max_new_tokens=8, ignore_eos=True, trace=True)
    for r, prompt in enumerate(PROMPTS):
        assert_bd3lm_steps_exact(model.backbone.inner, rec, out, r, range(len(prompt)), block_size=S,
                                 prefilled=len(rec.calls) - out.nfe, tol=1e-5, mask_id=base.family.mask_token_id)


def test_gguf_quantization_needs_a_gguf_file(tmp_path):
    from support import save_tiny

    with pytest.raises(ValueError, match="is not a GGUF file"):
        setdlm.load(save_tiny(tmp_path / "m"), quantize="gguf")
    with pytest.raises(ValueError, match="load the file with"):
        quantize(setdlm.load(save_tiny(tmp_path / "m")).backbone, "gguf")
