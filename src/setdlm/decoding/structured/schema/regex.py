"""A JSON Schema as the regular expression of JSON documents that validate against it (docs/decoding.md
"Constrained decoding", "JSON Schema").

The expression is written here, keyword by keyword, as a regular language of valid documents: the whole
language of the schema where it is regular and small, a named subset of it where it is not (a subset is
what every output needs: each validates). Each subschema is first brought to one flat node
(:mod:`setdlm.decoding.structured.schema.merge`: ``$ref`` and ``allOf`` merged, drafts 4-2020-12 read alike,
``if``/``then``/``else`` and ``not`` as unions); then

* types: a list of types, or none (the types its keywords are about), as the union of one value per type;
* numbers (:mod:`setdlm.decoding.structured.schema.numbers`), strings and formats
  (:mod:`setdlm.decoding.structured.schema.strings`, :mod:`setdlm.decoding.structured.schema.formats`);
* objects: declared properties in their order, the required ones present (linear in the number of
  properties: ``(a,)?(b,)?r(,c)?``, or with none required ``(a,)?N | a``), property names that a
  ``patternProperties`` pattern or ``propertyNames`` admit, ``additionalProperties`` keys that are none of
  the declared names; ``minProperties`` by writing the first optional properties always,
  ``maxProperties`` by leaving the last out; ``dependentRequired``/``dependentSchemas`` as the union of the
  object without the key and with it and what it needs;
* arrays: ``prefixItems`` position by position, then ``items``, within ``minItems``/``maxItems``;
  ``contains`` by its first elements; ``uniqueItems`` over a finite set of items by writing each value at
  most once in the enum's order;
* ``anyOf`` as a union, the node's other keywords merged into each branch; ``oneOf`` as a union when its
  branches are disjoint, or made disjoint (a property one branch requires is left out of the others);
* ``enum``/``const``: the values that validate against the whole node (checked with jsonschema).

Everything else is a :class:`UserError` naming the keyword and its path; a subschema no value can satisfy
is left out where it is optional and refused where it is needed.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Protocol

from ....errors import UserError
from .merge import (MAX_BRANCHES, Unsatisfiable, alt, both, excluded, json_type, merge, negate,
                           normalize, not_strings, refuse, types_of)
from .numbers import number_regex
from .objects import array_regex, object_regex
from .oneof import node_types
from .strings import json_literal
from .strings import string_regex

MAX_NESTING = 64  # levels of a schema (a deeper one is refused, never a RecursionError)
MAX_PATTERN = 4_000_000  # characters of a schema's regular expression
FREE_DEPTH = 1  # a free-form value ({} or true) nests arrays and objects this deep
def schema_regex(schema: dict, *, max_depth: int, whitespace: str | None) -> str:
    """The regular expression of JSON texts that validate against ``schema`` (checked already against the
    meta-schema); a :class:`UserError` naming keyword and path for what it cannot enforce."""
    check_nesting(schema)
    writer = Writer(schema, max_depth, "[ ]?" if whitespace is None else f"(?:{whitespace})")
    try:
        pattern = writer.value(schema, "(root)")
    except Unsatisfiable as e:
        raise e.error() from None
    if len(pattern) > MAX_PATTERN:
        raise UserError(f"json_schema: its regular expression has {len(pattern):,} characters, more than "
                        f"{MAX_PATTERN:,}; lower max_depth (recursive references) or simplify the schema",
                        fields=("json_schema",))
    return pattern


def check_nesting(schema) -> None:
    """A :class:`UserError` for a schema nested more than :data:`MAX_NESTING` levels (checked without
    recursion)."""
    todo = [(schema, 1, "(root)")]
    while todo:
        node, depth, where = todo.pop()
        if depth > MAX_NESTING:
            raise UserError(f"json_schema: nested more than {MAX_NESTING} levels at {where[:120]}...; flatten it or "
                            f"use $ref", fields=("json_schema",))
        if isinstance(node, dict):
            todo.extend((v, depth + 1, f"{where}/{k}") for k, v in node.items())
        elif isinstance(node, list):
            todo.extend((v, depth + 1, f"{where}/{i}") for i, v in enumerate(node))


def _empty(flat: dict) -> bool:
    """A flat node with no type left, or an enum none of whose values its types and excluded values let
    through."""
    if flat.get("type") == []:
        return True
    if "enum" not in flat:
        return False
    types = types_of(flat)
    out = [v for r in flat.get("_raw", []) for v in excluded(r)]
    return not any((json_type(v, integers=True) in types or json_type(v) in types or "type" not in flat)
                   and not any(v == x and type(v) is type(x) for x in out) for v in flat["enum"])


class _Validator(Protocol):
    """What :meth:`Writer.valid` uses of a ``jsonschema`` validator (jsonschema ships no type information)."""

    def evolve(self, *, schema: object) -> _Validator: ...

    def is_valid(self, instance: object) -> bool: ...


class Writer:
    """Writes the regex of the subschemas of ``root``, following local references (a recursive one at most
    ``max_depth`` times along a path), with ``ws`` between a document's tokens."""

    def __init__(self, root: dict, max_depth: int, ws: str):
        self.root, self.max_depth, self.ws = root, max_depth, ws
        self.stack: dict[str, int] = {}  # references being written -> how many times along this path
        self.reentries = 0
        self.cache: dict = {}
        self._validator: _Validator | None = None  # made on the first enum checked

    # -- one subschema ------------------------------------------------------------------------------------

    def value(self, node, where: str) -> str:
        """The regex of ``node`` (a raw subschema); :class:`Unsatisfiable` where nothing can be written."""
        if node is True or node == {}:
            return self.free(FREE_DEPTH)
        if node is False:
            raise Unsatisfiable("false", where, "the schema false admits no value")
        if not isinstance(node, dict):
            refuse("(schema)", where, f"a schema is an object or a boolean, got {node!r}")
        key = (id(node), tuple(sorted(self.stack.items())))
        if key in self.cache:
            return self.cache[key][1]
        flat = self.flatten(node, where)
        out = self.written(flat, where)
        if len(out) > MAX_PATTERN:
            raise UserError(f"json_schema: the regular expression of {where[:160]} has {len(out):,} characters, more "
                            f"than {MAX_PATTERN:,}; lower max_depth (recursive references) or simplify the schema",
                            fields=("json_schema",))
        self.cache[key] = (node, out)  # the node kept alive: its id is not reused
        return out

    def written(self, flat: dict, where: str) -> str:
        """The regex of a flat node, its references counted as entered while its parts are written."""
        refs = flat.pop("_refs", [])
        for r in refs:
            self.reentries += self.stack.get(r, 0) > 0
            self.stack[r] = self.stack.get(r, 0) + 1
        try:
            return self.flat_value(flat, where)
        finally:
            for r in refs:
                self.stack[r] -= 1
                self.reentries -= self.stack[r] > 0
                if not self.stack[r]:
                    del self.stack[r]

    def flatten(self, node, where: str) -> dict:
        """``node`` as one flat node (schema_merge): references and ``allOf`` merged, ``if``/``then``/``else``
        and ``not`` as unions."""
        flat: dict = {"_raw": [node], "_refs": [], "_unions": []}
        todo, chain = [(node, where)], set()
        while todo:
            n, w = todo.pop()
            if n is True:
                continue
            if n is False:
                raise Unsatisfiable("false", w, "the schema false admits no value")
            n = normalize(n, w)
            if "$ref" in n:
                target, tw, ref = self.resolve(n.pop("$ref"), w)
                if ref not in chain:  # met again (allOf of both, or a cycle with no value between): merged once
                    chain.add(ref)
                    if self.stack.get(ref, 0) and self.reentries >= self.max_depth:
                        raise Unsatisfiable("$ref", w, f"recursion through {ref!r} deeper than max_depth="
                                                       f"{self.max_depth}")
                    flat["_refs"].append(ref)
                    todo.append((target, tw))
            todo += [(s, f"{w}/allOf/{i}") for i, s in enumerate(n.pop("allOf", []))]
            self._unions(n, w, flat)
            flat = merge(flat, n, w)
        return flat

    def _unions(self, n: dict, w: str, flat: dict) -> None:
        """``if``/``then``/``else``, ``not``, ``anyOf`` and ``oneOf`` of ``n`` moved into ``flat``'s unions."""
        if "if" in n:
            cond, then, other = n.pop("if"), n.pop("then", True), n.pop("else", True)
            neg = negate(self.deref(cond, w), w)
            branches = [both(cond, then)] + [both(n, other) for n in neg]  # each negation a branch of its own
            flat["_unions"].append(("if", branches, w))
        n.pop("then", None), n.pop("else", None)  # without if they apply to nothing
        if "not" in n:
            sub = self.deref(n.pop("not"), w)
            if excluded({"not": sub}):  # values excluded: kept in _raw and read by the types (of_type)
                flat["_raw"].append({"not": sub})
            else:
                neg = negate(sub, w)
                if sub is True or (isinstance(sub, dict) and not normalize(sub, w)):
                    raise Unsatisfiable("not", w, "not of a schema every value validates against")
                if not neg:
                    refuse("not", w, "its complement is not written here (the other types, values of an enum, a "
                                     "required property absent, a bound's other side, a property's value negated)")
                flat["_unions"].append(("not", neg, w))
        for kind in ("anyOf", "oneOf"):
            if kind in n:
                flat["_unions"].append((kind, n.pop(kind), w))

    def deref(self, node, where: str):
        """``node`` with a top-level local reference followed (for negation)."""
        seen = set()
        while isinstance(node, dict) and isinstance(node.get("$ref"), str) and len(node) == 1:
            if node["$ref"] in seen:
                refuse("$ref", where, "a reference to itself")
            seen.add(node["$ref"])
            node, where, _ = self.resolve(node["$ref"], where)
        return node

    def resolve(self, ref, where: str) -> tuple:
        """(schema, its path, its key) of a local reference: ``#``, a JSON pointer ``#/...``, or the root's
        own ``$id``/``id`` followed by one."""
        if not isinstance(ref, str):
            refuse("$ref", where, f"a reference is a string, got {ref!r}")
        base = self.root.get("$id") or self.root.get("id")
        if isinstance(base, str) and base.split("#")[0] and ref.startswith(base.split("#")[0]):
            ref = ref[len(base.split("#")[0]):]
        if not ref.startswith("#"):
            refuse("$ref", where, f"{ref!r} refers to another document; inline it under $defs")
        node, path = self.root, "(root)"
        for part in [p for p in urllib.parse.unquote(ref[1:]).split("/")[1:]]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                refuse("$ref", where, f"{ref!r} names nothing in the schema")
            path += f"/{part}"
        if ref not in ("#", "") and not ref.startswith("#/"):
            refuse("$ref", where, f"{ref!r}: only JSON pointers (#/...) are followed, not anchors")
        return node, path, ref if ref.startswith("#/") else "#"

    # -- a flat node ---------------------------------------------------------------------------------------

    def flat_value(self, flat: dict, where: str) -> str:
        unions = flat.pop("_unions", [])
        if unions:
            return self.union(flat, unions, where)
        if flat.get("type") == []:
            raise Unsatisfiable("type", where, "the merged subschemas have no type in common")
        if "enum" in flat:
            return alt([json_literal(v, self.ws) for v in self.enum_values(flat, where)])
        out: list[str] = []
        failed: list[Unsatisfiable] = []
        for t in node_types(flat):
            try:
                out.append(self.of_type(t, flat, where))
            except Unsatisfiable as e:
                failed.append(e)
        if not out:  # the first type's reason; none where ``type`` names no JSON type (a schema never checked)
            raise failed[0] if failed else Unsatisfiable("type", where, f"no JSON type in {flat.get('type')!r}")
        return alt(out)

    def union(self, flat: dict, unions: list, where: str) -> str:
        """The node's unions distributed one after the other, the options whose merge is plainly empty (a
        required property no value satisfies) dropped as they arise, so that chains of ``if`` on one
        property stay linear; more than :data:`MAX_BRANCHES` live options is refused."""
        options, first = [(dict(flat, _unions=[]), where)], None
        for kind, branches, w in unions:
            group = []
            for i, b in enumerate(branches):
                try:
                    group.append((self.flatten(b, f"{w}/{kind}/{i}"), b, f"{w}/{kind}/{i}"))
                except Unsatisfiable as e:
                    first = first or e
            grown = []
            for option, _ in options:
                merged = [(dict(merge(option, bf, w), _branch=[b]), path) for bf, b, path in group]
                merged = [(m, path) for (m, path), (bf, _, _) in zip(merged, group) if not self.dead(m, bf, path)]
                if kind == "oneOf" and len(merged) > 1:
                    from .oneof import separate

                    merged = list(zip(separate(self, [m for m, _ in merged], w), [p for _, p in merged]))
                grown += merged
                if len(grown) > MAX_BRANCHES:
                    refuse(kind, w, f"more than {MAX_BRANCHES} branches once its unions are combined")
            options = grown
        out = []
        for option, path in options:
            try:
                out.append(self.written(option, path))
            except Unsatisfiable as e:
                first = first or e
        if not out:
            raise first or Unsatisfiable(unions[0][0], unions[0][2], "it has no branch")
        return alt(out)

    def dead(self, option: dict, branch: dict, where: str) -> bool:
        """Whether a merged option plainly admits no value: no type left, an empty enum, or a required
        property that the branch just merged constrains to no value (checked for those properties only)."""
        if _empty(option):
            return True
        props = option.get("properties", {})
        for name in set(branch.get("properties", {})) & set(option.get("required", [])):
            sub = props.get(name)
            if sub is False:
                return True
            if isinstance(sub, dict):
                try:
                    if _empty(self.flatten(sub, where)):
                        return True
                except Unsatisfiable:
                    return True
        return False

    def of_type(self, t: str, flat: dict, where: str) -> str:
        out = [v for r in flat.get("_raw", []) for v in excluded(r)]
        if t != "string" and any(json_type(v) in (t, "number" if t == "integer" else t) for v in out):
            if t != "boolean":
                raise Unsatisfiable("not", where, f"values of type {t} are excluded by a not")
            left = [x for x in (True, False) if not any(x is v for v in out)]
            if not left:
                raise Unsatisfiable("not", where, "both booleans are excluded by a not")
            return alt([json.dumps(x) for x in left])
        if t == "null":
            return "null"
        if t == "boolean":
            return "true|false"
        if t in ("integer", "number"):
            return number_regex(flat, where, integer=t == "integer")
        if t == "string":
            return string_regex(flat, where, not_strings(flat))
        if t == "array":
            return array_regex(self, flat, where)
        return object_regex(self, flat, where)

    def enum_values(self, flat: dict, where: str) -> list:
        """The values of the node's enum that validate against every raw schema it merges (jsonschema)."""
        seen, out = set(), []
        for v in flat["enum"]:
            key = json.dumps(v, sort_keys=True) + type(v).__name__[:1]
            if key not in seen and all(self.valid(v, r) for r in flat.get("_raw", [])):
                seen.add(key)
                out.append(v)
        if not out:
            raise Unsatisfiable("enum", where, "none of its values validates against the rest of the schema")
        return out

    def valid(self, value, schema) -> bool:
        if self._validator is None:
            try:
                import jsonschema
            except ImportError:
                refuse("enum", "(root)", "checking an enum's values against the schema needs jsonschema "
                                         "(pip install 'setdlm[constrain]')")
            cls = jsonschema.validators.validator_for(self.root)
            self._validator = cls(self.root, format_checker=cls.FORMAT_CHECKER)
        try:
            return self._validator.evolve(schema=schema).is_valid(value)
        except Exception as e:  # a reference jsonschema cannot follow
            refuse("enum", "(root)", f"its values cannot be checked: {type(e).__name__}: {str(e)[:80]}")

    def free(self, depth: int) -> str:
        """Any JSON value nesting arrays and objects at most ``depth`` levels."""
        key = ("free", depth)
        if key not in self.cache:
            ws, scalar = self.ws, 'null|true|false|-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|"' \
                                  '(?:[^"\\\\\\x00-\\x1F\\x7F-\\x9F]|\\\\["\\\\/bfnrt])*"'
            if depth == 0:
                self.cache[key] = (None, scalar)
            else:
                v = self.free(depth - 1)
                key_text = '"(?:[^"\\\\\\x00-\\x1F\\x7F-\\x9F]|\\\\["\\\\/bfnrt])*"'
                kv = f"{ws}{key_text}{ws}:{ws}(?:{v})"
                self.cache[key] = (None, f"{scalar}|\\[{ws}(?:(?:{v})(?:{ws},{ws}(?:{v}))*)?{ws}\\]"
                                         f"|\\{{(?:{kv}(?:{ws},{kv})*)?{ws}\\}}")
        return self.cache[key][1]
