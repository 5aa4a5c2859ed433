"""Activation (gradient) checkpointing, `setdlm train --grad-checkpointing`: each layer is recomputed in
the backward pass (it runs twice per step), and the gradients (dropout included: the RNG state is
replayed) and the trained weights are exactly those of the plain backward."""

from pathlib import Path

import pytest
import torch

from setdlm import FamilyConfig
from setdlm.objectives import Batch, compute_loss
from setdlm.training import TrainConfig, train

from support import make_model, tiny_hf, write_hamlet


def _grads_and_layer_calls(backbone, layers, on: bool):
    """Gradients of one SetDLM loss (fixed seeds) and how often the first module of ``layers`` started
    (a pre-hook: the recomputation stops early once it has what the backward needs)."""
    backbone.train()
    backbone.grad_checkpointing = on
    calls = []
    hook = layers[0].register_forward_pre_hook(lambda *_: calls.append(1))
    ids = torch.randint(3, 40, (3, 16), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(1)  # dropout
    loss = compute_loss(backbone, FamilyConfig("setdlm", 16, 47, D=2), Batch(ids, torch.ones_like(ids, dtype=torch.bool)),
                        generator=torch.Generator().manual_seed(2)).loss
    backbone.zero_grad()
    loss.backward()
    hook.remove()
    return [p.grad.clone() for p in backbone.parameters()], len(calls)


def _assert_same_gradients_and_recomputed(backbone, layers):
    plain, n_plain = _grads_and_layer_calls(backbone, layers, on=False)
    ckpt, n_ckpt = _grads_and_layer_calls(backbone, layers, on=True)
    assert (n_plain, n_ckpt) == (1, 2)  # the layer ran again in the backward pass
    assert all(torch.equal(a, b) for a, b in zip(plain, ckpt))


def test_dit_with_dropout():
    m = make_model(vocab=48, hidden=32, heads=2, layers=2)
    for mod in m.modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.2
    _assert_same_gradients_and_recomputed(m, m.blocks)  # a block's first module is the block


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_hf_backbones(kind):
    hf = pytest.importorskip("setdlm.formats.hf")
    pytest.importorskip("transformers")
    backbone = hf.HFBackbone(tiny_hf(kind, vocab=48))
    first = backbone.hf.model.layers[0].input_layernorm if kind == "llama" else backbone.hf.transformer.h[0].ln_1
    _assert_same_gradients_and_recomputed(backbone, [first])


def test_no_recomputation_without_grad_or_with_a_cache():
    m = make_model(vocab=48)
    m.grad_checkpointing = True
    calls = []
    m.blocks[0].register_forward_pre_hook(lambda *_: calls.append(1))
    ids = torch.randint(3, 40, (1, 8))
    m.train()
    m(ids, None, None, m.new_cache(1)).sum().backward()  # a cache is written: no checkpointing
    with torch.no_grad():
        m(ids)
    assert len(calls) == 2


def test_train_flag_gives_the_same_run(tmp_path: Path):
    corpus = write_hamlet(tmp_path / "hamlet.txt", 4000)
    kw = dict(data=corpus, family="bd3lm", block_size=4, steps=3, length=32, hidden_size=32, n_layers=2, n_heads=2,
              batch_size=4, grad_accum=2, dropout=0.1, eval_every=0, save_every=0, eval_max=8, log_every=1)
    plain = train(TrainConfig(out=str(tmp_path / "a"), **kw))
    ckpt = train(TrainConfig(out=str(tmp_path / "b"), grad_checkpointing=True, **kw))
    assert [r["loss"] for r in ckpt.history if "loss" in r and "split" not in r] == \
           [r["loss"] for r in plain.history if "loss" in r and "split" not in r]
    assert ckpt.eval["nelbo"] == plain.eval["nelbo"]
