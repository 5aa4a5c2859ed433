"""A request's decoding settings: the fields of :class:`~setdlm.decoding.settings.DecodeSettings` that a request
sets by name, read from JSON-like values (docs/architecture.md, docs/serve.md).

Which fields a request sets, and how, is the ``request`` metadata of the dataclass's fields (a
:class:`~setdlm.decoding.settings.RequestField`), as the command line derives its flags from the same fields:
the server (a request body) and the lm-eval adapter (its model_args) both read their settings through
:func:`request_settings`, so a field marked there is taken by both under its own name. The JSON type and the
request's bounds are checked here; every value's range is then DecodeSettings' own check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields

from ..errors import UserError
from .settings import DecodeSettings, RequestField

# field name -> how a request gives it, in the dataclass's order
REQUEST_FIELDS: dict[str, RequestField] = {f.name: f.metadata["request"] for f in fields(DecodeSettings)
                                           if "request" in f.metadata}
# a switch's values besides true and false (speculate: "next_token")
_VALUES = {f.name: tuple(f.metadata.get("values", ())) for f in fields(DecodeSettings) if "request" in f.metadata}


def request_settings(values: Mapping, width: int) -> dict:
    """The :class:`DecodeSettings` keyword arguments that ``values`` (a request's fields by name) give for the
    fields of :data:`REQUEST_FIELDS`; other keys are ignored. A field absent or null is left out, and so is a
    switch given ``false`` (its default); ``width``: the canvas width, the bound of a window or block (one
    wider cannot be decoded). A value of the wrong type or out of the request's bounds is a
    :class:`~setdlm.errors.UserError` naming the field (``fields``)."""
    out = {}
    for name, spec in REQUEST_FIELDS.items():
        v = values.get(name)
        if v is None or (spec.kind == "switch" and v is False):
            continue
        out[name] = _read(name, spec, v, width)
    return out


def _read(name: str, spec: RequestField, v, width: int):
    """One field's value as DecodeSettings takes it; a UserError names the field."""
    high = width if spec.high == "width" else spec.high
    given, ok, says = v, True, ""  # a choice: DecodeSettings checks its values
    if spec.kind == "switch":
        values = _VALUES[name]
        ok, says = v is True or v in values, "true, false or " + " or ".join(f'"{x}"' for x in values) \
            if values else "a bool"
    elif spec.kind in ("number", "integer"):
        number = spec.kind == "number"
        ok = (is_number(v) if number else is_int(v)) and (spec.low is None or (
            spec.low < v if spec.low_open else spec.low <= v)) and (high is None or v <= high)
        says = spec.says or f"{'a number' if number else 'an integer'} in {'(' if spec.low_open else '['}" + (
            f"{spec.low:g}, {high:g}]" if number else f"{spec.low}, {high}]")
        v = float(v) if number and ok else v
    elif spec.kind == "strings":
        v = [v] if isinstance(v, str) else v
        ok = isinstance(v, list) and (spec.low or 0) <= len(v) <= (high or math.inf) \
            and all(isinstance(x, str) and x for x in v)
        says = f"a non-empty string or a list of {spec.low} to {high} of them"
    if not ok:
        raise UserError(f"{name} must be {says}, got {short(given)}", fields=(name,))
    return v


def short(v) -> str:
    """A value for an error message, cut to 40 characters (a 4000-digit integer is not echoed)."""
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def is_int(v) -> bool:
    """An integer and not a bool (JSON's ``true`` is no integer)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    """A finite number and not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
