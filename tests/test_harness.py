"""The lm-evaluation-harness adapter (setdlm.evaluation.harness) through lm-eval's own API objects: ``Instance``
requests, the model registry, and ``simple_evaluate`` on small local tasks (generate_until and
multiple_choice). Skipped when lm-eval is not installed (the ``test`` extra installs it)."""

import json

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402

from setdlm import FamilyConfig, Model  # noqa: E402
from setdlm.data import char_tokenizer  # noqa: E402
from setdlm.decoding import DecodeSettings, generate  # noqa: E402
from setdlm.evaluation.likelihood import bound_generator  # noqa: E402
from setdlm.evaluation.harness import PAPER_INSTRUCTION, SetDLMLM, boxed_to_hashes, paper_user_turn  # noqa: E402
from setdlm.objectives import Batch, compute_loss, log_probs, setdlm_inputs  # noqa: E402

from support import make_model  # noqa: E402

TEXT = "the cat sat on the mat. a dog ran to the cat.\n0123456789 +-=?"
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A tiny random AR and SetDLM (D = 2) with a character tokenizer, saved as setdlm checkpoints."""
    root = tmp_path_factory.mktemp("harness")
    tok = char_tokenizer([TEXT])
    out = {}
    for i, family in enumerate(("ar", "setdlm")):
        backbone = make_model(vocab=tok.vocab_size, hidden=32, heads=2, layers=2, seed=i, dtype=torch.float64)
        with torch.no_grad():
            backbone.head.weight.mul_(3)
        fam = FamilyConfig(family, length=32, mask_token_id=tok.mask_token_id, D=2)
        Model(backbone, fam, tok).save(root / family)
        out[family] = str(root / family)
    return out


def lm(path: str, **kw) -> SetDLMLM:
    args = ",".join(f"{k}={v}" for k, v in {"pretrained": path, **kw}.items())
    return get_model("setdlm").create_from_arg_string(args, {"device": "cpu"})


def requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


PAIRS = [("the cat", " sat"), ("a dog ran to", " the mat."), ("", "the cat"), ("0123", "45")]


def test_registry_and_model_args(checkpoints):
    model = lm(checkpoints["setdlm"], window=2, threshold=0.9, samples=3, cache_order="reveal")
    assert isinstance(model, SetDLMLM) and get_model("setdlm") is SetDLMLM
    assert model.decode_kw == {"window": 2, "threshold": 0.9, "block_size": None, "cache_order": "reveal"}
    assert model.samples == 3 and model.L == 32 and model.batch_size == 1
    direct = SetDLMLM(checkpoints["setdlm"], settings=DecodeSettings(window=2, threshold=0.9, cache_order="reveal",
                                                                     max_new_tokens=7), device="cpu")
    assert direct.decode_kw == model.decode_kw and direct.max_new_tokens == 7 and model.max_new_tokens == 256
    with pytest.raises(ValueError, match="give settings= or the keyword settings"):
        SetDLMLM(checkpoints["setdlm"], settings=DecodeSettings(window=2), threshold=0.9, device="cpu")
    with pytest.raises(ValueError, match="unknown setdlm model_args: windw"):
        lm(checkpoints["setdlm"], windw=2)
    with pytest.raises(ValueError, match="samples must be a positive integer"):
        lm(checkpoints["setdlm"], samples=0)


def test_loglikelihood_ar_is_exact(checkpoints):
    """AR: log p(continuation | BOS + context) and greedy flags equal a direct causal forward."""
    model = lm(checkpoints["ar"], batch_size=3)
    got = model.loglikelihood(requests("loglikelihood", PAIRS))
    m = model.model
    for (ctx, cont), (ll, greedy) in zip(PAIRS, got):
        c, t = model._pair(ctx, cont)
        ids = torch.tensor([c + t])
        with torch.no_grad():
            causal = torch.ones(1, 1, ids.shape[1], ids.shape[1]).tril().bool()
            lp = log_probs(m.backbone(ids, torch.arange(ids.shape[1])[None], causal), m.family.mask_token_id)[0]
        rows = torch.arange(len(c) - 1, len(c) + len(t) - 1)
        ref = lp[rows, torch.tensor(t)]
        assert ll == pytest.approx(float(ref.sum()), abs=1e-9)
        assert greedy == bool((lp[rows].argmax(-1) == torch.tensor(t)).all())
    assert c[0] == m.tokenizer.bos_token_id  # the context starts with BOS, as in training
    (alone, g), = model.loglikelihood(requests("loglikelihood", PAIRS[:1]))  # batch of 1 == batch of 3
    assert alone == pytest.approx(got[0][0], abs=1e-12) and g == got[0][1]


def test_loglikelihood_setdlm_is_the_bound(checkpoints):
    """SetDLM: the any-order bound of the continuation with the context first in the order (the value
    compute_loss gives on the padded batch with the same generator), greedy under that order; more
    importance samples average more orders."""
    model = lm(checkpoints["setdlm"], seed=7)
    m = model.model
    (ll, greedy), = model.loglikelihood(requests("loglikelihood", PAIRS[1:2]))
    c, t = model._pair(*PAIRS[1])
    n = len(c) + len(t)
    ids = torch.full((1, 32), model._pad)
    ids[0, :n] = torch.tensor(c + t)
    batch = Batch(ids, torch.arange(32)[None] < n, torch.arange(32)[None] < len(c))
    with torch.no_grad():
        out = compute_loss(m.backbone, m.family, batch, train=False, generator=bound_generator(7, 0, 0))
    assert ll == pytest.approx(-float(out.nll.sum()), abs=1e-9) and int(out.mask.sum()) == len(t)
    order = m.family.schedule().sample_order(batch.targets, generator=bound_generator(7, 0, 0))
    assert order[0, :len(c)].tolist() == list(range(len(c)))  # the context is revealed first
    inp = setdlm_inputs(batch, order, m.family.mask_token_id)
    with torch.no_grad():
        lp = log_probs(m.backbone(inp.input_ids, inp.position_ids, inp.attn_mask, logits_start=32),
                       m.family.mask_token_id)[0]
    assert greedy == bool((lp.argmax(-1) == inp.clean[0])[inp.targets[0]].all())
    (ll3, _), = lm(checkpoints["setdlm"], seed=7, samples=3).loglikelihood(requests("loglikelihood", PAIRS[1:2]))
    assert ll3 != ll and ll3 < 0
    (empty, g), = model.loglikelihood(requests("loglikelihood", [("the cat", "")]))
    assert empty == 0.0 and g


def test_loglikelihood_rolling(checkpoints):
    """AR: the rolling log-likelihood of a text longer than L is the sum of its disjoint windows' exact
    log-probabilities (BOS, then the last token before each window as its context)."""
    model = lm(checkpoints["ar"])
    text = TEXT + " " + TEXT
    (total,) = model.loglikelihood_rolling(requests("loglikelihood_rolling", [(text,)]))
    ids = model.tok_encode(text)
    bos = model.model.tokenizer.bos_token_id
    windows = [([bos] + ids[:s], ids[s:s + 31]) for s in range(0, len(ids), 31)]
    assert total == pytest.approx(sum(ll for ll, _ in model._score(windows, True)), abs=1e-9)
    assert len(windows) == 4 and total < 0


@pytest.mark.parametrize("family, kw", [("setdlm", {"window": 2, "threshold": 0.5}), ("ar", {})])
def test_generate_until_uses_the_decoders(checkpoints, family, kw):
    """generate_until == setdlm.decoding.generate with the same window/threshold, the request's stop
    strings and token budget; batching the requests changes nothing."""
    ctxs = ["the cat", "a dog ran", "0123"]
    gen = {"until": ["."], "max_gen_toks": 12, "do_sample": False}
    reqs = requests("generate_until", [(c, gen) for c in ctxs])
    got = lm(checkpoints[family], batch_size=2, **kw).generate_until(reqs)
    single = lm(checkpoints[family], batch_size=1, **kw)
    assert got == single.generate_until(reqs)
    m = single.model
    for c, text in zip(ctxs, got):
        ref = generate(m, [single._context(c)], max_new_tokens=12, stop=["."], seed=1234, **kw)
        assert text == ref.texts[0] and "." not in text


def test_paper_gsm8k_prompt_and_boxed_answers(checkpoints, tmp_path):
    """gsm8k_paper: the user turn becomes the paper's instruction + the bare question, the chat template is
    rendered (thinking on), and a boxed answer is rewritten for the task's `#### n` extractor."""
    pytest.importorskip("transformers")
    assert boxed_to_hashes("so $\\boxed{1,234}$.") == "so $\\boxed{1,234}$. #### 1234"
    assert boxed_to_hashes("no answer") == "no answer"
    assert paper_user_turn("Question: What is 2+2?\nAnswer:") == PAPER_INSTRUCTION + "What is 2+2?"
    import setdlm

    m = setdlm.load(checkpoints["setdlm"])
    m.tokenizer.chat_template = CHATML
    m.save(tmp_path / "chat")
    model = lm(str(tmp_path / "chat"), gsm8k_paper=True)
    prompt = model.apply_chat_template([{"role": "user", "content": "Question: What is 2+2?\nAnswer:"}])
    assert prompt == f"<|im_start|>user\n{PAPER_INSTRUCTION}What is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>"
    assert model.chat_template() == CHATML and model.boxed
    with pytest.raises(ValueError, match="no chat template"):
        lm(checkpoints["setdlm"]).apply_chat_template([{"role": "user", "content": "hi"}])


def test_simple_evaluate_on_local_tasks(checkpoints, tmp_path):
    """lm-eval end to end (its task loading, request building, filters and metrics) on two tiny local
    tasks: a generate_until task scored by exact match and a multiple-choice task scored by accuracy."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    data = tmp_path / "data.jsonl"
    docs = [{"question": "the cat", "answer": "x", "choices": [" sat", " dog"], "label": 0},
            {"question": "a dog", "answer": "y", "choices": [" ran", " mat"], "label": 1}]
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    common = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n" \
             "doc_to_text: '{{question}}'\n"
    (tmp_path / "gen.yaml").write_text("task: setdlm_tiny_gen\n" + common + "output_type: generate_until\n"
                                       "doc_to_target: '{{answer}}'\ngeneration_kwargs:\n  until: ['.']\n"
                                       "  max_gen_toks: 6\nmetric_list:\n  - metric: exact_match\n")
    (tmp_path / "mc.yaml").write_text("task: setdlm_tiny_mc\n" + common + "output_type: multiple_choice\n"
                                      "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\n"
                                      "metric_list:\n  - metric: acc\n")
    tasks = TaskManager(include_path=str(tmp_path), include_defaults=False)
    res = simple_evaluate(model="setdlm", model_args=f"pretrained={checkpoints['setdlm']},window=2",
                          tasks=["setdlm_tiny_gen", "setdlm_tiny_mc"], task_manager=tasks, batch_size=2,
                          device="cpu", log_samples=True)
    assert res["results"]["setdlm_tiny_gen"]["exact_match,none"] in (0.0, 0.5, 1.0)
    assert res["results"]["setdlm_tiny_mc"]["acc,none"] in (0.0, 0.5, 1.0)
    sample = res["samples"]["setdlm_tiny_mc"][0]
    assert len(sample["resps"]) == 2 and all(r[0][0] < 0 for r in sample["resps"])  # one bound per choice


@pytest.mark.slow
def test_module_runs_lm_evals_command_line(checkpoints, tmp_path):
    """`python -m setdlm.evaluation.harness run --model setdlm ...` (lm-eval's CLI with the model registered), the way to
    call the harness from the shell with lm-eval releases that predate plugin discovery."""
    import subprocess
    import sys

    from support import subprocess_env

    (tmp_path / "data.jsonl").write_text(json.dumps({"question": "the cat", "choices": [" sat", " dog"], "label": 0}))
    (tmp_path / "mc.yaml").write_text(
        f"task: setdlm_cli_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp_path / 'data.jsonl'}\n"
        "test_split: test\ndoc_to_text: '{{question}}'\noutput_type: multiple_choice\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\nmetric_list:\n  - metric: acc\n")
    out = subprocess.run([sys.executable, "-m", "setdlm.evaluation.harness", "run", "--model", "setdlm", "--model_args",
                          f"pretrained={checkpoints['ar']}", "--tasks", "setdlm_cli_mc", "--include_path",
                          str(tmp_path), "--device", "cpu"], capture_output=True, text=True, env=subprocess_env(),
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "setdlm_cli_mc" in out.stdout and "acc" in out.stdout
