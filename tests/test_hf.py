"""Hugging Face backbone adapter (setdlm.formats.hf): exactness against plain transformers, the two-stream mask
against a cached decode path, the generic cache contract, training, MASK token, loading. Tiny random
Llama / Qwen2 / Qwen3 / GPT-2 configs built locally; float64; no network."""

import os
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from setdlm.family import FamilyConfig  # noqa: E402
from setdlm.formats.hf import HFBackbone, adapt, load_pretrained  # noqa: E402
from setdlm.formats.hub import HubUnreachableError  # noqa: E402
from setdlm.masks import causal_mask  # noqa: E402
from setdlm.objectives import Batch, compute_loss, setdlm_inputs  # noqa: E402
from setdlm.schedules import StaggeredSchedule  # noqa: E402
from support import tiny_hf, tiny_tokenizer  # noqa: E402
from support.backbone_contract import (bad_mask_width_and_batch, cache_exact_ragged_append_crop,  # noqa: E402
                                      cache_storage_order_irrelevant, select_rows_and_keep_zero)

V = 100  # vocabulary of the tiny models; the backbone contract (support.backbone_contract) uses ids < 32
FAMILIES = ("llama", "qwen2", "qwen3", "gpt2")
# Llama/Qwen RMSNorm computes in float32 even in a float64 model (transformers' choice, kept as is), so two
# float64 paths agree to ~1e-15 unless a float32 rounding flips (~1e-8). A wrong mask or cache is ~1e-1.
ATOL = 1e-9


# ---------------------------------------------------------------------------------------------------------
# (1) causal mask + natural positions == plain transformers
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", FAMILIES)
def test_causal_matches_plain_transformers(kind):
    m = tiny_hf(kind)
    bb = HFBackbone(m)
    g = torch.Generator().manual_seed(0)
    B, L = 3, 20
    ids = torch.randint(0, V, (B, L), generator=g)
    lengths = [20, 13, 7]  # ragged rows, right padding for the adapter
    valid = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]
    pos = torch.arange(L).expand(B, L)
    with torch.no_grad():
        out = bb(ids, pos, causal_mask(valid))  # (B, L, V)
        tail = bb(ids, pos, causal_mask(valid), logits_start=5)
        for b, n in enumerate(lengths):  # transformers on each row alone: its default path, no mask given
            ref = m(ids[b:b + 1, :n]).logits[0]  # (n, V)
            assert torch.allclose(out[b, :n], ref, atol=1e-12, rtol=0), b
    assert out.shape == (B, L, V)
    assert torch.allclose(tail, out[:, 5:], atol=1e-12, rtol=0)


# ---------------------------------------------------------------------------------------------------------
# (2) two-stream SetDLM mask == incremental cached decode path
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", FAMILIES)
def test_two_stream_equals_cached_decode(kind):
    """Every clean slot and every target query of the two-stream forward is recomputed by a cached path:
    rows grow their cache by different chunks of the reveal order (ragged); each step appends clean tokens
    causally and asks MASK queries for ranks a..a+c (each seeing the cache, the new clean tokens of lower
    rank and itself), keeps only the clean ones (``keep=``), and once crops rows back and re-appends."""
    bb = HFBackbone(tiny_hf(kind))
    mask_id = V - 1
    g = torch.Generator().manual_seed(1)
    B, L = 3, 12
    ids = torch.randint(0, mask_id, (B, L), generator=g)
    valid = torch.arange(L)[None, :] < torch.tensor([[12], [9], [10]])
    context = torch.arange(L)[None, :] < torch.tensor([[3], [0], [2]])
    batch = Batch(ids, valid, context)
    order = StaggeredSchedule.from_dm(L, 2, 4).sample_order(batch.targets, generator=g)  # (B, L)
    inp = setdlm_inputs(batch, order, mask_id)
    with torch.no_grad():
        ref = bb(inp.input_ids, inp.position_ids, inp.attn_mask)  # (B, 2L, V): [clean | query] streams
    n_valid = valid.sum(1).tolist()
    chunks = [[3, 1, 4, 2, 2, 5], [1, 2, 2, 4, 3], [5, 1, 1, 3, 4]]  # per row, clean ranks per step
    crops = {2: [2, 0, 1]}  # after step 2, drop the last cached entries of rows 0 and 2 (re-appended later)
    cache = bb.new_cache(B, capacity=3)
    done = [0] * B  # ranks cached per row
    checked = 0
    for step in range(6):
        plan = []
        for b in range(B):
            c = min(chunks[b][step] if step < len(chunks[b]) else 0, n_valid[b] - done[b])
            queries = [j for j in range(done[b], min(done[b] + c + 1, n_valid[b])) if inp.targets[b, j]]
            plan.append((c, queries))
        T = max(c + len(q) for c, q in plan)
        C = cache.width
        x = torch.full((B, T), mask_id)
        pos = torch.zeros(B, T, dtype=torch.long)
        mask = torch.zeros(B, 1, T, C + T, dtype=torch.bool)
        for b, (c, queries) in enumerate(plan):
            a = done[b]
            mask[b, 0, :, :a] = True  # the row's cache: ranks < a
            for i in range(c):  # clean ranks a..a+c-1, causal among themselves (inclusive)
                x[b, i], pos[b, i] = inp.clean[b, a + i], order[b, a + i]
                mask[b, 0, i, C:C + i + 1] = True
            for s, j in enumerate(queries, start=c):  # MASK query for rank j: new clean of rank < j, itself
                pos[b, s] = order[b, j]
                mask[b, 0, s, C:C + (j - a)] = True
                mask[b, 0, s, C + s] = True
            for s in range(c + len(queries), T):
                mask[b, 0, s, C + s] = True  # padding slots
        with torch.no_grad():
            out = bb(x, pos, mask, cache, keep=torch.tensor([c for c, _ in plan]))  # (B, T, V)
        for b, (c, queries) in enumerate(plan):
            a = done[b]
            assert torch.allclose(out[b, :c], ref[b, a:a + c], atol=ATOL, rtol=0), (step, b)
            for s, j in enumerate(queries, start=c):
                assert torch.allclose(out[b, s], ref[b, L + j], atol=ATOL, rtol=0), (step, b, j)
                checked += 1
            done[b] += c
        assert cache.lengths.tolist() == done
        if step in crops:
            done = [d - k for d, k in zip(done, crops[step])]
            cache.crop(torch.tensor(done))
    assert done == n_valid
    assert checked > int(batch.targets.sum())  # every target rank at least once, some twice


@pytest.mark.parametrize("kind", FAMILIES)
def test_two_stream_matches_transformers_eager_route(kind):
    """An independent reference: the authors' route (docs/method.md §3.2, §7.18), plain transformers with eager
    attention, the two-stream mask as a dense additive float mask and the permuted position ids. Eager
    softmax runs in float32 for the Llama family, hence the tolerance."""
    if kind == "gpt2" and int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("transformers 4.x GPT-2 overflows building its float64 mask (its own bug)")
    m = tiny_hf(kind)
    bb = HFBackbone(m)
    g = torch.Generator().manual_seed(2)
    B, L = 2, 10
    ids = torch.randint(0, V - 1, (B, L), generator=g)
    valid = torch.arange(L)[None, :] < torch.tensor([[10], [7]])
    batch = Batch(ids, valid, torch.arange(L)[None, :] < torch.tensor([[2], [0]]))
    inp = setdlm_inputs(batch, StaggeredSchedule.from_dm(L, 2, 4).sample_order(batch.targets, generator=g), V - 1)
    additive = torch.zeros(inp.attn_mask.shape, dtype=torch.float64).masked_fill(~inp.attn_mask, -1e30)
    m.config._attn_implementation = "eager"
    with torch.no_grad():
        ours = bb(inp.input_ids, inp.position_ids, inp.attn_mask)  # (B, 2L, V)
        ref = m(inp.input_ids, attention_mask=additive, position_ids=inp.position_ids).logits  # (B, 2L, V)
    slots = torch.cat([valid.gather(1, inp.order)] * 2, 1)  # (B, 2L): padding slots are garbage in both
    assert torch.allclose(ours[slots], ref[slots], atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ("llama", "qwen3", "gpt2"))
def test_generic_cache_contract(kind):
    """The backbone contract the DiT passes (support.backbone_contract, run in tests/test_model.py) passes
    unchanged on the adapter: ragged append/crop with capacity growth, storage order, select_rows and keep=0,
    bad input."""
    bb = HFBackbone(tiny_hf(kind))
    cache_exact_ragged_append_crop(bb)
    cache_storage_order_irrelevant(bb)
    select_rows_and_keep_zero(bb)
    bad_mask_width_and_batch(bb)


# ---------------------------------------------------------------------------------------------------------
# (3) training lowers the loss
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ("llama", "qwen3", "gpt2"))
@pytest.mark.parametrize("family", ("setdlm", "bd3lm"))
def test_few_adamw_steps_lower_the_loss(kind, family):
    m = tiny_hf(kind, dtype=torch.float32)
    bb, mask_id = adapt(m, tiny_tokenizer())  # adds <|mask|> and grows the embeddings
    fam = FamilyConfig(family, length=16, mask_token_id=mask_id, D=2, block_size=4)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 63, (4, 16), generator=g)
    batch = Batch(ids, torch.ones_like(ids, dtype=torch.bool), torch.arange(16).expand(4, 16) < 4)

    def loss_at(seed):
        with torch.no_grad():
            return float(compute_loss(bb.eval(), fam, batch, generator=torch.Generator().manual_seed(seed)).loss)

    before = loss_at(123)
    opt = torch.optim.AdamW(bb.parameters(), lr=1e-2)
    bb.train()
    for step in range(10):
        loss = compute_loss(bb, fam, batch, generator=torch.Generator().manual_seed(step)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = loss_at(123)
    assert after < 0.8 * before, (before, after)


# ---------------------------------------------------------------------------------------------------------
# MASK token
# ---------------------------------------------------------------------------------------------------------


def test_mask_token_added_and_embeddings_resized():
    tok = tiny_tokenizer()
    m = tiny_hf("gpt2", vocab=len(tok))
    ids = torch.randint(0, len(tok), (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = m(ids).logits  # (2, 9, 63)
    bb, mask_id = adapt(m, tok)
    assert mask_id == 63 and tok.mask_token == "<|mask|>" and len(tok) == 64
    assert bb.vocab_size == 64 and m.get_input_embeddings().num_embeddings == 64
    assert m.lm_head.weight is m.transformer.wte.weight  # GPT-2's tied head follows the resize
    with torch.no_grad():
        after = bb(ids, None, causal_mask(torch.ones(2, 9, dtype=torch.bool)))  # (2, 9, 64)
    assert torch.allclose(after[..., :63], before, atol=1e-12, rtol=0)  # old rows untouched
    assert adapt(m, tok)[1] == 63  # idempotent


def test_existing_mask_token_and_spare_rows_are_kept():
    tok = tiny_tokenizer()
    tok.add_special_tokens({"mask_token": "[MASK]"})
    m = tiny_hf("qwen3", vocab=80)  # spare embedding rows, like Qwen's 151936 > len(tokenizer)
    bb, mask_id = adapt(m, tok)
    assert mask_id == 63 and tok.mask_token == "[MASK]" and bb.vocab_size == 80
    tok2 = tiny_tokenizer()
    _, mask2 = adapt(tiny_hf("llama", vocab=80), tok2)
    assert mask2 == 63 and tok2.mask_token == "<|mask|>"  # added to the tokenizer, no resize needed


def test_unsupported_configs_raise():
    with pytest.raises(ValueError, match="unsupported model_type 'mistral'"):
        HFBackbone(transformers.MistralForCausalLM(transformers.MistralConfig(
            vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2)))
    cfg = transformers.Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                                   sliding_window=8, max_window_layers=0)
    with pytest.raises(ValueError, match="sliding-window"):
        HFBackbone(transformers.Qwen2ForCausalLM(cfg))
    bb = HFBackbone(tiny_hf("gpt2"))
    with pytest.raises(ValueError, match=r"position ids must lie in \[0, 128\)"):
        bb(torch.zeros(1, 2, dtype=torch.long), torch.tensor([[0, 128]]))


# ---------------------------------------------------------------------------------------------------------
# (4) loading: local folder offline, Hub id needs network
# ---------------------------------------------------------------------------------------------------------


def _save_tiny(folder: Path, kind: str = "llama"):
    tok = tiny_tokenizer()
    m = tiny_hf(kind, vocab=len(tok), dtype=torch.float32)
    m.save_pretrained(folder)
    tok.save_pretrained(folder)
    return m


def test_load_local_folder_offline(tmp_path, no_network):
    m = _save_tiny(tmp_path / "tiny")
    bb, tok, mask_id = load_pretrained(str(tmp_path / "tiny"), dtype=torch.float64, cache_dir=str(no_network))
    assert mask_id == 63 and tok.mask_token_id == 63 and tok.vocab_size == 64 and bb.vocab_size == 64
    assert tok.encode("w0 w1 w7") == [3, 4, 10] and tok.decode([3, 4, 63]) == "w0 w1 <|mask|>"
    ids = torch.tensor([[3, 4, 10, 12]])
    with torch.no_grad():
        ref = m.double()(ids).logits
        out = bb(ids, None, causal_mask(torch.ones(1, 4, dtype=torch.bool)))[..., :63]
    assert torch.allclose(out, ref, atol=1e-6, rtol=0)  # saved in float32, loaded in float64
    with pytest.raises(ValueError, match="no model folder at"):
        load_pretrained(str(tmp_path / "missing"))


def test_hub_id_offline_gives_clear_error(no_network):
    with pytest.raises(HubUnreachableError, match="needs network access.*local folder"):
        load_pretrained("someone/tiny-llama", cache_dir=str(no_network))


def test_hub_id_unreachable_hub_gives_clear_error(monkeypatch, no_network):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: connection refused at once
    with pytest.raises(HubUnreachableError, match="needs network access.*local folder"):
        load_pretrained("someone/tiny-llama", cache_dir=str(no_network))


def test_hub_id_offline_loads_from_the_hf_cache(tmp_path, no_network):
    """Offline, a Hub id already in the HF cache loads from it (the cache layout huggingface_hub writes)."""
    commit = "0" * 40
    repo = no_network / "models--someone--tiny-qwen3"
    _save_tiny(repo / "snapshots" / commit, "qwen3")
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    bb, tok, mask_id = load_pretrained("someone/tiny-qwen3", cache_dir=str(no_network))
    assert bb.kind == "qwen3" and mask_id == 63 and os.environ["HF_HUB_OFFLINE"] == "1"


def test_the_generation_configs_end_of_turn_ids_stop_every_path():
    """A wrapped model's generation config may list several EOS ids (Qwen: <|im_end|> and <|endoftext|>):
    each one ends a row in ``generate`` and in a server session's row, as the tokenizer's EOS does."""
    from setdlm import FamilyConfig, Model
    from setdlm.decoding import generate
    from setdlm.decoding.api import end_of_turn_ids
    from setdlm.decoding.session import prepare
    from setdlm.formats.hf import setdlm_tokenizer

    tok = tiny_tokenizer()
    backbone, mask_id = adapt(tiny_hf("llama", vocab=len(tok), dtype=torch.float32), tok)
    model = Model(backbone, FamilyConfig("ar", 16, mask_id), setdlm_tokenizer(tok))
    prompt = [1, 5, 9]
    free = generate(model, [prompt], max_new_tokens=6, ignore_eos=True).tokens[0]
    first = free[0]
    backbone.hf.generation_config.eos_token_id = [tok.eos_token_id, first]
    assert end_of_turn_ids(model) == (tok.eos_token_id, first)
    out = generate(model, [prompt], max_new_tokens=6)
    assert out.tokens[0] == [first] and out.finish_reason[0] == "eos"
    assert first in prepare(model, prompt, max_new_tokens=6).config.sampling.eos_token_ids
    eos = tok.eos_token_id  # an explicit eos_token_id replaces them
    alone = free[: free.index(eos) + 1] if eos in free else free
    assert first != eos and generate(model, [prompt], max_new_tokens=6, eos_token_id=eos).tokens[0] == alone


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_the_float32_rms_norm_is_the_modules_own_bit_for_bit(kind):
    """setdlm.formats.hf.rms_norm runs a Llama/Qwen RMSNorm as one F.rms_norm call in float32 (fewer ops a
    layer); it must give the module's own numbers exactly, in every shape a decode feeds it."""
    from setdlm.formats.hf import rms_norm

    m = tiny_hf(kind, dtype=torch.float32)
    norms = [m.model.norm, m.model.layers[0].input_layernorm]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for norm in norms:
            norm.weight.copy_(torch.randn(norm.weight.shape, generator=g))
            for shape in [(1, 1), (1, 3), (8, 1), (3, 17), (2, 64)]:
                x = torch.randn(*shape, norm.weight.numel(), generator=g) * torch.logspace(-3, 3, shape[1])[:, None]
                assert torch.equal(rms_norm(norm, x), norm(x)), shape
            x16 = torch.randn(2, 5, norm.weight.numel(), generator=g).bfloat16()
            assert torch.equal(rms_norm(norm.bfloat16(), x16), norm(x16))  # other dtypes: the module itself
            norm.float()
