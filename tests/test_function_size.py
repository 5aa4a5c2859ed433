"""No function in src/ longer than 80 lines or taking more than 8 parameters (``self``/``cls`` not counted), except
the few docs/architecture.md lists with their reasons ("Functions over the limits"): a new one fails here, and so
does an exception that is gone (remove it from both lists)."""

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "setdlm"
MAX_LINES, MAX_PARAMS = 80, 8
ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _over_the_limits() -> dict[str, tuple[int, int]]:
    """{"module.path:Qualified.name": (lines, parameters)} of every function over a limit."""
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)

        def visit(node, prefix=""):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = child.args
                    params = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]
                    lines = child.end_lineno - child.lineno + 1
                    if lines > MAX_LINES or len(params) > MAX_PARAMS:
                        found[f"{module}:{prefix}{child.name}"] = (lines, len(params))
                    visit(child, f"{prefix}{child.name}.")
                elif isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")

        visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _documented() -> set[str]:
    """The exceptions docs/architecture.md lists: lines ``* `module:name` ...`` under its "Functions over the
    limits" heading."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("## Functions over the limits", 1)[1].split("\n## ", 1)[0]
    return {line.split("`")[1] for line in section.splitlines() if line.startswith("* `")}


def test_functions_stay_within_the_limits_or_are_documented():
    over, documented = _over_the_limits(), _documented()
    assert set(over) - documented == set(), f"over {MAX_LINES} lines or {MAX_PARAMS} parameters: " + ", ".join(
        f"{k} ({v[0]} lines, {v[1]} parameters)" for k, v in sorted(over.items()) if k not in documented)
    assert documented - set(over) == set(), "listed in docs/architecture.md but within the limits now: remove them"


def test_the_scan_finds_a_long_function(tmp_path, monkeypatch):
    """The scan itself: a method of 9 parameters and a function of 81 lines are found, a method's self is free."""
    package = tmp_path / "src" / "setdlm"
    package.mkdir(parents=True)
    body = "\n".join("    x = 1" for _ in range(79))
    (package / "m.py").write_text("class C:\n    def f(self, a, b, c, d, e, f, g, h):\n        pass\n"
                                  "    def g(self, a, b, c, d, e, f, g, h, i):\n        pass\n"
                                  f"def long():\n{body}\n    return x\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", package)
    assert _over_the_limits() == {"setdlm.m:C.g": (2, 9), "setdlm.m:long": (81, 0)}
