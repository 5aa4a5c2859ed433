"""The ``format``\\ s JSON Schema defines, as regular expressions of a string's text (docs/decoding.md "JSON
Schema"). Each is the full format where it is a regular language of ASCII text and a named subset of it where
it is not (days 29-31 only in the months that always have them; e-mail addresses of letters, digits and
``._+-``; URIs of the schemes http, https and ftp with unreserved characters; ``regex`` as regular
expressions of literal characters), so that every string written passes jsonschema's format checker.

The names are those of JSON Schema Validation 2020-12, section 7.3 (``date-time``, ``date``, ``time``,
``duration``, ``email``, ``idn-email``, ``hostname``, ``idn-hostname``, ``ipv4``, ``ipv6``, ``uri``,
``uri-reference``, ``iri``, ``iri-reference``, ``uuid``, ``uri-template``, ``json-pointer``,
``relative-json-pointer``, ``regex``). A format name JSON Schema does not define (OpenAPI's ``int64``, a
project's own ``color-hex``) is an annotation: the specification leaves it to the application and validators
pass every string (jsonschema's format checker has no check for it), so it constrains nothing here either
(:data:`UNDEFINED`).
"""

from __future__ import annotations

_DATE = ("[1-9][0-9]{3}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)"
         "|(?:0[13578]|1[02])-31)")
_TIME = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
_LABEL = "[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST = f"(?:{_LABEL}\\.){{0,2}}{_LABEL}"  # at most 3 labels: within the 253 characters a name may have
_EMAIL = f"[a-z0-9]+(?:[._+-][a-z0-9]+)*@{_LABEL}(?:\\.{_LABEL})*\\.[a-z]{{2,12}}"
_UNRESERVED = "[a-zA-Z0-9._~-]"
_SEGMENT = f"{_UNRESERVED}*"
_TAIL = f"(?:\\?{_UNRESERVED}+(?:=[a-zA-Z0-9._~-]*)?)?(?:#{_UNRESERVED}*)?"  # query and fragment
_URI = f"(?:https?|ftp)://{_HOST}(?::[1-9][0-9]{{0,3}})?(?:/{_SEGMENT})*{_TAIL}"
_RELATIVE = f"{_UNRESERVED}+(?:/{_SEGMENT})*{_TAIL}|/(?:{_UNRESERVED}+(?:/{_SEGMENT})*)?{_TAIL}"
_HEX4 = "[0-9a-f]{1,4}"
_DIGITS = "(?:0|[1-9][0-9]{0,3})"
_DURATION_DATE = (f"{_DIGITS}Y(?:{_DIGITS}M)?(?:{_DIGITS}D)?|{_DIGITS}M(?:{_DIGITS}D)?|{_DIGITS}D")
_DURATION_TIME = f"T(?:{_DIGITS}H(?:{_DIGITS}M)?(?:{_DIGITS}S)?|{_DIGITS}M(?:{_DIGITS}S)?|{_DIGITS}S)"
_POINTER = "(?:/(?:[a-zA-Z0-9._ -]|~[01])*)*"

FORMATS = {  # the text of a string of each format (a subset of the format where the full one is not regular)
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "duration": f"P(?:{_DIGITS}W|(?:{_DURATION_DATE})(?:{_DURATION_TIME})?|{_DURATION_TIME})",
    "email": _EMAIL,
    "idn-email": _EMAIL,
    "hostname": _HOST,
    "idn-hostname": _HOST,
    "ipv4": f"{_OCTET}(?:\\.{_OCTET}){{3}}",
    "ipv6": f"(?:{_HEX4}:){{7}}{_HEX4}|::(?:{_HEX4}(?::{_HEX4}){{0,6}})?",
    "uri": _URI,
    "iri": _URI,
    "uri-reference": f"{_URI}|{_RELATIVE}",
    "iri-reference": f"{_URI}|{_RELATIVE}",
    "uri-template": _URI,  # a URI without expressions is a template
    "uuid": "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "json-pointer": _POINTER,
    "relative-json-pointer": f"(?:0|[1-9][0-9]{{0,3}})(?:#|{_POINTER})",
    "regex": "[a-zA-Z0-9 _-]*",  # literal characters: a regular expression of themselves
}
# formats of earlier drafts that jsonschema still checks under those names (draft 3)
_CHECKED_ELSEWHERE = {"color", "host-name", "ip-address", "utc-millisec"}


def format_regex(name: str) -> str | None:
    """The regex of a string's text of format ``name``; None for a name JSON Schema does not define (an
    annotation, see the module's docstring)."""
    return FORMATS.get(name)


def undefined(name: str) -> bool:
    """Whether ``name`` is a format JSON Schema does not define (and no checker of jsonschema checks)."""
    return name not in FORMATS and name not in _CHECKED_ELSEWHERE
