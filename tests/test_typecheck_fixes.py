"""Bugs the type checker found (issue #47 item 2), each pinned: a character tokenizer whose folder names no UNK
token encodes an unseen character as the backend does (not as None); a JSON Schema ``type`` naming no JSON type
is a UserError naming the keyword (not ``raise None``'s TypeError); a static-cache forward without a mask is a
UserError saying so (it was an AttributeError)."""

import json

import pytest
import torch

from setdlm.data.tokenizers import char_tokenizer, load_tokenizer
from setdlm.decoding.cuda_graph import GraphedBackbone
from setdlm.decoding.structured.schema.regex import schema_regex
from setdlm.errors import UserError

from support import tiny_model


def test_a_char_tokenizer_without_unk_encodes_unseen_characters_as_its_backend(tmp_path):
    char_tokenizer(["ab"]).save(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del cfg["unk_token"]  # a folder naming no UNK: the backend's model still has its own
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = load_tokenizer(tmp_path)
    assert tok.kind == "char" and tok.tokens["unk"] is None
    backend = tok.backend.encode("abc", add_special_tokens=False).ids
    assert None not in backend
    assert tok.encode("abc") == backend
    assert tok.encode_batch(["abc", "ba"]) == [backend, tok.backend.encode("ba", add_special_tokens=False).ids]


@pytest.mark.parametrize("schema", [{"type": "foo"}, {"properties": {"a": {"type": ["foo"]}}, "required": ["a"]}])
def test_a_type_naming_no_json_type_is_refused_by_keyword(schema):
    with pytest.raises(UserError, match="'type' at .*no JSON type"):
        schema_regex(schema, max_depth=2, whitespace=None)


def test_a_branch_naming_no_json_type_is_dropped():
    assert schema_regex({"anyOf": [{"type": "foo"}, {"type": "null"}]}, max_depth=2, whitespace=None) == "null"


def test_a_static_cache_forward_needs_the_mask():
    model = tiny_model("ar")
    graphed = GraphedBackbone(model.backbone, capture=False)
    cache = graphed.new_cache(1, 8)
    with pytest.raises(UserError, match="static cache needs the decoder's attention mask"):
        graphed(torch.tensor([[5, 6]]), None, None, cache)
