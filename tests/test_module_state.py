"""No runtime settings or caches in module variables (docs/architecture.md, "State"): a setting belongs to the
call, the request or the object that decodes, so that two servers, two tests or two requests in one process can
differ. The scans read src/setdlm, benchmarks/ and tests/ with :mod:`ast`:

- no ``global`` statement in the package;
- no module-level dict / list / set that a function of its module fills or empties (a cache or a setting in
  disguise), but the registries listed in :data:`REGISTRIES`, filled by their ``register`` function when the
  package loads (or by a user adding a family or a task), and the state listed in :data:`PENDING`;
- nothing outside a module assigns to its UPPER_CASE names (``speculative.HORIZONS = "all"`` in a benchmark,
  ``monkeypatch.setattr(speculative, "HORIZONS", ...)`` in a test).
"""

from __future__ import annotations

import ast
from pathlib import Path

import setdlm

SRC = Path(setdlm.__file__).resolve().parent
ROOT = SRC.parents[1]
MUTATORS = {"update", "append", "add", "pop", "clear", "setdefault", "extend", "insert", "remove", "popitem",
            "discard", "move_to_end"}
# module-level containers that are registries by design (what a user extends), filled at import
REGISTRIES = {
    ("family.py", "REGISTRY"): "the family registry (setdlm.family.register)",
    ("evaluation/registry.py", "REGISTRY"): "the task registry (setdlm.evaluation.registry.register)",
    ("data/builtin.py", "BUILTIN"): "the built-in data sources (setdlm.data.register_builtin)",
}
# module state still to move into an object that whoever decodes owns: every entry here is a known defect, and the
# list only shrinks (the structured-output bounds and caches moved into
# setdlm.decoding.structured.constraint.ConstraintCompiler)
PENDING: set[tuple[str, str]] = set()


def _module_state(path: Path) -> set[str]:
    """The names of ``path``'s module-level mutable containers that a function mutates, and its ``global``s."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        value = getattr(node, "value", None)
        call = getattr(getattr(value, "func", None), "id", None) or getattr(getattr(value, "func", None), "attr", None)
        if isinstance(value, (ast.Dict, ast.List, ast.Set)) or call in ("dict", "list", "set", "OrderedDict",
                                                                           "defaultdict", "WeakKeyDictionary",
                                                                           "WeakValueDictionary"):
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    found = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for n in ast.walk(fn):
            if isinstance(n, ast.Global):
                found |= {f"global {name}" for name in n.names}
            targets = n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target] \
                if isinstance(n, ast.AugAssign) else []
            found |= {t.value.id for t in targets if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
                      and t.value.id in names}
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATORS and \
                    isinstance(n.func.value, ast.Name) and n.func.value.id in names:
                found.add(n.func.value.id)
    return found


def test_no_module_variable_holds_a_setting_or_a_cache():
    found = {(p.relative_to(SRC).as_posix(), name) for p in SRC.rglob("*.py") for name in _module_state(p)}
    unexpected = found - set(REGISTRIES) - PENDING
    assert not unexpected, f"module state (docs/architecture.md, 'State'): {sorted(unexpected)}"
    stale = (set(REGISTRIES) | PENDING) - found
    assert not stale, f"listed but gone (remove from the lists): {sorted(stale)}"


def test_the_scan_finds_a_cache_a_global_and_a_registry(tmp_path):
    code = ("CACHE = {}\nSETTING = ['auto']\nLEVEL = 1\n\ndef get(k):\n    CACHE[k] = 1\n    return CACHE\n\n"
            "def set_level(v):\n    global LEVEL\n    LEVEL = v\n\ndef kind(v):\n    SETTING.append(v)\n")
    (tmp_path / "m.py").write_text(code)
    assert _module_state(tmp_path / "m.py") == {"CACHE", "global LEVEL", "SETTING"}


def _setdlm_modules(tree: ast.Module) -> set[str]:
    """Local names bound to setdlm modules by the imports of ``tree``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("setdlm"):
            out |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("setdlm")}
    return out


def test_nothing_assigns_a_modules_constants_from_outside():
    """A benchmark once set ``speculative.HORIZONS`` and tests monkeypatched it: now a DecodeSettings field
    (``verify_layout``)."""
    hits = []
    for path in [*SRC.rglob("*.py"), *(ROOT / "benchmarks").glob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        mods = _setdlm_modules(tree)
        for n in ast.walk(tree):
            if isinstance(n, ast.Assign):
                hits += [f"{path.name}:{n.lineno}" for t in n.targets if isinstance(t, ast.Attribute)
                         and isinstance(t.value, ast.Name) and t.value.id in mods and t.attr.isupper()]
            if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "setattr" and len(n.args) >= 2 and \
                    isinstance(n.args[0], ast.Name) and n.args[0].id in mods and \
                    isinstance(n.args[1], ast.Constant) and str(n.args[1].value).isupper():
                hits.append(f"{path.name}:{n.lineno}")
    assert not hits, hits
