"""Every accepted request of the CFG engine ends on a valid document (docs/decoding.md "Two engines"): each committed
prefix keeps a closing that fits in the positions left, and a token after which none fits gives way to the
closing's next token, in the AR, ``window=1``, ``speculate=True`` and ``speculate="next_token"`` decodes alike
(greedy and sampled; batched rows and session rows as alone; the speculative decodes still the left-to-right ones).
Before, one token that opened a long value outside the reserve cut the row ("unfinished")."""

import dataclasses

import pytest
import torch
from torch import nn

pytest.importorskip("outlines_core")
pytest.importorskip("llguidance")
pytest.importorskip("jsonschema")

from setdlm import Model  # noqa: E402
from setdlm.decoding import generate  # noqa: E402
from setdlm.decoding.session import Session  # noqa: E402
from setdlm.family import FamilyConfig  # noqa: E402

from support import Scripted, session_results, tiny  # noqa: E402
from test_constraint_cfg import CHAR, valid  # noqa: E402
from test_constraint_cfg_length import GROWS, PROMPTS  # noqa: E402

# GROWS with "a" for "y" (so that the greedy closing after '{"' is the short one, through "a")
LONG = {"type": "object", "properties": {"a": {"type": "integer"}, "x": GROWS["properties"]["x"]},
        "additionalProperties": False}
# what the scripted model writes: its ',' (7th token) opens the key "x", whose value needs 38 more tokens at least
TEXT = '{"a":12,"x":{"aaaa":"abc","bbbb":"abc","cccc":"abc"}}'
DECODES = {"ar": ("ar", {}), "window=1": ("setdlm", dict(window=1)),
           "speculate": ("setdlm", dict(window=4, speculate=True)),
           "next_token": ("setdlm", dict(window=4, speculate="next_token"))}


class Prefers(Scripted):
    """The real backbone whose logits prefer, at ``scale``, the script's token at each position: a clean slot
    predicts the position after it (AR, the next-token head), a MASK slot its own (SetDLM's window and verifiers).
    The script is ``TEXT`` after a one-token prompt."""

    def __init__(self, inner: nn.Module, scale: float):
        super().__init__(inner, [0] + CHAR.encode(TEXT), CHAR.eos_token_id, ar=False)
        self.scale = scale

    def forward(self, ids, pos, mask, cache=None, *, keep=None, logits_start=0):
        logits = self.inner(ids, pos, mask, cache, keep=keep, logits_start=logits_start)  # (B, T', V)
        table = torch.tensor(self.script + [self.filler], device=logits.device)
        shift = (ids[:, logits_start:] != CHAR.mask_token_id).long()
        target = table[(pos[:, logits_start:] + shift).clamp(max=len(self.script))]
        return self.scale * nn.functional.one_hot(target, logits.shape[-1]).to(logits.dtype)


def model_for(decode: str, scale: float = 30.0) -> tuple[Model, dict]:
    family, knobs = DECODES[decode]
    m = tiny(family, CHAR, L=64, seed=3)
    fam = dataclasses.replace(m.family, ar_weight=1.0) if family == "setdlm" else m.family
    return Model(Prefers(m.backbone, scale), fam, CHAR), knobs


@pytest.mark.parametrize("decode", list(DECODES))
@pytest.mark.parametrize("sampled", [False, True])
def test_a_token_no_closing_follows_within_the_budget_gives_way_to_the_closing(decode, sampled):
    """Before: '{"a":12,"x":{"aaaa":"abc","bbbb":' cut at 24 tokens, "unfinished". The ',' came 17 positions before
    the end with a closing of one token ('}'), outside the reserve, and grew it to 39."""
    model, knobs = model_for(decode)
    sampling = dict(temperature=1.0, seed=[5]) if sampled else {}
    out = generate(model, [[22]], max_new_tokens=24, constraint=LONG, **knobs, **sampling)
    assert out.texts == ['{"a":12}'] and out.finish_reason == ["eos"], (out.texts, out.finish_reason)
    roomy = generate(model, [[22]], max_new_tokens=63, constraint=LONG, **knobs, **sampling)
    assert roomy.texts == [TEXT] and valid(TEXT, LONG)  # with the room for it, the model's own document


@pytest.mark.parametrize("budget", [14, 24, 40])
def test_sampled_rows_close_batched_as_alone_and_speculative_as_left_to_right(budget):
    """A weak preference (sampling leaves the script often): every row valid, none cut; each row of a batch as
    alone; ``speculate=True`` the ``window=1`` tokens and ``"next_token"`` the AR ones."""
    kw = dict(max_new_tokens=budget, constraint=GROWS, temperature=1.0, seed=[1, 2, 3, 4])
    prompts = [[22]] * 4
    outs = {}
    for decode in DECODES:
        model, knobs = model_for(decode, scale=2.0)
        outs[decode] = out = generate(model, prompts, **knobs, **kw)
        assert all(valid(t, GROWS) for t in out.texts) and set(out.finish_reason) <= {"eos", "length"}, out.texts
    assert outs["speculate"].tokens == outs["window=1"].tokens and outs["next_token"].tokens == outs["ar"].tokens
    model, knobs = model_for("ar", scale=2.0)
    for i in (0, 3):
        alone = generate(model, [[22]], max_new_tokens=budget, constraint=GROWS, temperature=1.0, seed=i + 1)
        assert alone.tokens[0] == outs["ar"].tokens[i]


def test_session_rows_keep_their_own_closing():
    """A row joining a session between steps is copied with its closings: the tokens it gets alone."""
    model, _ = model_for("ar", scale=2.0)
    s = Session(model, width=64)
    first = s.add([22], max_new_tokens=24, constraint=GROWS, temperature=1.0, seed=7)
    s.step()
    s.step()
    second = s.add([22], max_new_tokens=24, constraint=GROWS, temperature=1.0, seed=8)
    done = session_results(s)
    for row, seed in ((first, 7), (second, 8)):
        alone = generate(model, [[22]], max_new_tokens=24, constraint=GROWS, temperature=1.0, seed=seed)
        assert done[row].tokens == alone.tokens[0] and valid(alone.texts[0], GROWS)


@pytest.mark.parametrize("budget", [12, 20, 40])
def test_an_accepted_request_never_ends_cut(budget):
    """The random model that, before, opened "x" where it could not fit (finish_reason "unfinished")."""
    m = tiny("setdlm", CHAR, L=64, seed=3)
    setdlm_model = Model(m.backbone, dataclasses.replace(m.family, ar_weight=1.0), CHAR)
    ar = tiny("ar", CHAR, L=64, seed=3)
    kw = dict(max_new_tokens=budget, constraint=GROWS, temperature=1.0, seed=list(range(6)))
    for model, knobs in ((ar, {}), (setdlm_model, dict(window=1)), (setdlm_model, dict(window=4, speculate=True))):
        out = generate(model, PROMPTS, **knobs, **kw)
        assert all(valid(t, GROWS) for t in out.texts), (knobs, out.texts)
        assert set(out.finish_reason) <= {"eos", "length"}, out.finish_reason


def test_the_drafter_decode_is_the_base_ar_decode_and_closes():
    """``speculate="next_token"`` on a base with a set drafter (docs/drafter.md) vets the verified run as the base's
    AR decode commits it."""
    import copy

    from setdlm.drafter import DrafterConfig, SetDrafter
    from setdlm.formats.drafted import DraftedBackbone
    from setdlm.formats.hf import HFBackbone
    from support import tiny_hf

    hf = tiny_hf("llama", seed=2, vocab=CHAR.vocab_size)
    torch.manual_seed(0)
    drafter = SetDrafter(DrafterConfig(hidden_size=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8,
                                       intermediate_size=64, feature_layers=(0, 1), window=4,
                                       vocab_size=CHAR.vocab_size)).double()
    drafter.vocab_map.copy_(torch.arange(CHAR.vocab_size))
    fam = FamilyConfig("ar", 64, CHAR.mask_token_id)
    base = Model(HFBackbone(hf), fam, CHAR)
    drafted = Model(DraftedBackbone(HFBackbone(copy.deepcopy(hf)), drafter), fam, CHAR)
    for budget in (12, 20):
        kw = dict(max_new_tokens=budget, constraint=GROWS, temperature=1.0, seed=list(range(6)))
        ref = generate(base, PROMPTS, **kw)
        assert all(valid(t, GROWS) for t in ref.texts) and set(ref.finish_reason) <= {"eos", "length"}, ref.texts
        assert generate(drafted, PROMPTS, speculate="next_token", **kw).tokens == ref.tokens


def test_a_free_string_closes_its_quote():
    """The greedy closing prefers '}' first, which a free string takes as text, so its search wrote '}' until the
    limit: every schema with a required free string was refused ("no match of at most 30 tokens"). Its second try
    puts '"' first."""
    schema = {"type": "object", "properties": {"z": {"type": "string"}, "x": GROWS["properties"]["x"]["properties"]
              ["aaaa"]}, "required": ["z", "x"], "additionalProperties": False}
    out = generate(tiny("ar", CHAR, L=64, seed=3), ["a", "b"], max_new_tokens=30, constraint=schema, temperature=1.0,
                   seed=[1, 2])
    assert all(valid(t, schema) for t in out.texts) and out.finish_reason == ["eos", "eos"], out.texts
