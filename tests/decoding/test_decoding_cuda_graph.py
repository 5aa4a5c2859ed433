"""CUDA-graph decoding (setdlm.decoding.cuda_graph): on the CPU, the static-capacity cache attended over its
whole bucket, unused slots masked, gives the tokens of the dynamic cache for every decoder (ragged batches,
rows finishing at different steps, overflow eviction, speculative steps); where CUDA exists, the captured
graphs give the eager tokens (skipped without CUDA)."""

import pytest
import torch

from support import PROMPTS, tiny_model
from setdlm import Model
from setdlm.decoding import generate
from setdlm.decoding.cuda_graph import GraphedBackbone, bucket

CASES = [("ar", {}, {}), ("bd3lm", {}, {}), ("bd3lm", {}, {"threshold": 0.3}), ("mdlm", {}, {}),
         ("setdlm", {"D": 3}, {}), ("setdlm", {"D": 3}, {"threshold": 0.3}), ("setdlm", {"D": 3}, {"speculate": True}),
         ("setdlm", {"D": 3}, {"cache_order": "reveal"}),
         ("setdlm", {"D": 3, "ar_weight": 1.0}, {"speculate": "next_token"})]


class Widths(torch.nn.Module):
    """The backbone, recording the key width (mask columns) of every cached forward."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.widths = inner, []

    def forward(self, ids, pos=None, mask=None, cache=None, **kw):
        if cache is not None:
            self.widths.append((mask.shape[-1], cache.capacity))
        return self.inner(ids, pos, mask, cache, **kw)

    def new_cache(self, batch, capacity=64):
        return self.inner.new_cache(batch, capacity)


@pytest.mark.parametrize("family,fam,kw", CASES)
def test_static_cache_gives_the_dynamic_tokens(family, fam, kw):
    model = tiny_model(family, **fam)
    ref = generate(model, PROMPTS, max_new_tokens=10, ignore_eos=True, seed=[1, 2, 3], temperature=0.7, **kw)
    rec = Widths(model.backbone)
    graphed = GraphedBackbone(rec, capture=False)
    out = generate(Model(graphed, model.family), PROMPTS, max_new_tokens=10, ignore_eos=True, seed=[1, 2, 3],
                   temperature=0.7, **kw)
    assert out.tokens == ref.tokens and out.row_nfe == ref.row_nfe
    if family != "mdlm":  # every cached forward attended over the whole bucket
        assert rec.widths and all(w == c and c == bucket(c) for w, c in rec.widths)


def test_rows_finishing_apart_and_overflow():
    """EOS ends rows at different steps (rows leave: the cache's storage moves); prompt + new tokens beyond
    L evicts cache entries (docs/method.md §4.5)."""
    model = tiny_model("setdlm", L=16, D=3)
    ref = generate(model, PROMPTS, max_new_tokens=14, threshold=0.3, eos_token_id=3)
    out = generate(Model(GraphedBackbone(model.backbone, capture=False), model.family), PROMPTS, max_new_tokens=14,
                   threshold=0.3, eos_token_id=3)
    assert out.tokens == ref.tokens and out.finish_reason == ref.finish_reason
    assert len(set(ref.row_nfe)) > 1  # the rows did leave at different steps


def test_bucket():
    assert [bucket(n) for n in (1, 16, 17, 64, 65, 1000)] == [16, 16, 32, 64, 128, 1024]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")
@pytest.mark.parametrize("family,fam,kw", [c for c in CASES if c[0] != "mdlm"])
def test_captured_graphs_give_the_eager_tokens(family, fam, kw):
    model = tiny_model(family, dtype=torch.float32, **fam)
    model.backbone.cuda()
    ref = generate(model, PROMPTS, max_new_tokens=10, ignore_eos=True, **kw)
    graphed = GraphedBackbone(model.backbone)
    out = generate(Model(graphed, model.family), PROMPTS, max_new_tokens=10, ignore_eos=True, **kw)
    assert out.tokens == ref.tokens
    assert graphed.replays > 0
