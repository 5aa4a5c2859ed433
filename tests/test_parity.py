"""Numerical parity with the authors' implementation on the reference-dit-tiny fixture (docs/method.md §3.1, §2.3–2.5).

Reference values were computed by the authors' code in float32 on CPU; NLLs, losses and logits must agree
within 1e-4 absolute, inputs and masks exactly. Every check runs on each way of reaching the weights
(``reference_sources.SOURCES``: the fixture folder, auto-detection in ``setdlm.load``, the ``setdlm convert``
CLI, the released Hub layout with ``pytorch_model.bin``).
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import setdlm
from setdlm.formats.convert import convert_reference_state_dict, infer_D, reference_configs
from setdlm.masks import describe
from setdlm.objectives import Batch, log_probs, setdlm_inputs, setdlm_loss

from support.reference_sources import SOURCES, copy_fixture, reference_model, tokenizer_folder

FIX = Path(__file__).parent / "fixtures" / "reference-dit-tiny"
EXP = json.loads((FIX / "expected.json").read_text())


@pytest.fixture(scope="module", params=SOURCES)
def ref(request, tmp_path_factory):
    return reference_model(request.param, tmp_path_factory.mktemp(request.param))


def test_config_and_schedule(ref):
    model, fam = ref
    c = model.config
    assert (c.vocab_size, c.hidden_size, c.n_heads, c.n_layers, c.mlp_ratio) == (64, 32, 2, 2, 4)
    assert (fam.family, fam.length, fam.D, fam.M, fam.mask_token_id) == ("setdlm", 16, 2, 4, 63)
    s = fam.schedule()
    sch = EXP["setdlm_schedule"]
    assert s.b == pytest.approx(sch["b"], abs=1e-12) and s.k == pytest.approx(sch["k"], abs=1e-12)
    assert torch.allclose(s.loc, torch.tensor(sch["loc"], dtype=torch.float64), atol=1e-12)


def _case():
    case = EXP["setdlm_loss_A_full"]
    inp = case["inputs"]
    batch = Batch(torch.tensor(inp["input_ids"]), torch.tensor(inp["attention_mask"]).bool(),
                  torch.tensor(inp["context_mask"]).bool())
    return case, batch, torch.tensor(inp["permutation"])


def test_two_stream_input_and_mask_exact(ref):
    model, fam = ref
    case, batch, order = _case()
    inp = setdlm_inputs(batch, order, fam.mask_token_id)
    assert inp.input_ids.tolist() == case["backbone_input_ids"]
    assert inp.position_ids.tolist() == case["backbone_position_ids"]
    for b in range(2):
        assert describe(inp.attn_mask[b, 0]) == case["allowed_mask_rows"][b]
    assert inp.clean.tolist() == case["target_by_rank"]


def test_loss_nlls_and_logits(ref):
    model, fam = ref
    case, batch, order = _case()
    with torch.no_grad():
        out = setdlm_loss(model, batch, fam.mask_token_id, order=order)
        inp = setdlm_inputs(batch, order, fam.mask_token_id)
        logits = model(inp.input_ids, inp.position_ids, inp.attn_mask)  # (B, 2L, V)
    L = 16
    assert abs(out.loss.item() - case["loss"]) < 1e-4
    nll_by_rank = out.nll.gather(1, order)
    assert (nll_by_rank - torch.tensor(case["nll_by_rank"])).abs().max() < 1e-4
    q = torch.tensor(case["first_query_raw_logits"])  # (B, n, V)
    n = q.shape[1]
    assert (logits[:, L:L + n] - q).abs().max() < 1e-4
    lp, ref_lp = log_probs(logits[:, L:L + n], 63), torch.tensor(case["first_query_log_probs"])
    assert (lp[..., :63] - ref_lp[..., :63]).abs().max() < 1e-4
    assert torch.all(lp[..., 63] == float("-inf")) and torch.all(ref_lp[..., 63] <= -1e11)  # MASK never predicted
    c = torch.tensor(case["first_clean_raw_logits"])
    assert (logits[:, :c.shape[1]] - c).abs().max() < 1e-4


def test_bad_state_dicts_name_the_key():
    mc, _ = reference_configs(json.loads((FIX / "config.json").read_text()))
    sd = load_file(str(FIX / "setdlm_tiny.safetensors"))
    missing = {k: v for k, v in sd.items() if k != "backbone.blocks.1.attn_out.weight"}
    with pytest.raises(ValueError, match="missing key 'backbone.blocks.1.attn_out.weight'"):
        convert_reference_state_dict(missing, mc)
    extra = dict(sd, **{"backbone.blocks.0.attn_out.bias": torch.zeros(32)})
    with pytest.raises(ValueError, match="unknown key 'backbone.blocks.0.attn_out.bias'"):
        convert_reference_state_dict(extra, mc)
    wrong = dict(sd, **{"backbone.output_layer.linear.bias": torch.zeros(65)})
    with pytest.raises(ValueError, match=r"wrong shape for 'backbone.output_layer.linear.bias': expected \[64\], got \[65\]"):
        convert_reference_state_dict(wrong, mc)
    ada = dict(sd, **{"backbone.blocks.0.adaLN_modulation.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="adaLN"):
        convert_reference_state_dict(ada, mc)


def test_infer_D_from_names():
    assert infer_D("kuleshov-group/lm1b-setdlm-smax8") == 4
    assert infer_D("owt-setdlm-smax16") == 8
    assert infer_D("run_tgt16_x") == 16
    assert infer_D("setdlm-d4") == 4
    assert infer_D("kuleshov-group/owt-ar") is None


@pytest.mark.parametrize("edit, message", [
    (lambda sd: sd.pop("backbone.blocks.0.mlp.2.bias"), "missing key 'backbone.blocks.0.mlp.2.bias'"),
    (lambda sd: sd.update({"backbone.extra.weight": torch.zeros(2)}), "unknown key 'backbone.extra.weight'"),
    (lambda sd: sd.update({"backbone.blocks.1.norm2.weight": torch.ones(33)}),
     r"wrong shape for 'backbone.blocks.1.norm2.weight': expected \[32\], got \[33\]"),
])
def test_bad_reference_folders_name_the_key(tmp_path, edit, message):
    """Through setdlm.load and the convert CLI, a broken folder in the authors' layout names the key."""
    from safetensors.torch import save_file

    folder = copy_fixture(tmp_path / "ref")
    sd = load_file(str(folder / "setdlm_tiny.safetensors"))
    edit(sd)
    save_file(sd, str(folder / "setdlm_tiny.safetensors"))
    tok = tokenizer_folder(tmp_path / "tok")
    with pytest.raises(ValueError, match=message):
        setdlm.load(folder, tokenizer=str(tok))
    from setdlm.cli import main as cli

    assert cli(["convert", "--from-reference", str(folder), str(tmp_path / "out"), "--tokenizer", str(tok)]) == 2
    assert not (tmp_path / "out").exists()


def test_detection_and_schedule_overrides(tmp_path):
    """setdlm.load tells the layouts apart; D/M overrides rebuild the schedule; errors are clear."""
    tok = str(tokenizer_folder(tmp_path / "tok"))
    m = setdlm.load(FIX, tokenizer=tok, D=4)
    assert (m.family.D, m.family.M) == (4, 8)
    assert setdlm.load(FIX, tokenizer=tok, D=1, M=4).family.M == 4
    assert setdlm.load(FIX).tokenizer is None  # weights usable with token ids; convert needs a tokenizer
    with pytest.raises(ValueError, match="drop ema=True"):
        setdlm.load(FIX, ema=True)
    with pytest.raises(ValueError, match="a 'setdlm' model, but a 'ar' model was expected"):
        setdlm.load(FIX, family="ar")
    m.save(tmp_path / "ours")
    with pytest.raises(ValueError, match=r"apply only to the authors' layout"):
        setdlm.load(tmp_path / "ours", D=2)
    from setdlm.cli import main as cli

    assert cli(["convert", "--from-reference", str(tmp_path / "ours"), str(tmp_path / "x")]) == 2  # not theirs
    assert cli(["convert", "--from-reference", str(FIX), str(tmp_path / "y")]) == 2  # no tokenizer
