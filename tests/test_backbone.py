"""The Backbone protocol (docs/method.md §3, §9.3): what decoders and objectives call. Our DiT and the Hugging Face
adapter both satisfy it, structurally (isinstance) and in behaviour: a call with a cache gives the logits of
the same call without one, and AR greedy decoding through ``setdlm.generate`` picks the uncached argmax."""

import pytest
import torch

from support import make_model
from setdlm import Backbone, FamilyConfig, Model
from setdlm.decoding import generate
from setdlm.masks import causal_mask


def _honours_the_contract(bb) -> None:
    assert isinstance(bb, Backbone)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 30, (2, 6), generator=g)  # (B, T)
    pos = torch.arange(6).expand(2, 6)  # (B, T)
    valid = torch.ones(2, 6, dtype=torch.bool)
    mask = causal_mask(valid)  # (B, 1, T, T)
    full = bb(ids, pos, mask)  # (B, T, V)
    cache = bb.new_cache(2, capacity=4)  # grows past its capacity
    head = bb(ids[:, :4], pos[:, :4], mask[:, :, :4, :4], cache, keep=4)  # prefill, (B, 4, V)
    tail = bb(ids[:, 4:], pos[:, 4:], mask[:, :, 4:, :], cache, logits_start=1)  # (B, 1, V): the last token
    assert head.shape == (2, 4, full.shape[-1]) and tail.shape == (2, 1, full.shape[-1])
    torch.testing.assert_close(head, full[:, :4], atol=1e-9, rtol=0)
    torch.testing.assert_close(tail, full[:, 5:], atol=1e-9, rtol=0)
    prompt = ids[0, :4].tolist()
    fam = FamilyConfig("ar", length=16, mask_token_id=31)
    out = generate(Model(bb, fam), [prompt], max_new_tokens=1, ignore_eos=True)
    with torch.no_grad():
        want = bb(torch.tensor([prompt]), torch.arange(4)[None], causal_mask(torch.ones(1, 4, dtype=torch.bool)))
    assert out.tokens[0] == [int(want[0, -1, :31].argmax())]  # greedy, MASK (id 31) never sampled


def test_our_transformer_is_a_backbone():
    _honours_the_contract(make_model(vocab=32))


def test_the_hugging_face_adapter_is_a_backbone():
    pytest.importorskip("transformers")
    from setdlm.formats.hf import HFBackbone
    from support import tiny_hf

    _honours_the_contract(HFBackbone(tiny_hf("llama", vocab=32)))
    _honours_the_contract(HFBackbone(tiny_hf("gpt2", vocab=32)))


def test_what_is_not_a_backbone():
    assert not isinstance(torch.nn.Linear(2, 2), Backbone)  # no new_cache
    assert not isinstance(object(), Backbone)
