"""Stopping and I/O (docs/method.md §4.4): EOS, stop strings and max_new_tokens as documented, strings in and out
through a tokenizer, and clear errors for bad arguments."""

import pytest

from setdlm import Model
from setdlm.decoding import applicable, generate

from support import BOS, EOS, MASK, PROMPTS, CharTokenizer, tiny_model

FAMILIES = ["ar", "mdlm", "bd3lm", "setdlm"]


def _with_tokenizer(family, **kw) -> Model:
    m = tiny_model(family, **kw)
    return Model(m.backbone, m.family, CharTokenizer())


@pytest.mark.parametrize("family", FAMILIES)
def test_max_new_tokens_and_texts(family):
    model = _with_tokenizer(family)
    out = generate(model, ["hello", "a cat", ""], max_new_tokens=7, ignore_eos=True)
    assert [len(t) for t in out.tokens] == [7, 7, 7] and out.finish_reason == ["length"] * 3
    assert out.texts == [model.tokenizer.decode(t) for t in out.tokens]
    assert out.sequences[2][0] == BOS  # an empty prompt starts from BOS
    assert out.seconds > 0 and out.tokens_per_second > 0 and out.num_tokens == 21


@pytest.mark.parametrize("family", FAMILIES)
def test_eos_ends_a_row_once_everything_before_it_is_decoded(family):
    model = tiny_model(family, seed=2)
    tau = applicable(family, threshold=0.3)
    free = generate(model, PROMPTS, max_new_tokens=10, ignore_eos=True, **tau)
    eos = free.tokens[1][4]  # a token the model generates
    out = generate(model, PROMPTS, max_new_tokens=10, eos_token_id=eos, **tau)
    for r in range(3):
        toks = out.tokens[r]
        if eos in free.tokens[r]:
            assert out.finish_reason[r] == "eos" and toks[-1] == eos and eos not in toks[:-1]
            assert toks == free.tokens[r][: free.tokens[r].index(eos) + 1]  # same decode, cut at the EOS
        else:
            assert out.finish_reason[r] == "length" and toks == free.tokens[r]
        assert MASK not in out.sequences[r]
    assert "eos" in out.finish_reason


@pytest.mark.parametrize("family", ["ar", "setdlm"])
def test_stop_strings_cut_the_text_before_them(family):
    model = _with_tokenizer(family, seed=2)
    free = generate(model, ["the cat", "dogs"], max_new_tokens=12, ignore_eos=True)
    stop = free.texts[0][4:6]
    out = generate(model, ["the cat", "dogs"], max_new_tokens=12, ignore_eos=True, stop=[stop, "never seen"])
    tok = model.tokenizer
    text0 = free.texts[0]
    assert out.finish_reason[0] == "stop" and out.texts[0] == text0[: text0.index(stop)]
    assert stop in tok.decode(out.tokens[0]) and stop not in tok.decode(out.tokens[0][:-1])  # shortest prefix
    if stop in free.texts[1]:
        assert out.texts[1] == free.texts[1][: free.texts[1].index(stop)]
    else:
        assert out.finish_reason[1] == "length" and out.texts[1] == free.texts[1]


def test_bad_arguments_raise_clear_errors():
    model = tiny_model("setdlm")
    cases = [
        (dict(window=0), "window must be a positive integer"),
        (dict(threshold=0.0), r"threshold must lie in \(0, 1\]"),
        (dict(threshold=1.5), r"threshold must lie in \(0, 1\]"),
        (dict(max_new_tokens=0), "max_new_tokens must be a positive integer"),
        (dict(temperature=-1.0), "temperature must be"),
        (dict(top_p=0.0), r"top_p must lie in \(0, 1\]"),
        (dict(top_k=-2), "top_k must be"),
        (dict(repetition_penalty=0.0), "repetition_penalty must be > 0"),
        (dict(length_penalty=(5, 0.5), eos_token_id=EOS), "length_penalty must be"),
        (dict(length_penalty=(5, 1.1)), "no eos_token_id is known"),
        (dict(stop=["x"]), "stop strings need a tokenizer"),
        (dict(temperature=1.0, seed=[1, 2]), r"one int per row \(3\)"),
        (dict(cache_order="random"), "cache_order must be"),
        (dict(batch_size=0), "batch_size must be a positive integer"),
    ]
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            generate(model, PROMPTS, **kw)
    with pytest.raises(ValueError, match="empty batch"):
        generate(model, [])
    with pytest.raises(ValueError, match="prompt 0 is 49 tokens long, which leaves no room for a new token in the context length L=48"):
        generate(model, [[1] * 49])
    with pytest.raises(ValueError, match="is a string but the model has no tokenizer"):
        generate(model, ["hello"])
    with pytest.raises(ValueError, match="contains the MASK id"):
        generate(model, [[1, MASK, 3]])
    with pytest.raises(ValueError, match="is empty and no BOS token"):
        generate(model, [[]])
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        generate(tiny_model("bd3lm"), PROMPTS, block_size=0)


def test_decodes_in_eval_mode_and_restores_the_training_mode():
    from setdlm import FamilyConfig
    from setdlm.model import TransformerConfig, Transformer

    bb = Transformer(TransformerConfig(vocab_size=48, hidden_size=32, n_heads=2, n_layers=2, dropout=0.5))
    bb.init_weights(zero_head=False).train()
    model = Model(bb, FamilyConfig("setdlm", 48, MASK, D=2))
    a = generate(model, PROMPTS, max_new_tokens=8, ignore_eos=True).tokens
    assert bb.training  # restored
    assert generate(model, PROMPTS, max_new_tokens=8, ignore_eos=True).tokens == a  # no dropout while decoding


@pytest.mark.parametrize("family", ["ar", "setdlm"])
def test_string_prompts_start_with_bos(family):
    """Training rows start with BOS, so a text prompt is encoded as [BOS] + text; token ids are as given."""
    base = tiny_model(family)
    model = Model(base.backbone, base.family, CharTokenizer())
    tok = model.tokenizer
    a = generate(model, ["the cat"], max_new_tokens=5)
    b = generate(model, [[tok.bos_token_id] + tok.encode("the cat")], max_new_tokens=5)
    c = generate(model, [tok.encode("the cat")], max_new_tokens=5)
    assert a.sequences[0][0] == tok.bos_token_id and a.sequences[0][:1 + 7] == b.sequences[0][:1 + 7]
    assert a.tokens == b.tokens
    assert c.sequences[0][0] != tok.bos_token_id
