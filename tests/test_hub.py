"""Checkpoints of Hugging Face backbones, loading by Hub id, pushing, and the model card (setdlm.formats.hub).

The Hub itself cannot be reached here: Hub ids are exercised through huggingface_hub's real offline path
(a repo already in the HF cache loads; one that is not gives the clear network error), and pushing
offline must fail clearly after the local checkpoint is written.
"""

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

import setdlm  # noqa: E402
from setdlm import FamilyConfig, Model  # noqa: E402
from setdlm.errors import as_flags  # noqa: E402
from setdlm.formats.hf import HFBackbone, adapt, setdlm_tokenizer  # noqa: E402
from setdlm.formats.card import bench_table, model_card  # noqa: E402
from setdlm.formats.hub import HubUnreachableError, is_hub_id  # noqa: E402
from setdlm.masks import causal_mask  # noqa: E402
from setdlm.objectives import Batch, compute_loss  # noqa: E402
from support import tiny_hf, tiny_tokenizer  # noqa: E402


def hf_model(kind: str, family: str = "setdlm", tie: bool | None = None) -> Model:
    tok = tiny_tokenizer()
    m = tiny_hf(kind, vocab=len(tok), dtype=torch.float32)
    if tie is not None and kind != "gpt2":
        m.config.tie_word_embeddings = tie
        if tie:
            m.tie_weights()
    backbone, mask_id = adapt(m, tok)
    fam = FamilyConfig(family, length=16, mask_token_id=mask_id, D=2, block_size=4)
    return Model(backbone, fam, setdlm_tokenizer(tok))


def logits(model: Model) -> torch.Tensor:
    ids = torch.tensor([[3, 9, 4, 27, 5, 61]])
    with torch.no_grad():
        return model.backbone(ids, None, causal_mask(torch.ones(1, 6, dtype=torch.bool)))


@pytest.mark.parametrize("kind, tie", [("llama", False), ("qwen3", True), ("gpt2", None)])
def test_hf_backbone_checkpoint_roundtrip(tmp_path, kind, tie):
    """Model.save / setdlm.load for an HF backbone: same architecture, tied weights stay tied (stored once),
    identical logits and loss, tokenizer with its MASK token, EMA weights too."""
    model = hf_model(kind, tie=tie)
    ema = {k: v + 0.5 for k, v in model.backbone.state_dict().items()}
    model.save(tmp_path / "ck", ema=ema)
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert cfg["backbone"] == "hf" and cfg["architecture"]["model_type"] == kind
    back = setdlm.load(tmp_path / "ck")
    assert isinstance(back.backbone, HFBackbone) and not back.backbone.training
    assert torch.equal(logits(back), logits(model))
    head, embed = back.backbone.hf.get_output_embeddings().weight, back.backbone.hf.get_input_embeddings().weight
    assert (head is embed) == (model.backbone.hf.get_output_embeddings().weight is
                               model.backbone.hf.get_input_embeddings().weight)
    assert back.tokenizer.mask_token_id == model.family.mask_token_id == 63 and back.tokenizer.vocab_size == 64
    ids = torch.randint(3, 63, (2, 16), generator=torch.Generator().manual_seed(0))
    batch = Batch(ids, torch.ones_like(ids, dtype=torch.bool))
    losses = [compute_loss(x.backbone, x.family, batch, train=False, generator=torch.Generator().manual_seed(1)).loss
              for x in (model, back)]
    assert torch.equal(*losses)
    with_ema = setdlm.load(tmp_path / "ck", ema=True)
    assert torch.equal(with_ema.backbone.hf.lm_head.weight, model.backbone.hf.lm_head.weight + 0.5)


def test_model_card(tmp_path):
    model = hf_model("qwen3")
    bench = [{"model": "SetDLM S≤4", "nelbo": 3.21, "tokens/s": 812.0}, {"model": "AR", "nelbo": 3.05}]
    model.save(tmp_path / "ck", training_args={"data": "hf:roneneldan/TinyStories", "steps": 100, "lr": 1e-4,
                                               "init_from": "Qwen/Qwen3-0.6B-Base"}, bench=bench)
    card = (tmp_path / "ck" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: setdlm\n") and "datasets:\n- roneneldan/TinyStories\n" in card
    assert "| family | `setdlm` |" in card and "L = 16, D = 2" in card and "M = 4" in card
    assert "Hugging Face `qwen3` causal LM" in card and "| init_from | `Qwen/Qwen3-0.6B-Base` |" in card
    assert "| model | nelbo | tokens/s |\n|---|---|---|\n| SetDLM S≤4 | 3.21 | 812 |\n| AR | 3.05 |  |" in card
    assert bench_table({"accuracy": 0.5}) == "| metric | value |\n|---|---|\n| accuracy | 0.5 |"
    assert bench_table("| a |\n|---|") == "| a |\n|---|"
    with pytest.raises(ValueError, match="bench must be"):
        bench_table([1, 2])
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert model_card(cfg, repo_id="me/tiny").split("\n# ")[1].startswith("me/tiny")
    # a model trained here records its command; a converted one where it came from
    made = model_card({**cfg, "source": {"name": "study run x", "command": "setdlm train --out x"}})
    assert "| made by | study run x: `setdlm train --out x` |" in made and "converted from" not in made
    conv = model_card({**cfg, "source": {"name": "kuleshov-group/a", "layout": "reference"}})
    assert "| converted from | kuleshov-group/a (reference) |" in conv


def _cache_repo(cache, repo_id: str, folder) -> None:
    """Put ``folder`` into an HF cache as the snapshot of ``repo_id`` (the layout huggingface_hub writes)."""
    commit = "1" * 40
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)


def test_load_hub_id_offline(tmp_path, no_network):
    """setdlm.load("user/repo"): from the HF cache when offline; a clear error when it is not cached."""
    model = hf_model("llama")
    model.save(tmp_path / "ck")
    _cache_repo(no_network, "someone/tiny-setdlm", tmp_path / "ck")
    back = setdlm.load("someone/tiny-setdlm")
    assert torch.equal(logits(back), logits(model))
    with pytest.raises(HubUnreachableError, match="needs network access.*local folder"):
        setdlm.load("someone/not-cached")
    assert is_hub_id("kuleshov-group/owt-setdlm-smax16") and not is_hub_id("./runs/x") and not is_hub_id("a/b/c")


def test_push_to_hub_offline(tmp_path, no_network):
    """save(..., push_to_hub=...) writes the folder, then says that pushing needs network."""
    model = hf_model("gpt2", family="ar")
    with pytest.raises(HubUnreachableError, match="needs network access.*saved locally"):
        model.save(tmp_path / "ck", push_to_hub="me/tiny-ar")
    assert setdlm.load(tmp_path / "ck").family.family == "ar"
    assert "# me/tiny-ar" in (tmp_path / "ck" / "README.md").read_text()
    with pytest.raises(ValueError, match="needs a Hub repo id"):
        model.save(tmp_path / "ck2", push_to_hub="not a repo")


def test_plain_hf_folder_is_refused_with_a_hint(tmp_path):
    m = tiny_hf("llama", dtype=torch.float32)
    m.save_pretrained(tmp_path / "hf")
    with pytest.raises(ValueError, match="Hugging Face causal LM.*train from it with init_from") as e:
        setdlm.load(tmp_path / "hf")
    assert as_flags(e.value).endswith("train from it with --init-from")  # the command line's words
