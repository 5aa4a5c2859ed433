"""Checkpoints: save -> load gives identical logits; every broken checkpoint fails with a clear message."""

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

import setdlm
from setdlm.formats import checkpoint as ckpt, optim_state
from setdlm.data import char_tokenizer
from setdlm.family import FamilyConfig
from setdlm.lm import Model
from setdlm.masks import causal_mask
from setdlm.outputs import write_text_atomic

from support import make_model


def tiny_model(family="setdlm", dtype=torch.float64, seed=0) -> Model:
    tok = char_tokenizer(["the quick brown fox jumps over the lazy dog"])
    backbone = make_model(vocab=tok.vocab_size, seed=seed, dtype=dtype)
    kw = {"setdlm": dict(D=2), "bd3lm": dict(block_size=4), "mdlm": {}, "ar": {}}[family]
    return Model(backbone, FamilyConfig(family, length=16, mask_token_id=tok.mask_token_id, **kw), tok)


def logits(model: Model) -> torch.Tensor:
    ids = torch.tensor([model.tokenizer.encode("the lazy fox jum")])
    pos = torch.arange(16)[None]
    return model.backbone(ids, pos, causal_mask(torch.ones(1, 16, dtype=torch.bool)))


@pytest.mark.parametrize("family", ["ar", "mdlm", "bd3lm", "setdlm"])
def test_save_load_identical_logits(family, tmp_path):
    m = tiny_model(family)
    m.save(tmp_path / "ck")
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["README.md", "config.json", "model.safetensors",
                                                                   "tokenizer.json", "tokenizer_config.json"]
    back = setdlm.load(tmp_path / "ck")
    assert not back.backbone.training
    assert back.family == m.family and back.backbone.config == m.backbone.config
    assert next(back.backbone.parameters()).dtype == torch.float64
    assert torch.equal(logits(back), logits(m))
    assert back.tokenizer.encode("fox") == m.tokenizer.encode("fox")
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert cfg["architecture"] == m.backbone.config.to_dict() and cfg["family"] == m.family.to_dict()
    assert cfg["tokenizer"]["vocab_size"] == m.tokenizer.vocab_size


def test_ema_weights_and_overwrite(tmp_path):
    m = tiny_model()
    ema = {k: v + 1.0 for k, v in m.backbone.state_dict().items()}
    ckpt.save(tmp_path / "ck", m, ema=ema)
    back = setdlm.load(tmp_path / "ck", ema=True)
    assert all(torch.equal(back.backbone.state_dict()[k], ema[k]) for k in ema)
    m2 = tiny_model(seed=1)
    m2.save(tmp_path / "ck")  # replacing a checkpoint is allowed (atomically)
    assert torch.equal(logits(setdlm.load(tmp_path / "ck")), logits(m2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no temporary folders left
    with pytest.raises(ValueError, match="ema.safetensors: missing"):
        setdlm.load(tmp_path / "ck", ema=True)


def test_refuses_to_overwrite_other_folders(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    with pytest.raises(ValueError, match="refusing to overwrite"):
        tiny_model().save(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "precious"


def test_optimizer_state_roundtrip_bitwise(tmp_path):
    m = tiny_model(dtype=torch.float32)
    opt = torch.optim.AdamW(m.backbone.parameters(), lr=1e-3, betas=(0.9, 0.98))
    for _ in range(2):
        m.backbone(torch.tensor([[1, 2, 3]])).sum().backward()
        opt.step()
    ckpt.save(tmp_path / "ck", m, training_state={"step": 2}, optimizer_state=opt.state_dict())
    state, osd = optim_state.load_training_state(tmp_path / "ck")
    assert state == {"step": 2}
    fresh = torch.optim.AdamW(m.backbone.parameters(), lr=1e-3)
    fresh.load_state_dict(osd)
    ref = opt.state_dict()
    assert fresh.state_dict()["param_groups"] == ref["param_groups"]
    for pid, st in ref["state"].items():
        for k, v in st.items():
            assert torch.equal(fresh.state_dict()["state"][pid][k], v)


@pytest.fixture
def saved(tmp_path):
    m = tiny_model()
    m.save(tmp_path / "ck")
    return tmp_path / "ck"


def test_truncated_weights(saved):
    f = saved / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"model.safetensors: corrupt or truncated safetensors file"):
        setdlm.load(saved)


def test_corrupt_header(saved):
    f = saved / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:16] = b"garbage!"
    f.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model.safetensors: corrupt or truncated"):
        setdlm.load(saved)


def test_nonfinite_weights(saved):
    sd = setdlm.load(saved).backbone.state_dict()
    sd["head.bias"][0] = float("nan")
    save_file({k: v.contiguous() for k, v in sd.items()}, str(saved / "model.safetensors"))
    with pytest.raises(ValueError, match=r"tensor 'head.bias' holds non-finite values"):
        setdlm.load(saved)


def test_weights_do_not_match_config(saved):
    cfg = json.loads((saved / "config.json").read_text())
    cfg["architecture"]["n_layers"] = 3
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"model.safetensors: tensors do not match config.json \(missing \['blocks.2"):
        setdlm.load(saved)
    cfg["architecture"]["n_layers"], cfg["architecture"]["hidden_size"] = 2, 64
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"tensor 'embed.weight' has shape \(\d+, 32\) but config.json implies"):
        setdlm.load(saved)


def test_family_expected(saved):
    assert setdlm.load(saved, family="setdlm").family.family == "setdlm"
    with pytest.raises(ValueError, match=r"config.json: a 'setdlm' model, but a 'ar' model was expected"):
        setdlm.load(saved, family="ar")


def test_bad_configs(saved):
    cfg = json.loads((saved / "config.json").read_text())
    (saved / "config.json").write_text("{oops")
    with pytest.raises(ValueError, match=r"config.json: not valid JSON"):
        setdlm.load(saved)
    bad = dict(cfg, family=dict(cfg["family"], family="gpt"))
    (saved / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"config.json: bad family config: unknown family 'gpt'"):
        setdlm.load(saved)
    bad = dict(cfg, family=dict(cfg["family"], D=8, M=4))
    (saved / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"D=8, M=4"):
        setdlm.load(saved)
    bad = dict(cfg, architecture=dict(cfg["architecture"], n_heads=0))
    (saved / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"config.json: bad architecture: TransformerConfig.n_heads"):
        setdlm.load(saved)
    (saved / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    with pytest.raises(ValueError, match=r"not a setdlm config"):
        setdlm.load(saved)
    (saved / "config.json").unlink()
    with pytest.raises(ValueError, match=r"config.json: missing"):
        setdlm.load(saved)


def test_missing_files(saved, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        setdlm.load(tmp_path / "nowhere")
    (saved / "model.safetensors").rename(tmp_path / "w")
    with pytest.raises(ValueError, match=r"model.safetensors: missing"):
        setdlm.load(saved)
    (tmp_path / "w").rename(saved / "model.safetensors")
    (saved / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"tokenizer.json: missing \(the checkpoint's tokenizer\)"):
        setdlm.load(saved)


def test_vocabulary_mismatch(saved, tmp_path):
    other = char_tokenizer(["abcdefghijklmnopqrstuvwxyz0123456789"])  # a larger vocabulary
    shutil.rmtree(tmp_path / "t", ignore_errors=True)
    other.save(tmp_path / "t")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tmp_path / "t" / name, saved / name)
    with pytest.raises(ValueError, match=r"tokenizer.json: vocabulary of \d+ tokens, but config.json records \d+"):
        setdlm.load(saved)
    cfg = json.loads((saved / "config.json").read_text())
    cfg["tokenizer"]["vocab_size"] = other.vocab_size
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"does not fit the model's vocab_size"):
        setdlm.load(saved)


def test_run_folder_follows_latest(tmp_path):
    m = tiny_model()
    m.save(tmp_path / "run" / "checkpoints" / "step-00000005")
    write_text_atomic(tmp_path / "run" / "latest", "checkpoints/step-00000005\n")
    assert torch.equal(logits(setdlm.load(tmp_path / "run")), logits(m))
    write_text_atomic(tmp_path / "run" / "latest", "checkpoints/step-00000009\n")
    with pytest.raises(ValueError, match=r"latest: points to 'checkpoints/step-00000009'"):
        setdlm.load(tmp_path / "run")


def test_half_precision_weights_on_a_cpu_that_emulates_them_warn(monkeypatch):
    """``dtype="bfloat16"`` on a CPU without AVX512-BF16 or AMX loads, with a warning that it is slower than float32
    there; on one with them (or in float32) nothing is said."""
    import warnings

    import setdlm.formats.loading as loading

    monkeypatch.setattr(loading, "native_bf16", lambda device: False)
    with pytest.warns(UserWarning, match="dtype=bfloat16 on a CPU without AVX512-BF16 or AMX"):
        model = loading.load("arith-ar", dtype="bfloat16")
    assert model.dtype == "bfloat16"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loading.load("arith-ar")
        monkeypatch.setattr(loading, "native_bf16", lambda device: True)
        assert loading.load("arith-ar", dtype=torch.bfloat16).dtype == "bfloat16"
