"""One prompt-length rule (setdlm.data.prompt.check_prompt_fits): a prompt of L - 1 tokens is decoded, one of L
tokens is refused with the same message from Python, a decoding session, the CLI, the server and the trainer's
prompt/completion rows (docs/decoding.md, "Prompt length")."""

from __future__ import annotations

import json

import pytest

import setdlm
from setdlm.data.dataset import pad_pairs
from setdlm.data.prompt import check_prompt_fits, max_prompt_tokens
from setdlm.decoding import generate
from setdlm.decoding.session import prepare

from support import FAMILY_KW, assert_one_line_error, run, save_tiny, tiny_model

L = 16  # save_tiny's context; its character tokenizer puts BOS first, so a text of k characters is k + 1 tokens


def message(n: int, what: str) -> str:
    with pytest.raises(ValueError) as e:
        check_prompt_fits(n, L, what)
    return str(e.value)


def test_the_rule_is_n_at_most_L_minus_1():
    assert max_prompt_tokens(L) == L - 1
    check_prompt_fits(L - 1, L)
    assert message(L, "prompt 0") == ("prompt 0 is 16 tokens long, which leaves no room for a new token in the "
                                      "context length L=16 (at most 15 fit)")
    with pytest.raises(ValueError, match="prompt is 17 tokens long"):
        check_prompt_fits(L + 1, L)


@pytest.mark.parametrize("family", ["ar", "mdlm", "bd3lm", "setdlm"])
def test_generate_takes_L_minus_1_and_refuses_L(family):
    """Every family decodes a prompt of L - 1 tokens; L tokens are refused before any forward."""
    model = tiny_model(family, L=L, **({"block_size": 4} if family == "mdlm" else FAMILY_KW[family]))
    out = generate(model, [[1] + [5] * (L - 2)], max_new_tokens=1, ignore_eos=True)
    assert len(out.tokens[0]) == 1
    with pytest.raises(ValueError) as e:
        generate(model, [[1] + [5] * (L - 2), [1] + [5] * (L - 1)], max_new_tokens=1)
    assert str(e.value) == message(L, "prompt 1")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("ck") / "setdlm")


def test_python_session_cli_and_server_word_it_alike(checkpoint, capsys):
    from setdlm.serve.schemas import APIError, parse_request

    model = setdlm.load(checkpoint)
    fits, too_long = "a" * (L - 2), "a" * (L - 1)  # L - 1 and L tokens with BOS
    assert generate(model, fits, max_new_tokens=1).tokens[0]
    with pytest.raises(ValueError) as py:
        generate(model, too_long, max_new_tokens=1)
    assert str(py.value) == message(L, "prompt 0")

    prepare(model, fits, max_new_tokens=1)
    with pytest.raises(ValueError) as session:
        prepare(model, too_long, max_new_tokens=1)
    assert str(session.value) == message(L, "prompt")

    code, _, err = run(["generate", checkpoint, "--prompt", fits, "--max-new-tokens", "1"], capsys)
    assert code == 0, err
    code, _, err = run(["generate", checkpoint, "--prompt", too_long, "--max-new-tokens", "1"], capsys)
    assert_one_line_error(code, err, message(L, "prompt 0"))

    def request(prompt, **extra):
        return parse_request(json.dumps({"prompt": prompt, **extra}).encode(), chat=False, model=model,
                             model_name="m", width=L)

    assert request(fits).settings.max_new_tokens == 1  # the default budget: what the prompt leaves
    with pytest.raises(APIError) as server:
        request(too_long)
    assert (server.value.status, server.value.param, str(server.value)) == (400, "prompt", message(L, "prompt"))
    with pytest.raises(APIError) as server:
        request("a" * (L - 3), suffix="bc")  # L - 2 + 2 tokens
    assert str(server.value) == message(L, "prompt + suffix")


def test_training_rows_follow_the_same_rule():
    """``pad_pairs`` (prompt/completion training rows): BOS + prompt must leave room for the completion."""
    rows = pad_pairs([([5] * (L - 2), [6, 7])], L, bos_id=1, eos_id=2, pad_id=0)
    assert rows.input_ids.shape == (1, L)
    with pytest.raises(ValueError) as e:
        pad_pairs([([5] * (L - 1), [6])], L, bos_id=1, eos_id=2, pad_id=0)
    assert str(e.value) == message(L, "example 0: prompt")
