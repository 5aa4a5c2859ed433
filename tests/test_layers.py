"""The house picture of docs/architecture.md, pinned: every part of ``src/setdlm`` sits in one layer, and imports
(function-level ones included) only point down, or sideways inside the two foundation layers.

A part is a subpackage (``setdlm.decoding``, ``setdlm.formats``, ...) or a top-level module (``setdlm.model``).
A new module outside the mapped packages fails :func:`test_every_part_has_a_layer` until docs/architecture.md
and :data:`LAYERS` say where it belongs.
"""

from __future__ import annotations

import pytest

from test_imports import modules, parse_imports

# lowest first; a part may import parts of lower layers (and, in the foundation layers 0 and 1, its own layer)
LAYERS = [
    {"errors", "seeds", "resources", "outputs", "presets", "chat"},  # 0 base: errors, seeds, files, machine
    {"schedules", "masks", "mask_rules", "model", "backbone", "family", "objectives", "batch", "data", "drafter"},  # 1 method
    {"decoding"},  # 2 decoders over a backbone
    {"lm"},  # 3 Model: backbone + family + tokenizer, generate() through decoding
    {"formats"},  # 4 models on disk and on the Hub, built into Model objects
    {"evaluation", "serve"},  # 5 measuring and serving, on loaded models (neither imports the other)
    {"training"},  # 6 the trainer (its held-out evaluation is evaluation's estimator)
    {"cli"},  # 7 the command line: parses, calls one library function, prints
]
SIDEWAYS = {0, 1}  # layers whose parts may import each other
ENTRY_POINTS = {"setdlm.__main__", "setdlm.training.__main__"}  # `python -m ...`: they start the CLI
# the one edge up, with its reason (docs/architecture.md)
UPWARD = {("setdlm.lm", "setdlm.formats.checkpoint"): "Model.save writes through the checkpoint format"}


def part(module: str) -> str:
    """``setdlm.decoding.api`` -> ``decoding``; ``setdlm.model`` -> ``model``; the root package -> ``setdlm``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "setdlm"


def layer(module: str) -> int:
    p = part(module)
    return next(i for i, parts in enumerate(LAYERS) if p in parts)


@pytest.fixture(scope="module")
def imports():
    return parse_imports(modules())


def test_layers_are_disjoint():
    seen = [p for parts in LAYERS for p in parts]
    assert len(seen) == len(set(seen))


def test_every_part_has_a_layer(imports):
    mapped = {p for parts in LAYERS for p in parts}
    unmapped = sorted({part(m) for m in imports} - mapped - {"setdlm", "__main__"})
    assert not unmapped, f"parts without a layer (place them in LAYERS and docs/architecture.md): {unmapped}"


def violations(imports) -> list[str]:
    bad = []
    for m, found in imports.items():
        if m in ENTRY_POINTS or part(m) == "setdlm":
            continue
        for t, _, line in found["module"] + found["function"]:
            if part(t) in ("setdlm", part(m)) or (m, t) in UPWARD:
                continue  # the root package (always loaded first) and a part's own modules
            lm, lt = layer(m), layer(t)
            if lt > lm or (lt == lm and lm not in SIDEWAYS):
                bad.append(f"{m}:{line} imports {t} (layer {lm} -> {lt})")
    return bad


def test_imports_only_point_down(imports):
    bad = violations(imports)
    assert not bad, "imports against the layering of docs/architecture.md:\n" + "\n".join(bad)


def test_the_checker_finds_an_upward_and_a_sideways_import():
    fake = {"setdlm.decoding.api": {"module": [("setdlm.formats.loading", "load", 3)], "function": []},
            "setdlm.serve.app": {"module": [], "function": [("setdlm.evaluation.spec", "TaskSpec", 9)]},
            "setdlm.model": {"module": [("setdlm.data.tasks", None, 5)], "function": []},
            "setdlm.lm": {"module": [], "function": [("setdlm.formats.checkpoint", "save", 7)]}}
    assert violations(fake) == ["setdlm.decoding.api:3 imports setdlm.formats.loading (layer 2 -> 4)",
                                "setdlm.serve.app:9 imports setdlm.evaluation.spec (layer 5 -> 5)"]


def test_the_root_package_exports_only_the_library():
    """``import setdlm`` loads the model, loading and objectives, never the trainer, server, evaluation or CLI."""
    root = parse_imports(modules())["setdlm"]
    assert {part(t) for t, _, _ in root["module"]} <= {p for parts in LAYERS[:5] for p in parts}


def test_the_architecture_page_shows_these_floors():
    """docs/architecture.md's table names each part on the floor :data:`LAYERS` puts it on."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = {int(line.split("|")[1].split()[0]): line for line in page.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip()[:1].isdigit()}
    assert sorted(rows) == list(range(len(LAYERS)))
    for i, parts in enumerate(LAYERS):
        cell = rows[i].split("|")[2]
        missing = [p for p in parts if f"`{p}`" not in cell and f"`setdlm.{p}`" not in cell]
        assert not missing, f"floor {i} of docs/architecture.md does not name {missing}"


STRUCTURED = "setdlm.decoding.structured"  # structured outputs: on floor 2, below the decoders beside it


def test_structured_outputs_sit_below_the_decoders(imports):
    """``setdlm.decoding.structured`` (constraints, their compilation, the schema-to-regex writer, the CFG engine)
    imports nothing else of ``setdlm.decoding``: the decoders (``api``, ``state``, ``session``, ...) use it, and it
    stays a library of its own that a decoder's change cannot pull into a cycle (issue #47)."""
    own = [m for m in imports if m == STRUCTURED or m.startswith(STRUCTURED + ".")]
    assert {f"{STRUCTURED}.constraint", f"{STRUCTURED}.enforce", f"{STRUCTURED}.schema.regex"} <= set(own)
    bad = [f"{m}:{line} imports {t}" for m in own for t, _, line in imports[m]["module"] + imports[m]["function"]
           if t.startswith("setdlm.decoding") and not (t == STRUCTURED or t.startswith(STRUCTURED + "."))]
    assert not bad, "setdlm.decoding.structured imports the decoders:\n" + "\n".join(bad)
