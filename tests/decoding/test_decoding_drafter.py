"""A frozen base with a set drafter (docs/drafter.md): the drafted decode is the base's AR decode, token for token,
in every precision tested, batched as alone; the drafter's context cache follows the base's; the objective trains."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from setdlm import Model
from setdlm.decoding import generate
from setdlm.drafter import DrafterConfig, SetDrafter, window_loss, window_mask
from setdlm.errors import UserError
from setdlm.family import FamilyConfig
from setdlm.formats.drafted import DraftedBackbone, read_drafter, save_drafter
from setdlm.formats.hf import HFBackbone
from setdlm.formats.quantize import quantize

from support import tiny_hf

V, MASK, L = 100, 99, 64
PROMPTS = [[1, 5, 7], [3, 9, 11, 13, 2, 4], [8]]


def _drafter(w: int, seed: int = 0, vocab: int = 60) -> SetDrafter:
    torch.manual_seed(seed)
    c = DrafterConfig(hidden_size=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, intermediate_size=64,
                      feature_layers=(0, 1), window=w, vocab_size=vocab)
    d = SetDrafter(c)
    with torch.no_grad():
        d.mask_embed.normal_()
    d.vocab_map.copy_(torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:vocab].sort().values)
    return d


def _pair(w: int = 4, dtype=torch.float64, seed: int = 0, vocab: int = 60) -> tuple[Model, Model]:
    """(the base as a plain AR model, the base with a random drafter over ``vocab`` draft tokens)."""
    hf = tiny_hf("llama", seed=seed, vocab=V, dtype=dtype)
    fam = FamilyConfig("ar", L, MASK)
    base = HFBackbone(hf)
    drafted = DraftedBackbone(HFBackbone(copy.deepcopy(hf)), _drafter(w, seed, vocab).to(dtype))
    return Model(base, fam), Model(drafted, fam)


class _Oracle(DraftedBackbone):
    """A drafter that always drafts what the base will say (a script of the AR decode, by position)."""

    script: dict[int, int] = {}

    def draft(self, tokens, position_ids, cache):
        real = super().draft(tokens, position_ids, cache)  # run it, so its shapes and cache reads are exercised
        inv = self.drafter.draft_index(V)
        target = torch.tensor([[self.script.get(int(p), 0) for p in row] for row in position_ids[:, 1:]])
        return 50.0 * torch.nn.functional.one_hot(inv[target].clamp(min=0), real.shape[-1]).to(real.dtype)


@pytest.mark.parametrize("w", [2, 4])
def test_greedy_drafted_decode_is_the_base_ar_decode_batched_and_alone(w):
    base, drafted = _pair(w)
    ref = generate(base, PROMPTS, max_new_tokens=20, ignore_eos=True)
    out = generate(drafted, PROMPTS, max_new_tokens=20, ignore_eos=True, speculate="next_token")
    assert out.tokens == ref.tokens
    for i, p in enumerate(PROMPTS):
        alone = generate(drafted, [p], max_new_tokens=20, ignore_eos=True, speculate="next_token")
        assert alone.tokens[0] == ref.tokens[i]
    plain = generate(drafted, PROMPTS, max_new_tokens=20, ignore_eos=True)  # no speculate: the base's own decode
    assert plain.tokens == ref.tokens and plain.nfe == ref.nfe


@pytest.mark.parametrize("knobs", [dict(temperature=0.9), dict(temperature=0.8, top_p=0.9, top_k=20,
                                                                 repetition_penalty=1.3)])
def test_seeded_sampling_is_the_base_ar_decode_of_that_seed(knobs):
    base, drafted = _pair(3, seed=1)
    ref = generate(base, PROMPTS, max_new_tokens=16, ignore_eos=True, seed=5, **knobs)
    out = generate(drafted, PROMPTS, max_new_tokens=16, ignore_eos=True, seed=5, speculate="next_token", **knobs)
    assert out.tokens == ref.tokens


@pytest.mark.parametrize("w", [3, 5])
def test_a_drafter_that_guesses_right_commits_w_tokens_a_forward(w):
    base, drafted = _pair(w, vocab=V)  # every token in the draft vocabulary
    prompt = [1, 5, 7]
    ref = generate(base, [prompt], max_new_tokens=17, ignore_eos=True)
    oracle = _Oracle(drafted.backbone.base, drafted.backbone.drafter)
    oracle.script = dict(enumerate(prompt + ref.tokens[0]))
    out = generate(Model(oracle, base.family), [prompt], max_new_tokens=17, ignore_eos=True,
                   speculate="next_token", trace=True)
    assert out.tokens == ref.tokens
    # the first forward has no draft; then each accepts w − 1 drafts and adds the base's own token
    assert out.nfe == 1 + -(-16 // w)


def test_the_base_logits_are_the_base_and_the_drafter_context_follows_the_cache():
    base, drafted = _pair(4)
    ids = torch.tensor([[1, 5, 7, 9, 2, 4]])
    assert torch.equal(drafted.backbone(ids), base.backbone(ids))  # the forward is the base's, bit for bit
    # a cache filled in pieces, with a crop (a rejected draft), holds the drafter context of a fresh prefill
    db = drafted.backbone
    pos = torch.arange(6)[None]
    causal = torch.ones(6, 6, dtype=torch.bool).tril()[None, None]
    fresh = db.new_cache(1)
    db(ids[:, :4], pos[:, :4], causal[..., :4, :4], fresh)
    pieces = db.new_cache(1)
    db(ids[:, :2], pos[:, :2], causal[..., :2, :2], pieces)
    db(ids[:, 2:6], pos[:, 2:6], causal[..., 2:6, :6], pieces, keep=2)  # 4 fed, 2 kept
    window = torch.tensor([[7, MASK, MASK, MASK]])
    wpos = torch.arange(4, 8)[None]
    assert torch.allclose(db.draft(window, wpos, pieces), db.draft(window, wpos, fresh), atol=1e-10)


def test_int8_drafted_decode_is_the_int8_base_decode():
    base, drafted = _pair(4, dtype=torch.float32, seed=2)
    quantize(base.backbone, "int8")
    quantize(drafted.backbone, "int8")
    ref = generate(base, PROMPTS, max_new_tokens=16, ignore_eos=True)
    out = generate(drafted, PROMPTS, max_new_tokens=16, ignore_eos=True, speculate="next_token")
    assert out.tokens == ref.tokens
    alone = generate(drafted, PROMPTS[1:2], max_new_tokens=16, ignore_eos=True, speculate="next_token")
    assert alone.tokens[0] == ref.tokens[1]


@pytest.mark.parametrize("kw, needle", [
    (dict(speculate=True), "speculate='next_token'"),
    (dict(window=3), "speculate='next_token'"),
    (dict(threshold=0.5), "threshold applies to"),
])
def test_settings_that_do_not_apply_to_a_drafted_model_are_refused(kw, needle):
    _, drafted = _pair(4)
    with pytest.raises(UserError, match=needle):
        generate(drafted, PROMPTS, max_new_tokens=4, **kw)


def test_a_plain_ar_model_refuses_next_token_speculation():
    base, _ = _pair(4)
    with pytest.raises(UserError, match="speculate"):
        generate(base, PROMPTS, max_new_tokens=4, speculate="next_token")


def test_window_mask_sees_the_context_before_its_anchor_and_its_own_window():
    m = window_mask(torch.tensor([[2, 4]]), torch.tensor([[True, False]]), n_ctx=6, w=3)[0, 0]  # (6, 12)
    assert m[:3, :6].tolist() == [[True, True, False, False, False, False]] * 3
    assert not m[3:, :6].any()  # an invalid window sees no context
    assert m[:3, 6:9].all() and not m[:3, 9:].any() and m[3:, 9:].all() and not m[3:, 6:9].any()


def test_the_window_objective_trains_the_drafter_and_never_the_base():
    _, drafted = _pair(3, dtype=torch.float32)
    db = drafted.backbone
    for p in db.base.parameters():
        p.requires_grad_(False)
    db.draft_head.weight.requires_grad_(False)
    db.drafter.vocab_map.copy_(torch.arange(db.drafter.config.vocab_size))
    head = db.base.hf.get_output_embeddings().weight[:db.drafter.config.vocab_size]
    db.draft_head.weight.data.copy_(20 * head / head.norm(dim=-1, keepdim=True))  # a head of a usable scale
    seq = torch.tensor([[(7 * i) % 50 + 1 for i in range(40)]] * 2)  # a sequence the drafter can learn
    with torch.no_grad():
        feats = db.features(seq, torch.ones(40, 40, dtype=torch.bool).tril()[None, None])
    rng = random.Random(0)
    anchors = torch.tensor([rng.sample(range(1, 38), 8) for _ in range(2)])
    valid = torch.ones(2, 8, dtype=torch.bool)
    hf = db.base.hf
    opt = torch.optim.Adam(db.drafter.parameters(), lr=1e-2)
    before = {k: v.clone() for k, v in db.base.state_dict().items()}
    first = None
    for _ in range(80):
        loss, stats = window_loss(db.drafter, feats, seq, anchors, valid, hf.get_input_embeddings(),
                                  hf.model.rotary_emb, db.draft_head.weight)
        first = first if first is not None else (loss.item(), stats["acc@1"])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first[0] and stats["acc@1"] > max(0.5, first[1])
    assert all(torch.equal(v, db.base.state_dict()[k]) for k, v in before.items())


def test_a_drafter_folder_round_trips_and_a_corrupt_one_is_named(tmp_path):
    d = _drafter(4)
    save_drafter(d, "some-base", tmp_path / "dr", dtype=torch.float32)
    name, back, cfg = read_drafter(tmp_path / "dr")
    assert name == "some-base" and back.config == d.config
    assert all(torch.equal(a, b) for a, b in zip(d.state_dict().values(), back.state_dict().values()))
    save_drafter(d, "some-base", tmp_path / "dr", dtype=torch.float32)  # replaces its own folder
    (tmp_path / "dr" / "drafter.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(UserError, match="drafter.safetensors"):
        read_drafter(tmp_path / "dr")


def test_a_sweep_adds_the_drafted_decode_at_the_drafters_window():
    from setdlm.evaluation.sweeps import sweep_settings

    base, drafted = _pair(5)
    assert not any(s.speculate for s in sweep_settings(base, speculate=True))
    spec = [s for s in sweep_settings(drafted, batch_sizes=(1, 4), speculate=True) if s.speculate == "next_token"]
    assert [(s.window, s.batch_size) for s in spec] == [(5, 1), (5, 4)]
