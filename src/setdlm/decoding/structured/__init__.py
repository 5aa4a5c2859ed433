"""Structured outputs (docs/decoding.md "Constrained decoding"): a regular expression, a JSON Schema or a list
of choices as a :class:`~setdlm.decoding.structured.constraint.Constraint` (``constraint``), compiled to a
token automaton in a bounded process (``compiler``, ``worker``) over the tokenizer's bytes (``token_bytes``),
applied to a decode's rows (``enforce``), with llguidance's CFG engine for left-to-right decodes (``cfg``);
a JSON Schema is written as a regular expression by the ``schema`` subpackage. The decoders import it; it
imports nothing else of :mod:`setdlm.decoding`."""
