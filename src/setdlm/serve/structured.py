"""Structured outputs of the OpenAI-compatible API (docs/decoding.md "Constrained decoding"): a request's
``response_format`` (``{"type": "json_schema", "json_schema": {"schema": {...}}}``, ``{"type":
"json_object"}`` or ``{"type": "text"}``), or the extra fields ``regex`` (a regular expression) and
``choice`` (a list of strings), on both endpoints, become the row's
:class:`~setdlm.decoding.structured.constraint.Constraint`. A bad one is a :class:`BadStructure` naming the field,
which ``schemas`` answers as a 400.
"""

from __future__ import annotations

from ..decoding.structured import constraint as c


class BadStructure(ValueError):
    """A structured-output field that cannot be honoured: the message and the field (``param``)."""

    def __init__(self, message: str, param: str | None):
        super().__init__(message)
        self.param = param


def constraint_of(body: dict) -> c.Constraint | None:
    """The constraint a request body asks for (None: free text); at most one of the three fields."""
    rf = body.get("response_format")
    if rf is not None and not (isinstance(rf, dict) and isinstance(rf.get("type"), str)):
        raise BadStructure(f"response_format must be an object with a string 'type', got {rf!r}", "response_format")
    if rf is not None and rf["type"] == "text":
        rf = None
    given = [k for k, v in (("response_format", rf), ("regex", body.get("regex")), ("choice", body.get("choice")))
             if v is not None]
    if len(given) > 1:
        raise BadStructure(f"give one of response_format, regex, choice, not {' and '.join(given)}", given[1])
    try:
        if body.get("regex") is not None:
            if not isinstance(body["regex"], str):
                raise BadStructure(f"regex must be a string, got {body['regex']!r}", "regex")
            return c.regex(body["regex"])  # compiled when the row is prepared (400 there)
        if body.get("choice") is not None:
            return c.choice(body["choice"])
        if rf is None:
            return None
        if rf["type"] == "json_object":
            return c.json_object()
        if rf["type"] != "json_schema":
            raise BadStructure(f"response_format type must be 'text', 'json_object' or 'json_schema', got "
                               f"{rf['type']!r}", "response_format")
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise BadStructure("response_format json_schema must be an object holding the JSON Schema under "
                               "'schema'", "response_format")
        return c.json_schema(spec["schema"])
    except BadStructure:
        raise
    except ImportError as e:
        raise BadStructure(f"structured outputs are not available on this server: {e}", given[0]) from None
    except ValueError as e:
        raise BadStructure(str(e), given[0]) from None

