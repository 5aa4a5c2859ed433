"""The shipped tokenizers, and what ``Tokenizer.save`` writes, carry a post-processor that puts BOS in front,
so that a Hugging Face tokenizer read from a model folder gives the ids setdlm decodes a string prompt
from (issue #45 point 5; docs/pretrained.md), while ``Tokenizer.encode`` stays exactly as it was."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as Backend

from setdlm.data.prompt import encode_prompt
from setdlm.data.tokenizers import Tokenizer, char_tokenizer, load_tokenizer, train_bpe
from setdlm.formats import pretrained

transformers = pytest.importorskip("transformers")

TEXTS = ["ROMEO: what light", "Tom has 3 apples and buys 4 more. How many?\n", "", "  two  spaces\nand é ü 😀"]


def _without_post_processor(folder) -> Tokenizer:
    """The folder's tokenizer as it was shipped before (no post-processor)."""
    raw = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    assert raw["post_processor"]["type"] == "TemplateProcessing"
    raw["post_processor"] = None
    tok = load_tokenizer(folder)
    return Tokenizer(Backend.from_str(json.dumps(raw)), kind=tok.kind, prompt=tok.prompt, prompt_end=tok.prompt_end,
                     **tok.tokens)


@pytest.mark.parametrize("name", pretrained.available())
def test_shipped_tokenizer_gives_the_string_paths_ids_through_transformers(name):
    folder = pretrained.path(name)
    tok = load_tokenizer(folder)
    old = _without_post_processor(folder)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == old.encode(text)  # the post-processor changes no id setdlm gives
        assert tok.encode_special(text) == old.encode_special(text)
        assert hf(text).input_ids == encode_prompt(tok, text, end=False) == [tok.bos_token_id] + ids
        assert hf(text, add_special_tokens=False).input_ids == ids
    assert hf.bos_token_id == tok.bos_token_id and hf.eos_token_id == tok.eos_token_id


@pytest.mark.parametrize("make", [lambda texts: train_bpe(texts, 300), char_tokenizer])
def test_saved_tokenizer_carries_the_bos_post_processor(tmp_path, make):
    """What ``setdlm train`` writes (``Tokenizer.save``) reads back in transformers with BOS in front."""
    texts = ["hello world", "the quick brown fox", "jumps over the lazy dog"] * 5
    tok = make(texts)
    tok.save(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    back = load_tokenizer(tmp_path)
    for text in ("hello fox", "the dog"):
        assert hf(text).input_ids == [tok.bos_token_id] + tok.encode(text) == encode_prompt(back, text, end=False)
        assert back.encode(text) == tok.encode(text)


def test_a_tokenizer_with_its_own_post_processor_keeps_it():
    """Only a BOS-prompt tokenizer without a post-processor gets one; a Hugging Face one is left alone."""
    tok = train_bpe(["aa bb cc"] * 4, 270)
    backend = Backend.from_str(tok.backend.to_str())
    backend.post_processor = None
    hf_kind = Tokenizer(backend, kind="hf", **tok.tokens)  # prompt "transformers": its ids are transformers'
    assert hf_kind.backend.post_processor is None
