"""Bugs the type checker found in the set drafter's code (issue #47 item 2), each pinned: base features asked of a
layer the base does not have are a UserError naming the layers (they were a list holding None, which failed later
in the drafter's torch.cat); a drafter config reading a negative base layer is refused when built; a drafter over
a model that is not a Hugging Face one is a UserError (it was an AttributeError); a static cache given a mask rule
is the ValueError that asks for a buffer mask (it was an AttributeError)."""

import pytest
import torch

from setdlm.drafter import DrafterConfig
from setdlm.errors import UserError
from setdlm.family import FamilyConfig
from setdlm.formats.drafted import base_features
from setdlm.formats.hf import HFBackbone
from setdlm.lm import Model
from setdlm.mask_rules import MaskRule
from setdlm.model import KVCache, begin_step
from setdlm.training.drafter import _hf_base

from support import tiny_hf, tiny_model


def test_base_features_of_a_layer_the_base_lacks_are_refused():
    base = HFBackbone(tiny_hf("llama"))  # 2 layers
    ids = torch.tensor([[1, 2, 3]])
    feats = base_features(base, ids, None, (0, 1))
    assert len(feats) == 2 and all(f.shape == (1, 3, 32) for f in feats)
    for layers in [(0, 2), (-1, 1)]:
        with pytest.raises(UserError, match=r"base's are 0\.\.1"):
            base_features(base, ids, None, layers)


def test_a_drafter_config_reading_a_negative_base_layer_is_refused():
    kw = dict(hidden_size=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, intermediate_size=64, window=3,
              vocab_size=10)
    assert DrafterConfig(feature_layers=(0, 1), **kw).feature_layers == (0, 1)
    with pytest.raises(UserError, match="feature_layers"):
        DrafterConfig(feature_layers=(-1, 1), **kw)


def test_a_drafter_base_that_is_not_a_hugging_face_model_is_refused():
    hf = HFBackbone(tiny_hf("llama"))
    assert _hf_base(Model(hf, FamilyConfig("ar", 16, 99)), "hf") is hf
    with pytest.raises(UserError, match="Hugging Face"):
        _hf_base(tiny_model("ar"), "dit")


def test_a_static_cache_given_a_mask_rule_asks_for_a_buffer_mask():
    cache = KVCache(1, 1, 2, 4, capacity=8)
    cache.static = True
    pos = torch.arange(3)[None]
    with pytest.raises(ValueError, match="static cache needs"):
        begin_step(cache, pos, MaskRule("causal", torch.ones(1, 3, dtype=torch.bool)))
