"""The keywords of the schemas people write (SchemaStore's catalog; issue #48): type lists with keywords beside
them, patternProperties, propertyNames, every format JSON Schema names, allOf with $ref, if/then/else,
dependencies, additionalItems / prefixItems, uniqueItems over a finite set, oneOf made disjoint, draft-4
spellings, decimal multipleOf, min/maxProperties, contains and not. Each schema is decoded by random tiny
models (garbage without the constraint) greedily and sampled, by SetDLM, AR and the next-token verifier, and
every output validates with jsonschema (formats checked, under the schema's own draft); the regexes written
for them are checked against documents on both sides of each keyword."""

import json
import re
import string

import pytest

pytest.importorskip("outlines_core")
jsonschema = pytest.importorskip("jsonschema")

from setdlm import FamilyConfig, Model  # noqa: E402
from setdlm.data.tokenizers import char_tokenizer  # noqa: E402
from setdlm.decoding import generate  # noqa: E402
from setdlm.decoding.structured.constraint import json_schema  # noqa: E402
from setdlm.errors import UserError  # noqa: E402

from support import tiny  # noqa: E402
from support.models import make_model  # noqa: E402

PRINTABLE = char_tokenizer(["".join(c for c in string.printable if c not in "\t\n\r\x0b\x0c")])
D4, D7 = "http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-07/schema#"
FORMATS = ("uri", "uri-reference", "iri", "iri-reference", "uri-template", "hostname", "idn-hostname", "ipv6",
           "duration", "json-pointer", "relative-json-pointer", "regex", "idn-email")
SCHEMAS = {
    "type list, keywords beside": {"type": ["string", "integer", "null"], "maxLength": 3, "minimum": 5, "maximum": 7},
    "patternProperties": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 4}},
                          "patternProperties": {"^x-[a-z]+$": {"type": "integer", "minimum": 0, "maximum": 9}},
                          "additionalProperties": False, "required": ["name"]},
    "propertyNames": {"type": "object", "propertyNames": {"pattern": "^[a-z]{1,3}$"},
                      "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}, "maxProperties": 2},
    "formats": {"type": "object", "properties": {f: {"type": "string", "format": f} for f in FORMATS},
                "required": list(FORMATS[:7]), "additionalProperties": False},
    "formats 2": {"type": "array", "prefixItems": [{"type": "string", "format": f} for f in FORMATS[7:]],
                  "items": False, "minItems": 6},
    "allOf with $ref": {"$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1,
                                                                                 "maximum": 5}}, "required": ["id"]}},
                        "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"tag": {"enum": ["a", "b", 3]},
                                                                            "id": {"multipleOf": 2}},
                                                             "required": ["tag"]}, {"properties": {"tag": {"type": "string"}}}]},
    "if/then/else": {"type": "object", "properties": {"kind": {"enum": ["num", "str"]}, "v": {}},
                     "required": ["kind", "v"], "additionalProperties": False,
                     "if": {"properties": {"kind": {"const": "num"}}},
                     "then": {"properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9}}},
                     "else": {"properties": {"v": {"type": "string", "maxLength": 2}}}},
    "dependencies (draft 7)": {"$schema": D7, "type": "object", "additionalProperties": False,
                               "properties": {"card": {"type": "integer", "minimum": 0, "maximum": 9},
                                              "addr": {"type": "string", "maxLength": 3},
                                              "zip": {"type": "boolean"}},
                               "dependencies": {"card": ["addr"], "zip": {"required": ["card"]}}},
    "dependentRequired": {"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "boolean"}},
                          "dependentRequired": {"a": ["b"]}, "minProperties": 1, "additionalProperties": False},
    "additionalItems (draft 4)": {"$schema": D4, "type": "array", "items": [{"type": "integer", "maximum": 5},
                                                                            {"type": "boolean"}],
                                  "additionalItems": {"type": "null"}, "maxItems": 3},
    "uniqueItems over an enum": {"type": "array", "items": {"enum": ["a", "b", "c", 1]}, "uniqueItems": True,
                                 "minItems": 1},
    "oneOf made disjoint": {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                      {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]},
                                      {"enum": ["auto", "automatic"]}, {"type": "string", "maxLength": 4}]},
    "oneOf of closed objects": {"oneOf": [{"type": "object", "additionalProperties": False,
                                           "properties": {"ps": {"type": "string", "maxLength": 3}}},
                                          {"type": "object", "additionalProperties": False,
                                           "properties": {"sh": {"type": "string", "maxLength": 3}}}]},
    "draft 4 spellings": {"$schema": D4, "id": "http://example.com/s.json",
                          "definitions": {"n": {"type": "number", "minimum": 0, "maximum": 3, "exclusiveMaximum": True,
                                                "exclusiveMinimum": True}},
                          "type": "object", "properties": {"n": {"$ref": "http://example.com/s.json#/definitions/n"}},
                          "required": ["n"]},
    "decimal multipleOf": {"type": "array", "items": {"type": "number", "multipleOf": 0.1, "minimum": -1,
                                                      "maximum": 1}, "minItems": 2, "maxItems": 3},
    "min/maxProperties": {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"},
                                                           "c": {"type": "integer"}}, "minProperties": 2,
                          "maxProperties": 2},
    "contains, not, multipleOf unbounded": {"type": "array", "items": {"type": "integer", "minimum": -20,
                                                                       "not": {"minimum": 50}, "multipleOf": 5},
                                            "contains": {"const": 15}, "maxItems": 3},
}


def _model(mode: str):
    if mode == "next_token":
        backbone = make_model(vocab=PRINTABLE.vocab_size, seed=2)
        cfg = FamilyConfig("setdlm", length=200, mask_token_id=PRINTABLE.mask_token_id, D=2, ar_weight=1.0)
        return Model(backbone, cfg, PRINTABLE), {"speculate": "next_token"}
    family = "ar" if mode == "ar" else "setdlm"
    return tiny(family, PRINTABLE, L=200, seed=5), ({} if family == "ar" else {"threshold": 0.3})


def check(schema: dict, text: str) -> None:
    cls = jsonschema.validators.validator_for(schema)
    cls(schema, format_checker=cls.FORMAT_CHECKER).validate(json.loads(text))


@pytest.mark.parametrize("mode", ["setdlm", "ar", "next_token"])
def test_every_output_of_the_new_keywords_validates_greedy_and_sampled(mode):
    model, knobs = _model(mode)
    for k, (name, schema) in enumerate(SCHEMAS.items()):
        c = json_schema(schema)
        for sampled in (False, True):
            out = generate(model, ["x", "{"], max_new_tokens=150, constraint=c, seed=k,
                           **({"temperature": 1.0} if sampled else {}), **knobs)
            for text in out.texts:
                try:
                    check(schema, text)
                except (ValueError, jsonschema.ValidationError) as e:
                    raise AssertionError(f"{name} ({mode}, sampled={sampled}): {text!r}: {e}") from None


ENFORCED = [  # (schema, documents its regex must match, documents it must not): each keyword bites
    (SCHEMAS["patternProperties"], ['{"name":"ab","x-q":3}', '{"name":"","x-ab":1,"x-c":0}', '{"name":"a"}'],
     ['{"name":"ab","y":3}', '{"name":"ab","x-q":10}', '{"x-q":3}', '{"name":"abcde"}']),
    (SCHEMAS["propertyNames"], ['{}', '{"ab":1}', '{"a":1,"b":2}'], ['{"abcd":1}', '{"A":1}', '{"a":1,"b":2,"c":3}']),
    (SCHEMAS["type list, keywords beside"], ['"abc"', "5", "7", "null"], ['"abcd"', "4", "8", "true"]),
    (SCHEMAS["min/maxProperties"], ['{"a":true,"b":null}'], ['{"a":true}', '{"a":true,"b":null,"c":1}', "{}"]),
    (SCHEMAS["dependentRequired"], ['{"a":null,"b":true}', '{"b":false}'], ['{"a":null}', "{}"]),
    (SCHEMAS["uniqueItems over an enum"], ['["a"]', '["a","c",1]'], ['["a","a"]', "[]", '["d"]']),
    (SCHEMAS["oneOf made disjoint"], ['{"a":1}', '{"b":2}', '"automatic"', '"ok"'], ['{"a":1,"b":2}', '"hello"', '"auto"']),
    (SCHEMAS["oneOf of closed objects"], ['{"ps":"a"}', '{"sh":""}'], ["{}", '{"ps":"a","sh":"b"}']),
    ({"type": "integer", "multipleOf": 5}, ["0", "15", "-20", "1005"], ["3", "-7", "12"]),
    ({"type": "number", "multipleOf": 0.5, "minimum": -1, "maximum": 1}, ["0.5", "-1", "0", "-0.5"],
     ["0a5", "0.25", "1.5", "0.3"]),
    ({"type": "string", "not": {"enum": ["no", "nope"]}}, ['"n"', '"noo"', '""'], ['"no"', '"nope"']),
    ({"type": "string", "pattern": "^ab$|^c+$"}, ['"ab"', '"ccc"'], ['"abc"', '""', '"ca"']),
    ({"type": "object", "properties": {"foo": {"not": {}}, "bar": {"type": "null"}}}, ["{}", '{"bar":null}'],
     ['{"foo":1}', '{"foo":null}']),
    ({"type": "integer", "not": {"minimum": 3}, "minimum": -2}, ["-2", "0", "2"], ["3", "-3", "10"]),
]


def test_the_written_regexes_enforce_each_keyword():
    for schema, good, bad in ENFORCED:
        pattern = json_schema(schema).pattern
        for doc in good:
            assert re.fullmatch(pattern, doc), (schema, doc)
            check(schema, doc)
        for doc in bad:
            assert not re.fullmatch(pattern, doc), (schema, doc)


def test_what_stays_refused_names_keyword_and_path():
    cases = [({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "'uniqueItems' at (root)"),
             ({"properties": {"a": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}},
              "'oneOf' at (root)/properties/a cannot"),
             ({"properties": {"a": {"$ref": "other.json#/x"}}}, "'$ref' at (root)/properties/a"),
             ({"type": "object", "unevaluatedProperties": False}, "'unevaluatedProperties' at (root)"),
             ({"type": "integer", "multipleOf": 7}, "'multipleOf' at (root)"),
             ({"allOf": [{"type": "string", "pattern": "a+"}, {"pattern": "b+"}]}, "'pattern' at (root)"),
             ({"type": "string", "not": {"pattern": "a"}}, "'not' at (root)"),
             ({"type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 2},
              "'minProperties' at (root)")]
    for schema, where in cases:
        with pytest.raises(UserError, match=re.escape(where)) as e:
            json_schema(schema, cfg=False)  # setdlm's own automaton
        assert "\n" not in str(e.value) and e.value.fields == ("json_schema",)


def test_a_chain_of_ifs_on_one_property_stays_linear_and_exact():
    """SchemaStore's if-chains (an allOf of many if/then on one discriminating property): the options whose
    discriminator no value satisfies are dropped as they arise, so 60 ifs write 3 options, not 2^60."""
    pairs = [("a", "x"), ("b", "y"), ("c", "x")] * 20
    schema = {"type": "object", "properties": {"kind": {"enum": ["a", "b", "c"]}, "x": {"type": "integer"},
                                               "y": {"type": "string"}}, "required": ["kind"],
              "allOf": [{"if": {"properties": {"kind": {"const": k}}, "required": ["kind"]},
                         "then": {"required": [f]}} for k, f in pairs]}
    pattern = json_schema(schema).pattern
    assert len(pattern) < 2000
    for doc in ['{"kind":"a","x":1}', '{"kind":"b","y":"q"}', '{"kind":"c","x":2,"y":""}']:
        assert re.fullmatch(pattern, doc), doc
        check(schema, doc)
    for doc in ['{"kind":"a"}', '{"kind":"b","x":1}', '{"kind":"d","x":1}', '{"x":1}']:
        assert not re.fullmatch(pattern, doc), doc
