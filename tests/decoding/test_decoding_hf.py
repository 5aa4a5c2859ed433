"""The decoders on a Hugging Face backbone (``setdlm.formats.hf.HFBackbone``): they use only the backbone contract
and ``new_cache``, so every decoder runs unchanged; a batch equals its rows alone, and each SetDLM step
equals the from-scratch training forward, with every cached entry clean.

Tolerance 1e-6: Llama/Qwen RMSNorm computes in float32 even in a float64 model (see test_hf.py); a wrong
mask or a MASK state left in the cache is off by ~1e-1."""

import pytest

from setdlm import FamilyConfig, Model
from setdlm.decoding import applicable, generate

from support import PROMPTS, assert_setdlm_steps_exact, recorded, tiny_hf

hf = pytest.importorskip("setdlm.formats.hf")
pytest.importorskip("transformers")

TOL = 1e-6
MASK = 99  # the tiny HF models have 100 ids


@pytest.mark.parametrize("kind", ["qwen3", "gpt2"])
@pytest.mark.parametrize("family", ["ar", "mdlm", "bd3lm", "setdlm"])
def test_batch_equals_rows_alone_on_hf_backbones(kind, family):
    model = Model(hf.HFBackbone(tiny_hf(kind)), FamilyConfig(family, 32, MASK, D=2, block_size=4))
    kw = dict(max_new_tokens=8, ignore_eos=True, **applicable(family, threshold=0.2))
    batch = generate(model, PROMPTS, **kw)
    assert batch.tokens == [generate(model, [p], **kw).tokens[0] for p in PROMPTS]
    assert [len(t) for t in batch.tokens] == [8, 8, 8]


@pytest.mark.parametrize("kind", ["qwen3", "gpt2"])
def test_setdlm_steps_equal_training_forward_on_hf_backbones(kind):
    model, rec = recorded(Model(hf.HFBackbone(tiny_hf(kind)), FamilyConfig("setdlm", 32, MASK, D=3)))
    out = generate(model, PROMPTS, max_new_tokens=8, threshold=0.2, ignore_eos=True, trace=True)
    for r, prompt in enumerate(PROMPTS):
        assert_setdlm_steps_exact(model.backbone.inner, rec, out, len(prompt), r, tol=TOL, mask_id=MASK)
