"""Finding decisions by a registered name in source code (a family's, a task's): the greps behind
tests/test_family_registry.py and tests/test_task_registry.py, which keep such decisions inside the registries."""

from __future__ import annotations

import ast
from collections.abc import Collection


def literal_names(node: ast.AST, names: Collection[str]) -> list[str]:
    """The ``names`` a literal spells: a string, or a tuple/list/set of strings."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if node.value in names else []
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for e in node.elts for n in literal_names(e, names)]
    return []


def name_compares(tree: ast.AST, names: Collection[str], exempt: str) -> list[str]:
    """``line: source`` of every comparison with one of ``names`` in ``tree``: ``x == "a"``, ``x != "a"``,
    ``x in ("a", "b")``; a comparison whose other side's source contains ``exempt`` (a word naming another
    kind of value, such as ``format`` or ``command``) is not counted."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for op, a, b in zip(node.ops, sides, sides[1:]):
            if isinstance(op, (ast.Eq, ast.NotEq)):
                hit = any(literal_names(x, names) and exempt not in ast.unparse(y) for x, y in ((a, b), (b, a)))
            else:
                hit = (isinstance(op, (ast.In, ast.NotIn)) and isinstance(b, (ast.Tuple, ast.List, ast.Set))
                       and bool(literal_names(b, names)) and exempt not in ast.unparse(a))
            if hit:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found
