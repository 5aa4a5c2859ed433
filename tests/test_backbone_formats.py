"""The backbone-format registry, the HF adapter's runners and the checkpoint split (docs/architecture.md, "Backbone
formats"), pinned: formats/ decides a backbone's kind by its record, never by comparing a name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from setdlm.formats import backbones
from setdlm.formats.backbones import DIT, HF, REGISTRY, format_named, format_of
from setdlm.model import Transformer, TransformerConfig

FORMATS = Path(__file__).resolve().parents[1] / "src" / "setdlm" / "formats"
NAMES = {"dit", "hf", "gpt2", "llama", "qwen2", "qwen3"}  # backbone formats and architectures
# third-party classes recognised by name where importing them is optional (error types, GPT-2's Conv1D, SiLU)
FOREIGN = {"SafetensorError", "Conv1D", "SiLU", "SiLUActivation", "ConnectError", "ConnectTimeout",
           "LocalEntryNotFoundError", "OfflineModeIsEnabled"}


def _compared(node: ast.Compare) -> list:
    return [node.left, *node.comparators]


def _string_tests(path: Path) -> list[str]:
    """``x == "gpt2"``/``"dit"``/``"hf"``-style comparisons (or ``in`` a tuple of them), and
    ``type(x).__name__`` compared with a string naming no third-party class, in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        parts = _compared(node)
        strings = {c.value for p in parts for c in ast.walk(p)
                   if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        if strings & NAMES:
            found.append(f"{path.name}:{node.lineno} compares with {sorted(strings & NAMES)}")
        named = any(isinstance(p, ast.Attribute) and p.attr == "__name__" for p in parts)
        if named and not strings <= FOREIGN:
            found.append(f"{path.name}:{node.lineno} tests type(...).__name__ against {sorted(strings - FOREIGN)}")
    return found


def test_no_backbone_kind_is_decided_by_a_string():
    """Only the registry (backbones.py) and the runners' table (hf.py's RUNNERS) know the names."""
    found = [f for p in sorted(FORMATS.glob("*.py")) if p.name != "backbones.py" for f in _string_tests(p)]
    assert not found, found


def test_the_checker_finds_a_name_test(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('if kind == "gpt2" or cfg.get("backbone") in ("dit", "hf") or type(b).__name__ == "HFBackbone":\n'
                   '    pass\n')
    assert len(_string_tests(bad)) == 3  # two name comparisons and one __name__ test


@pytest.mark.parametrize("module", ["checkpoint", "layout", "atomic", "safety", "optim_state", "backbones", "card"])
def test_the_checkpoint_modules_stay_small(module):
    """formats/checkpoint.py was split by concern (issue #47): each part at most 300 lines."""
    assert len((FORMATS / f"{module}.py").read_text(encoding="utf-8").splitlines()) <= 300


def test_the_registry_names_its_records():
    assert REGISTRY == {"dit": DIT, "hf": HF}
    assert format_named({}) is DIT  # the first checkpoints recorded no "backbone"
    with pytest.raises(ValueError, match="unknown backbone 'rnn'"):
        format_named({"backbone": "rnn"})
    with pytest.raises(ValueError, match="saving a Linear backbone is not supported"):
        format_of(torch.nn.Linear(2, 2))


def _dit() -> Transformer:
    return Transformer(TransformerConfig(vocab_size=11, hidden_size=16, n_layers=2, n_heads=2))


def _gpt2():
    transformers = pytest.importorskip("transformers")
    from setdlm.formats.hf import HFBackbone

    cfg = transformers.GPT2Config(vocab_size=13, n_embd=16, n_layer=2, n_head=2, n_positions=8)
    return HFBackbone(transformers.GPT2LMHeadModel(cfg).eval())


@pytest.mark.parametrize("make", [_dit, _gpt2], ids=["dit", "hf"])
def test_each_format_round_trips_its_architecture(make, tmp_path):
    """to_dict -> check -> from_dict -> build gives a backbone of the same format, parameter count and vocabulary;
    count_parameters (on the meta device) agrees with the built one."""
    backbone = make()
    fmt = format_of(backbone)
    d = fmt.to_dict(backbone)
    fmt.check(tmp_path / "config.json", d)
    arch = fmt.from_dict(d)
    rebuilt = fmt.build(arch, None)
    assert format_of(rebuilt) is fmt
    assert fmt.to_dict(rebuilt) == d
    n = sum(p.numel() for p in backbone.parameters())
    assert sum(p.numel() for p in rebuilt.parameters()) == n == backbones.count_parameters(fmt, arch)
    assert fmt.vocab_size(arch) == d["vocab_size"] in (11, 13)
    assert fmt.n_layers(arch) == 2 and fmt.n_layers(fmt.with_layers(arch, 1)) == 1
    assert str(d.get("vocab_size")) in fmt.describe(d)


def test_the_runner_is_chosen_once_per_architecture():
    from setdlm.formats.hf import GPT2Runner, LlamaRunner, RUNNERS, SUPPORTED_MODEL_TYPES

    assert set(RUNNERS) == set(SUPPORTED_MODEL_TYPES)
    assert RUNNERS["gpt2"] is GPT2Runner and {RUNNERS[t] for t in ("llama", "qwen2", "qwen3")} == {LlamaRunner}
    assert _gpt2().runner is GPT2Runner
