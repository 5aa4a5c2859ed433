"""A JSON Schema as the regular expression of the JSON documents that validate against it (docs/decoding.md
"JSON Schema"): ``regex`` writes it keyword by keyword over a flat node (``merge``), with ``numbers``,
``strings``, ``formats``, ``objects`` (objects and arrays) and ``oneof``."""
