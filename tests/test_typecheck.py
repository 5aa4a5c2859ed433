"""src/setdlm passes mypy with the repository's configuration (pyproject.toml, [tool.mypy]), and the ratchet list
of modules not yet clean ([[tool.mypy.overrides]] with ignore_errors) names only modules that exist."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ratchet() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    return [name for override in config.get("overrides", []) if override.get("ignore_errors")
            for name in override["module"]]


def test_src_passes_mypy():
    pytest.importorskip("mypy", reason="mypy is part of the test extra: pip install -e '.[test]'")
    # the configuration's cache_dir (.mypy_cache, gitignored): a cold run takes tens of seconds, a warm one a few
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ratchet_names_existing_modules():
    names = _ratchet()
    assert names, "the ratchet list is gone: drop this test with it"
    assert len(names) == len(set(names)), "a module is listed twice"
    for name in names:
        path = ROOT / "src" / Path(*name.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), \
            f"{name} is in pyproject.toml's mypy ratchet list but no such module exists: remove it"
