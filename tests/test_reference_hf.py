"""The authors' Qwen3-based checkpoints (GSM8K: pretrained Qwen3-1.7B-Base; CNN/DM: the Qwen3-0.6B
architecture re-initialised with overrides) through the Hugging Face adapter (docs/method.md §3.2, §5.7).

Their ``AutoModelFromPreTrained`` backbone holds a ``Qwen3ForCausalLM`` as ``backbone.model``, so the saved
keys are ``backbone.model.<transformers key>``; the config names the base model and the overrides only.
Here a tiny random Qwen3 is saved in that layout (``pytorch_model.bin``, tied head dropped as
``save_pretrained`` does), with its base model (config + tokenizer) in a local folder; no network.
"""

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import setdlm  # noqa: E402
from setdlm.cli import main as cli  # noqa: E402
from setdlm.decoding import generate  # noqa: E402
from setdlm.formats.hf import HFBackbone  # noqa: E402
from setdlm.formats.hub import HubUnreachableError  # noqa: E402
from setdlm.objectives import Batch, setdlm_inputs  # noqa: E402
from setdlm.schedules import StaggeredSchedule  # noqa: E402
from support import tiny_tokenizer  # noqa: E402

MASK = "<|fim_middle|>"  # Qwen3's existing token that the authors use as MASK


def tiny_qwen3(tie: bool = True, seed: int = 0, **sizes):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rope_theta=1e6)
    cfg.update(sizes)
    m = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(tie_word_embeddings=tie, **cfg))
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 1)
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return m.eval()


def base_folder(folder: Path, model) -> tuple[Path, int]:
    """The base model's config and tokenizer (what `pretrained_model_name_or_path` names)."""
    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [MASK]})
    model.config.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, tok.convert_tokens_to_ids(MASK)


def reference_folder(folder: Path, model, base: Path | str, mask_id: int, *, prefix: str = "backbone.model.",
                     overrides: dict | None = None, noise: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    sd = {prefix + k: v for k, v in model.state_dict().items()
          if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}
    sd["static_attention_mask"] = torch.ones(4, 4, dtype=torch.bool)
    torch.save(sd, folder / "pytorch_model.bin")
    bb = {"_target_": "backbone_automodel.AutoModelFromPreTrained", "automodel_cls": "CustomQwen3ForCausalLM",
          "pretrained_model_name_or_path": str(base), "keep_bottom_n_layers": -1, "reinit_model": False,
          **(overrides or {})}
    noise = {"_target_": "noise_schedule_noise_schedules.StaggeredNoise", "desired_block_size": 2,
             "max_block_size": 16} if noise is None else noise
    cfg = {"architectures": ["SetDLM"], "length": 16, "block_size": 16, "mask_token_id": mask_id,
           "backbone_config": bb, "noise_config": noise}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def two_stream_logits(backbone, mask_id: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    L = 16
    ids = torch.randint(3, 63, (2, L), generator=g)
    valid = torch.arange(L)[None] < torch.tensor([[16], [11]])
    batch = Batch(ids, valid, torch.arange(L)[None] < torch.tensor([[3], [0]]))
    inp = setdlm_inputs(batch, StaggeredSchedule.from_dm(L, 2, 4).sample_order(batch.targets, generator=g), mask_id)
    with torch.no_grad():
        return backbone(inp.input_ids, inp.position_ids, inp.attn_mask)  # (2, 2L, V)


@pytest.fixture
def gsm8k(tmp_path):
    m = tiny_qwen3()
    base, mask_id = base_folder(tmp_path / "Qwen3-base", m)
    return m, base, mask_id


@pytest.mark.parametrize("prefix", ["backbone.model.", "backbone."])
def test_qwen3_layout_loads_exactly(tmp_path, gsm8k, prefix):
    """setdlm.load detects the layout, rebuilds the Qwen3 from its base config, ties the head, takes the
    tokenizer from the base model with <|fim_middle|> as MASK, and D/M the authors' way; logits under the
    two-stream mask equal the original model's bit for bit."""
    m, base, mask_id = gsm8k
    ref = reference_folder(tmp_path / "setdlm-gsm8k-smax4", m, base, mask_id, prefix=prefix)
    model = setdlm.load(ref)
    assert isinstance(model.backbone, HFBackbone) and model.backbone.kind == "qwen3"
    assert model.backbone.hf.lm_head.weight is model.backbone.hf.model.embed_tokens.weight
    assert (model.family.family, model.family.length, model.family.D, model.family.M) == ("setdlm", 16, 2, 4)
    assert model.family.mask_token_id == model.tokenizer.mask_token_id == mask_id == 63
    assert model.tokenizer.encode("w0 w5") == [3, 8]
    ours, theirs = two_stream_logits(model.backbone, mask_id), two_stream_logits(HFBackbone(m), mask_id)
    assert torch.equal(ours, theirs)


def test_cnndm_overrides_untied_head_and_name(tmp_path):
    """CNN/DM: the base config with the run's overrides (layers, width) and an untied head; D from the
    name (smax8 → D = 4, M = 8) when the noise config does not give it."""
    m = tiny_qwen3(tie=False, hidden_size=48, intermediate_size=96, num_hidden_layers=1)
    base, mask_id = base_folder(tmp_path / "Qwen3-0.6B-Base", tiny_qwen3(num_hidden_layers=3))
    ref = reference_folder(tmp_path / "cnndm-setdlm-smax8", m, base, mask_id, noise={},
                           overrides={"reinit_model": True, "num_hidden_layers": 1, "hidden_size": 48,
                                      "intermediate_size": 96})
    model = setdlm.load(ref)
    cfg = model.backbone.hf.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.tie_word_embeddings) == (1, 48, 96, False)
    assert (model.family.D, model.family.M) == (4, 8)
    assert torch.equal(two_stream_logits(model.backbone, mask_id), two_stream_logits(HFBackbone(m), mask_id))


@pytest.mark.parametrize("edit, message", [
    (lambda sd: sd.pop("backbone.model.model.layers.1.mlp.up_proj.weight"),
     "missing key 'backbone.model.model.layers.1.mlp.up_proj.weight'"),
    (lambda sd: sd.update({"backbone.model.model.layers.0.self_attn.gate.weight": torch.zeros(2)}),
     "unknown key 'backbone.model.model.layers.0.self_attn.gate.weight'"),
    (lambda sd: sd.update({"backbone.model.model.layers.0.self_attn.q_norm.weight": torch.ones(8)}),
     r"wrong shape for 'backbone.model.model.layers.0.self_attn.q_norm.weight': expected \[16\], got \[8\]"),
    (lambda sd: sd.update({"optimizer.step": torch.zeros(1)}), "unknown key 'optimizer.step'"),
])
def test_qwen3_errors_name_the_key(tmp_path, gsm8k, edit, message):
    m, base, mask_id = gsm8k
    ref = reference_folder(tmp_path / "setdlm-gsm8k-smax4", m, base, mask_id)
    sd = torch.load(ref / "pytorch_model.bin", weights_only=True)
    edit(sd)
    torch.save(sd, ref / "pytorch_model.bin")
    with pytest.raises(ValueError, match=message):
        setdlm.load(ref)


def test_convert_cli_then_decode(tmp_path, gsm8k):
    """`setdlm convert` writes an HF-backbone setdlm checkpoint that loads to the same logits and decodes
    the same tokens as the checkpoint loaded directly."""
    m, base, mask_id = gsm8k
    ref = reference_folder(tmp_path / "setdlm-gsm8k-smax4", m, base, mask_id)
    assert cli(["convert", "--from-reference", str(ref), str(tmp_path / "ours")]) == 0
    cfg = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert cfg["backbone"] == "hf" and cfg["architecture"]["model_type"] == "qwen3"
    assert cfg["source"]["name"] == str(ref) and cfg["family"]["M"] == 4
    direct, converted = setdlm.load(ref), setdlm.load(tmp_path / "ours")
    assert torch.equal(two_stream_logits(direct.backbone, mask_id), two_stream_logits(converted.backbone, mask_id))
    outs = [generate(x, ["w1 w2 w3", "w7"], max_new_tokens=6, window=2) for x in (direct, converted)]
    assert outs[0].tokens == outs[1].tokens and outs[0].nfe == outs[1].nfe == 6


def test_base_hub_id_offline_says_what_to_do(tmp_path, gsm8k, no_network):
    m, _, mask_id = gsm8k
    ref = reference_folder(tmp_path / "setdlm-gsm8k-smax4", m, "Qwen/Qwen3-1.7B-Base", mask_id)
    with pytest.raises(HubUnreachableError, match=r"base model.*needs network access.*base=DIR"):
        setdlm.load(ref)
    assert cli(["convert", "--from-reference", str(ref), str(tmp_path / "out")]) == 2  # one line, no traceback
