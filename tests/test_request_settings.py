"""The request-to-settings mapping (setdlm.decoding.request, docs/architecture.md): the fields of DecodeSettings
whose metadata marks them request-settable are read by one function, and the server (a request body) and the
lm-eval adapter (its model_args) both take exactly those, under the fields' own names."""

import dataclasses
import json

import pytest

from setdlm.decoding.request import REQUEST_FIELDS, request_settings
from setdlm.decoding.settings import SETTING_FAMILIES, DecodeSettings, RequestField
from setdlm.errors import UserError
from setdlm.serve import schemas
from setdlm.serve.schemas import APIError, parse_request

from support import CharTokenizer, save_tiny, tiny_model

# the fields a request sets today; a field marked in DecodeSettings' metadata joins them by itself
MARKED = {"window", "threshold", "block_size", "cache_order", "speculate", "verify_layout", "temperature", "top_p",
          "top_k", "repetition_penalty", "ignore_eos", "stop"}
COMPANION = {"verify_layout": {"speculate": True}}  # a layout applies to speculate=True only (the server refuses it alone)


def sample(name: str, spec: RequestField):
    """A value of the field that a request may send and that differs from its default."""
    meta = next(f.metadata for f in dataclasses.fields(DecodeSettings) if f.name == name)
    return {"number": 0.5, "integer": 2, "switch": True, "choice": (meta.get("choices") or ("",))[-1],
            "strings": "x"}[spec.kind]


def test_the_mapping_is_the_metadata():
    marked = {f.name for f in dataclasses.fields(DecodeSettings) if "request" in f.metadata}
    assert set(REQUEST_FIELDS) == marked == MARKED
    assert list(REQUEST_FIELDS) == [f.name for f in dataclasses.fields(DecodeSettings) if f.name in marked]
    assert all(isinstance(spec, RequestField) for spec in REQUEST_FIELDS.values())


def test_values_are_read_as_decode_settings_takes_them():
    got = request_settings({"temperature": 1, "top_p": 0.5, "stop": "x", "speculate": False, "ignore_eos": True,
                            "window": None, "block_size": 48, "cache_order": "reveal", "prompt": "not a setting"},
                           width=48)
    assert got == {"temperature": 1.0, "top_p": 0.5, "stop": ["x"], "ignore_eos": True, "block_size": 48,
                   "cache_order": "reveal"}
    assert type(got["temperature"]) is float
    assert request_settings({"speculate": "next_token", "stop": ["a", "b"]}, width=8) == {
        "speculate": "next_token", "stop": ["a", "b"]}


@pytest.mark.parametrize("values, message", [
    ({"temperature": -1}, "temperature must be a number in [0, 2], got -1"),
    ({"temperature": float("inf")}, "temperature must be a number in [0, 2], got inf"),
    ({"top_p": 0}, "top_p must be a number in (0, 1], got 0"),
    ({"threshold": "high"}, "threshold must be a number in (0, 1], got 'high'"),
    ({"repetition_penalty": True}, "repetition_penalty must be a number > 0, got True"),
    ({"window": 0}, "window must be an integer in [1, 48], got 0"),
    ({"block_size": 49}, "block_size must be an integer in [1, 48], got 49"),
    ({"window": 2.0}, "window must be an integer in [1, 48], got 2.0"),
    ({"top_k": -1}, "top_k must be an integer in [0, 9223372036854775807], got -1"),
    ({"ignore_eos": 1}, "ignore_eos must be a bool, got 1"),
    ({"speculate": "yes"}, "speculate must be true, false or \"next_token\", got 'yes'"),
    ({"stop": [""]}, "stop must be a non-empty string or a list of 1 to 16 of them, got ['']"),
    ({"stop": ""}, "stop must be a non-empty string or a list of 1 to 16 of them, got ''"),
    ({"stop": ["a"] * 17}, "stop must be a non-empty string or a list of 1 to 16 of them, got ['a', 'a', 'a', "),
    ({"stop": 5}, "stop must be a non-empty string or a list of 1 to 16 of them, got 5"),
])
def test_a_bad_value_is_a_user_error_naming_the_field(values, message):
    with pytest.raises(UserError) as e:
        request_settings(values, width=48)
    assert str(e.value).startswith(message) and e.value.fields == tuple(values)


def _parse(body: dict, width: int = 48):
    model = tiny_model("setdlm", L=48)
    model.tokenizer = CharTokenizer()
    return parse_request(json.dumps({"prompt": "ab", "max_tokens": 4, **body}).encode(), chat=False, model=model,
                         model_name="m", width=width)


@pytest.mark.parametrize("name", sorted(MARKED))
def test_the_server_takes_every_marked_field(name):
    value = sample(name, REQUEST_FIELDS[name])
    body = {name: value, **COMPANION.get(name, {})}
    want = getattr(DecodeSettings(**body), name)
    assert name in set(schemas.BOTH) | set(schemas.SETDLM_FIELDS)  # a known field of both endpoints
    assert getattr(_parse(body).settings, name) == want != getattr(DecodeSettings(), name)


def test_the_server_reads_through_the_mapping(monkeypatch):
    """A field taken out of the mapping is no longer read (no list of the server's own reads it anyway); its
    checks are the mapping's, answered as a 400 naming the field."""
    assert _parse({"top_k": 5}).settings.top_k == 5
    with pytest.raises(APIError) as e:
        _parse({"top_k": "5"})
    assert (e.value.status, e.value.param, e.value.message) == (400, "top_k", "top_k must be an integer in "
                                                                "[0, 9223372036854775807], got '5'")
    monkeypatch.delitem(REQUEST_FIELDS, "top_k")
    assert _parse({"top_k": 5}).settings.top_k == 0


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("request")
    return {family: save_tiny(root / family, family) for family in ("setdlm", "mdlm")}


def _adapter(path: str, **model_args):
    """The lm-eval adapter made as ``lm_eval --model_args`` makes it (every value parsed from its string)."""
    lm_eval = pytest.importorskip("lm_eval.api.registry")
    import setdlm.evaluation.harness  # noqa: F401  (registers "setdlm")

    args = ",".join(f"{k}={v}" for k, v in {"pretrained": path, **model_args}.items())
    return lm_eval.get_model("setdlm").create_from_arg_string(args, {"device": "cpu"})


@pytest.mark.parametrize("name", sorted(MARKED))
def test_the_adapter_takes_every_marked_field_as_a_model_arg(checkpoints, name):
    value = sample(name, REQUEST_FIELDS[name])
    args = {name: value, **COMPANION.get(name, {})}
    family = next(f for f in SETTING_FAMILIES.get(name, ("setdlm",)) if f in checkpoints)
    got = _adapter(checkpoints[family], **args).settings
    assert getattr(got, name) == getattr(DecodeSettings(**args), name) != getattr(DecodeSettings(), name)


def test_the_adapter_reads_through_the_mapping(checkpoints, monkeypatch):
    assert _adapter(checkpoints["setdlm"], top_k=5).settings.top_k == 5
    with pytest.raises(UserError, match=r"window must be an integer in \[1, 16\], got 17"):
        _adapter(checkpoints["setdlm"], window=17)  # the bound is the context length, as the server's
    monkeypatch.delitem(REQUEST_FIELDS, "top_k")
    with pytest.raises(UserError, match="unknown setdlm model_args: top_k"):
        _adapter(checkpoints["setdlm"], top_k=5)


def test_the_adapters_stop_strings_join_the_tasks(checkpoints, monkeypatch):
    """A ``stop`` model_arg is kept beside a request's ``until`` strings (not replaced by them)."""
    from lm_eval.api.instance import Instance

    from setdlm.evaluation import harness

    seen = []

    def fake_generate(model, prompts, settings, seed):
        seen.append(settings.stop)
        return type("Out", (), {"texts": [""] * len(prompts)})()

    monkeypatch.setattr(harness, "generate", fake_generate)
    lm = _adapter(checkpoints["setdlm"], stop="z")
    request = Instance(request_type="generate_until", doc={}, arguments=("ab", {"until": ["y", "z"]}), idx=0)
    lm.generate_until([request])
    assert seen == [("z", "y")]
