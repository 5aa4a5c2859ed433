"""`setdlm train --init-from`: start any family from a Hugging Face causal LM (local folder; a Hub id needs
network) or from a setdlm checkpoint, e.g. our own AR model adapted into a SetDLM (docs/method.md §2.9)."""

import json
import random

import pytest
import torch

import setdlm
from setdlm.cli import main as cli
from setdlm.training import TrainConfig, train
from support import tiny_hf, tiny_tokenizer, write_hamlet

transformers = pytest.importorskip("transformers")

RUN = ["--length", "16", "--batch-size", "4", "--eval-every", "0", "--save-every", "0", "--log-every", "1",
       "--eval-max", "8", "--eval-batch-size", "4"]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny Llama and its tokenizer (no MASK token) saved with save_pretrained; a corpus in its words."""
    root = tmp_path_factory.mktemp("hf")
    tok = tiny_tokenizer()
    m = tiny_hf("llama", vocab=len(tok), dtype=torch.float32)
    m.save_pretrained(root / "llama")
    tok.save_pretrained(root / "llama")
    rng = random.Random(0)
    (root / "words.txt").write_text("\n\n".join(" ".join(f"w{rng.randrange(60)}" for _ in range(40))
                                                for _ in range(30)), encoding="utf-8")
    return root


def _weights_close(a: torch.nn.Module, b: dict, atol: float) -> bool:
    """Every tensor of ``b`` in ``a`` (rows beyond ``b``'s, i.e. an added MASK embedding, ignored)."""
    sa = a.state_dict()
    return all(torch.allclose(sa[k][:len(v)].double(), v.double(), atol=atol, rtol=0) for k, v in b.items())


def test_init_from_hf_folder_trains_and_resumes(hf_folder, tmp_path):
    """An HF folder offline: the run starts from its weights (a vanishing learning rate leaves them in
    place), adds <|mask|> to its tokenizer, checkpoints an HF backbone, and resumes bitwise."""
    src = hf_folder / "llama"
    common = ["train", "--init-from", str(src), "--data", str(hf_folder / "words.txt"), "--family", "setdlm",
              "--D", "2", *RUN]
    assert cli([*common, "--out", str(tmp_path / "still"), "--steps", "2", "--lr", "1e-12"]) == 0
    still = setdlm.load(tmp_path / "still")
    original = transformers.AutoModelForCausalLM.from_pretrained(src)
    assert _weights_close(still.backbone.hf, original.state_dict(), atol=1e-8)
    assert still.tokenizer.mask_token_id == still.family.mask_token_id == 63 and still.tokenizer.vocab_size == 64
    assert still.tokenizer.encode("w0 w1") == [3, 4] and still.backbone.vocab_size == 64
    cfg = json.loads((tmp_path / "still" / "checkpoints" / "step-00000002" / "config.json").read_text())
    assert cfg["backbone"] == "hf" and cfg["training"]["init_from"] == str(src)

    assert cli([*common, "--out", str(tmp_path / "a"), "--steps", "3"]) == 0  # uninterrupted
    assert cli([*common, "--out", str(tmp_path / "b"), "--steps", "2"]) == 0
    assert cli(["train", "--out", str(tmp_path / "b"), "--resume", "--steps", "3"]) == 0
    a, b = setdlm.load(tmp_path / "a"), setdlm.load(tmp_path / "b")
    assert all(torch.equal(x, y) for x, y in zip(a.backbone.state_dict().values(), b.backbone.state_dict().values()))
    assert not _weights_close(a.backbone.hf, original.state_dict(), atol=1e-6)  # it did train


def test_ar_checkpoint_adapted_into_setdlm(tmp_path):
    """The adaptation recipe: our AR run → --init-from it as a SetDLM. Architecture, tokenizer and weights
    come from the AR checkpoint (the preset's sizes are replaced and recorded), the family is new."""
    data = write_hamlet(tmp_path / "hamlet.txt", 6000)
    ar = TrainConfig(out=str(tmp_path / "ar"), data=data, family="ar", length=32, hidden_size=48, n_layers=2,
                     n_heads=2, steps=3, batch_size=8, eval_every=0, save_every=0, eval_max=8)
    train(ar)
    assert cli(["train", "--init-from", str(tmp_path / "ar"), "--out", str(tmp_path / "set"), "--family", "setdlm",
                "--D", "4", "--data", data, "--length", "32", "--steps", "2", "--lr", "1e-12", "--batch-size", "8",
                "--eval-every", "0", "--save-every", "0", "--eval-max", "8"]) == 0
    src, dst = setdlm.load(tmp_path / "ar"), setdlm.load(tmp_path / "set")
    assert (dst.family.family, dst.family.D, dst.family.M) == ("setdlm", 4, 8)
    assert dst.backbone.config == src.backbone.config and dst.backbone.config.hidden_size == 48
    assert dst.tokenizer.to_json() == src.tokenizer.to_json()
    assert _weights_close(dst.backbone, src.backbone.state_dict(), atol=1e-8)
    training = json.loads((tmp_path / "set" / "checkpoints" / "step-00000002" / "config.json").read_text())["training"]
    assert training["hidden_size"] == 48 and training["init_from"] == str(tmp_path / "ar")


def test_init_from_errors(tmp_path, no_network, capsys):
    assert cli(["train", "--init-from", str(tmp_path / "missing"), "--out", str(tmp_path / "r"), *RUN]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert cli(["train", "--init-from", "someone/tiny-llama", "--out", str(tmp_path / "r"), *RUN]) == 2
    assert "needs network access" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
