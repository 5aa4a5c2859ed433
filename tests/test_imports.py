"""The package's import graph: no cycles, every internal import resolves, every module imports on its own.

Every module of ``src/setdlm`` is parsed with :mod:`ast`; its setdlm-internal imports are split into
module-level ones (run when the module is imported) and function-level ones (run when the function is called:
the accepted way to break a cycle). Cycles count only through module-level imports. An import of a package
(``from .data import X``) is an edge to the package's ``__init__``; of a submodule (``from .data import tasks``,
``from .data.tasks import X``) an edge to that submodule.

Run ``pytest -q tests/test_imports.py`` to check; a failure prints the cycle (``a -> b -> a``). Lazy imports
may not close a loop either (``test_no_loop_even_through_lazy_imports``): e.g. ``Model.save`` (``lm``) writes
through ``checkpoint.save`` (``lm`` imports ``checkpoint``), so ``checkpoint`` returns a checkpoint's parts and ``loading`` builds the
``Model``. Nothing imports ``cli`` (not even lazily): the CLI sits on top.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

import setdlm

SRC = Path(setdlm.__file__).resolve().parent  # src/setdlm of the checkout under test

ENTRY_POINTS = {"setdlm.__main__", "setdlm.training.__main__"}  # run the CLI when imported


def module_name(path: Path) -> str:
    parts = ("setdlm",) + path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _is_package(name: str, mods: dict[str, Path]) -> bool:
    return mods[name].name == "__init__.py"


def _targets(node: ast.AST, here: str, mods: dict[str, Path]) -> list[tuple[str, str | None]]:
    """``(module, name)`` pairs an import statement reaches inside setdlm; ``name`` None for ``import m``."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names if a.name.split(".")[0] == "setdlm"]
    if node.level:
        package = here if _is_package(here, mods) else here.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    if base.split(".")[0] != "setdlm":
        return []
    return [(f"{base}.{a.name}", None) if f"{base}.{a.name}" in mods else (base, a.name) for a in node.names]


def _function_level(tree: ast.Module) -> set[int]:
    """ids of the import nodes nested in a function (or lambda) body."""
    out = set()
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            out |= {id(n) for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return out


def parse_imports(mods: dict[str, Path]) -> dict[str, dict[str, list[tuple[str, str | None, int]]]]:
    """Per module: ``{"module": [...], "function": [...]}`` of ``(target module, imported name, line)``."""
    out = {}
    for name, path in mods.items():
        tree = _tree(path)
        lazy = _function_level(tree)
        found = {"module": [], "function": []}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                level = "function" if id(node) in lazy else "module"
                found[level] += [(t, n, node.lineno) for t, n in _targets(node, name, mods)]
        out[name] = found
    return out


def module_graph(imports) -> dict[str, set[str]]:
    """setdlm module -> the setdlm modules it imports at module level (self-imports of a package dropped)."""
    return {m: {t for t, _, _ in found["module"] if t != m} for m, found in imports.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components, each sorted, in dependency order (a component after everything it imports)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def find_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One cycle through ``component`` (a strongly connected set of two or more modules), closed: [a, ..., a]."""
    inside = set(component)
    path, seen = [component[0]], {component[0]: 0}
    while True:
        nxt = min(w for w in graph[path[-1]] if w in inside)
        if nxt in seen:
            return path[seen[nxt]:] + [nxt]
        seen[nxt] = len(path)
        path.append(nxt)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    return [find_cycle(graph, c) for c in strongly_connected(graph) if len(c) > 1]


def without(graph: dict[str, set[str]], edges) -> dict[str, set[str]]:
    return {m: {t for t in ts if (m, t) not in edges} for m, ts in graph.items()}


@pytest.fixture(scope="module")
def mods():
    return modules()


@pytest.fixture(scope="module")
def imports(mods):
    return parse_imports(mods)


# -- the checker itself ---------------------------------------------------------------------------------------


def test_cycle_finder_on_small_graphs():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(g) == [["a", "b", "c", "a"]]
    assert cycles(without(g, {("c", "a")})) == []
    order = [m for comp in strongly_connected(without(g, {("c", "a")})) for m in comp]
    assert order.index("c") < order.index("b") < order.index("a") < order.index("d")  # dependencies first
    two = {"x": {"y", "z"}, "y": {"x"}, "z": {"y"}}
    assert cycles(two) == [["x", "y", "x"]]


def test_parser_sorts_module_and_function_level():
    src = ("from .a import f\nimport setdlm.b\nfrom . import c\nimport os\n"
           "def g():\n    from .d import h\n    return h\n")
    pkg = {"setdlm": SRC / "__init__.py", "setdlm.x": SRC / "x.py", "setdlm.a": SRC / "a.py",
           "setdlm.b": SRC / "b.py", "setdlm.c": SRC / "c.py", "setdlm.d": SRC / "d.py"}
    tree = ast.parse(src)
    lazy = _function_level(tree)
    found = {"module": [], "function": []}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found["function" if id(node) in lazy else "module"] += _targets(node, "setdlm.x", pkg)
    assert sorted(found["module"]) == [("setdlm.a", "f"), ("setdlm.b", None), ("setdlm.c", None)]
    assert found["function"] == [("setdlm.d", "h")]


# -- the package ------------------------------------------------------------------------------------------------


def test_every_internal_import_resolves(mods, imports):
    """Every setdlm import, lazy ones included, names an existing module and a name it defines (a moved
    function whose lazy importers were not updated fails here, not at run time)."""
    defined = {m: _top_level_names(p) for m, p in mods.items()}
    bad = [f"{m}:{line}: {t}" + (f".{n}" if n else "")
           for m, found in imports.items() for t, n, line in found["module"] + found["function"]
           if t not in mods or (n is not None and n != "*" and n not in defined[t])]
    assert not bad, "imports that do not resolve:\n" + "\n".join(bad)


def _top_level_names(path: Path) -> set[str]:
    """Names a module defines when imported: its top-level defs, classes, imports and assignments (also
    inside top-level if / try / for blocks), not names local to a function or class body."""
    names, todo = set(), list(_tree(path).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif not isinstance(node, ast.Lambda):
            todo += ast.iter_child_nodes(node)
    return names


def test_no_import_cycles(imports):
    found = cycles(module_graph(imports))
    assert not found, "import cycles (module-level imports):\n" + "\n".join(" -> ".join(c) for c in found)


def _in_cli(module: str) -> bool:
    return module == "setdlm.cli" or module.startswith("setdlm.cli.")


def test_nothing_imports_the_cli(imports):
    """The CLI only parses and prints: the library never calls back into it, lazily or not; only the entry
    points (``python -m setdlm``, ``python -m setdlm.training``) enter it."""
    back = {m: line for m, found in imports.items() if not _in_cli(m) and m not in ENTRY_POINTS
            for t, _, line in found["module"] + found["function"] if _in_cli(t)}
    assert not back, f"modules importing the setdlm.cli package: {back}"


LOADING = {"setdlm.formats.loading", "setdlm.formats.checkpoint", "setdlm.formats.convert", "setdlm.formats.pretrained", "setdlm.formats.hub", "setdlm.formats.hf",
           "setdlm.formats.gguf", "setdlm.formats.backbones", "setdlm.formats.card"}


def test_no_loop_even_through_lazy_imports(imports):
    """Counting function-level imports too, the package has no loop (a lazy import only defers a module's
    cost, e.g. torch-heavy or optional dependencies; it is not a way around the layering)."""
    graph = {m: {t for t, _, _ in found["module"] + found["function"] if t != m} for m, found in imports.items()}
    assert "setdlm.formats.checkpoint" in graph["setdlm.lm"]  # Model.save writes through checkpoint.save ...
    assert not cycles(graph), cycles(graph)  # ... and checkpoint does not build Model objects


def test_loading_modules_are_acyclic_with_lazy_imports_too(imports):
    """``setdlm.formats.loading`` resolves names and picks a reader; the readers never reach back up to it or into
    each other's routing, not even through a function-level import."""
    assert LOADING <= set(imports)
    graph = {m: {t for t, _, _ in found["module"] + found["function"] if t in LOADING and t != m}
             for m, found in imports.items() if m in LOADING}
    assert not cycles(graph), cycles(graph)
    assert all("setdlm.formats.loading" not in graph[m] for m in LOADING), "a reader imports the front door"

# The child process: preload third-party libraries, then for each module of standalone_imports (started in
# dependency order, a few at a time) fork a process that imports that module alone, with no setdlm module
# loaded before it.
_CHILD = r"""
import importlib, json, os, sys, traceback
for lib in ("torch", "numpy", "tokenizers", "safetensors.torch", "tqdm.auto", "importlib.metadata", "urllib.request"):
    importlib.import_module(lib)

def child(name, w):
    try:
        importlib.import_module(name)
        msg = "ok"
    except ModuleNotFoundError as e:  # a missing optional dependency skips; a missing setdlm module fails
        msg = ("skip " if e.name and e.name.split(".")[0] != "setdlm" else "fail ") + repr(e)
    except BaseException:
        msg = "fail " + traceback.format_exc(limit=-3)
    os.write(w, msg.encode()[:60000])
    os._exit(0)

names, report, running = json.loads(sys.argv[1]), {}, {}
for name in names + [None] * len(names):
    if name is None or len(running) >= max(2, os.cpu_count() or 1):
        if not running:
            break
        pid, _ = os.waitpid(-1, 0)
        done, r = running.pop(pid)
        report[done] = os.read(r, 65536).decode() or "fail: the child died"
        os.close(r)
    if name is not None:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            child(name, w)
        os.close(w)
        running[pid] = (name, r)
print(json.dumps({n: report[n] for n in names}))
"""


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module that importing ``start`` loads (module-level imports, transitively), ``start`` included."""
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph.get(m, ())
    return seen


def standalone_imports(graph: dict[str, set[str]]) -> list[str]:
    """The modules to import one per fresh process, in dependency order. Python runs a module's parent
    packages first, so a module that one of its parent packages already loads (``setdlm.batch`` through
    ``setdlm/__init__``, ``setdlm.data.corpus`` through ``setdlm/data/__init__``) imports exactly as its
    package does and needs no process of its own."""
    def covered(m: str) -> bool:
        parts = m.split(".")
        return any(m in reached(graph, ".".join(parts[:i])) for i in range(1, len(parts)))

    order = [m for comp in strongly_connected(graph) for m in comp]
    return [m for m in order if m not in ENTRY_POINTS and not covered(m)]


def test_standalone_imports_skip_only_what_a_package_loads():
    g = {"setdlm": {"setdlm.a"}, "setdlm.a": {"setdlm.b"}, "setdlm.b": set(), "setdlm.c": {"setdlm.a"},
         "setdlm.p": {"setdlm.p.x"}, "setdlm.p.x": set(), "setdlm.p.y": {"setdlm.c"}}
    assert standalone_imports(g) == ["setdlm", "setdlm.c", "setdlm.p", "setdlm.p.y"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_every_module_imports_on_its_own(mods, imports):
    order = standalone_imports(module_graph(imports))
    assert {"setdlm", "setdlm.training", "setdlm.serve", "setdlm.cli"} <= set(order)  # (data, decoding: through setdlm)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC.parent), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(order)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert list(report) == order
    failed = {m: msg for m, msg in report.items() if msg.startswith("fail")}
    assert not failed, "modules that do not import on their own:\n" + "\n".join(f"{m}: {v}" for m, v in failed.items())


# -- layering and size ----------------------------------------------------------------------------------------

TRAINING = ("setdlm.training",)


def _is_training(module: str) -> bool:
    return any(module == t or module.startswith(t + ".") for t in TRAINING)


def test_evaluation_never_reaches_the_training_code(mods, imports):
    """``setdlm eval``/``bench`` and the evaluation package stand on the library, never on the trainer: no
    import chain from ``setdlm.evaluation`` (lazy imports and parent packages included) reaches
    ``setdlm.training`` or the ``setdlm.training`` package."""
    graph = {m: {t for t, _, _ in found["module"] + found["function"] if t != m} for m, found in imports.items()}
    for m in list(graph):  # importing a module runs its parent packages first
        parts = m.split(".")
        graph[m] |= {".".join(parts[:i]) for i in range(1, len(parts))}
    starts = [m for m in mods if m == "setdlm.evaluation" or m.startswith("setdlm.evaluation.")]
    assert {"setdlm.evaluation.spec", "setdlm.evaluation.runs", "setdlm.evaluation.likelihood"} <= set(starts)
    bad = {m: sorted(t for t in reached(graph, m) if _is_training(t)) for m in starts}
    assert not any(bad.values()), f"evaluation modules reaching the training code: {bad}"


_EVAL_CHILD = r"""
import json, sys
from setdlm.evaluation import EvalRun, evaluate_checkpoint
res = evaluate_checkpoint("shakespeare-ar", data=sys.argv[1], run=EvalRun(batch_size=4))
print(json.dumps({"nelbo": res["nelbo"], "training": sorted(m for m in sys.modules
                                                             if m.startswith("setdlm.training"))}))
"""


def test_an_evaluation_runs_without_loading_the_training_code(tmp_path):
    """The same, observed: a likelihood evaluation of a shipped checkpoint leaves no training module in
    ``sys.modules``."""
    from setdlm.formats import pretrained

    if "shakespeare-ar" not in pretrained.available():
        pytest.skip("no shipped models in this installation")
    text = tmp_path / "t.txt"
    text.write_text("ROMEO. But soft, what light through yonder window breaks?\n" * 8)
    env = dict(os.environ, PYTHONPATH=str(SRC.parent), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", _EVAL_CHILD, str(text)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["nelbo"] > 0 and out["training"] == []


MAX_LINES = 500
# modules allowed above MAX_LINES, each one concept that honestly needs the room
LONG_MODULES = {
    "setdlm.formats.convert": "the paper authors' checkpoint layout (DiT and Qwen3 HF backbones): the key map, the config "
                      "translation and its checks, in one place so that the two layouts cannot drift",
}


def test_no_module_is_too_long(mods):
    """Modules stay readable top to bottom: at most MAX_LINES lines, except the few of LONG_MODULES (which
    the CLI and the sweep library are not)."""
    lines = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in mods.items()}
    long = {m: n for m, n in lines.items() if n > MAX_LINES and m not in LONG_MODULES}
    assert not long, f"modules over {MAX_LINES} lines: {long}; split them by concept"
    assert lines["setdlm.cli.commands"] <= 400, f"cli/commands.py has {lines['setdlm.cli.commands']} lines; it only parses and prints"
    assert "setdlm.evaluation.sweeps" not in LONG_MODULES and "setdlm.cli.commands" not in LONG_MODULES
    stale = [m for m in LONG_MODULES if m in lines and lines[m] <= MAX_LINES]
    assert not stale, f"no longer long, drop them from LONG_MODULES: {stale}"


def test_each_name_has_one_home():
    """A module outside a package's ``__init__`` does not import a setdlm name only to expose it again
    (``setdlm.formats.hf.chat_prompt`` for ``setdlm.chat.chat_prompt``): importers go to the defining module."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.level and "noqa: F401" in lines[node.lineno - 1]:
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, found


def test_the_benchmarks_import_what_exists():
    """Every ``from setdlm... import name`` of benchmarks/*.py (module level or inside a function) names something
    its module has: a name moved in src/ (``chat_prompt`` from ``setdlm.formats.hf`` to ``setdlm.chat``) broke
    four scripts at their first line once, with no test to say so."""
    import importlib

    missing = []
    for script in sorted((SRC.parents[1] / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("setdlm"):
                module = importlib.import_module(node.module)
                missing += [f"{script.name}:{node.lineno} {node.module}.{a.name}" for a in node.names
                            if not hasattr(module, a.name) and not _is_submodule(f"{node.module}.{a.name}")]
    assert not missing, missing


def _is_submodule(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
