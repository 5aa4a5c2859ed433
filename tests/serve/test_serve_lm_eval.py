"""lm-evaluation-harness through ``setdlm serve`` (issue #45 point 2; docs/serve.md "lm-eval through the
server"): ``--model local-completions`` with the shipped tokenizer (``tokenizer_backend=huggingface``, the
model folder: its BOS post-processor gives the string path's ids) scores a multiple-choice task and a
``loglikelihood_rolling`` task exactly as ``--model setdlm`` does in process, and ``generate_until`` with
``batch_size=4`` (lists of prompts) gives the adapter's texts. Local YAML + jsonl tasks, the shipped AR model.
Skipped without lm-eval."""

import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("lm_eval")

import lm_eval.models  # noqa: E402,F401  (every lm-eval model, local-completions included; the registry loads them only while empty)
import setdlm  # noqa: E402
import setdlm.evaluation.harness  # noqa: E402,F401  (registers --model setdlm with lm-eval releases before plugins)
from setdlm.formats import pretrained  # noqa: E402

from support import running  # noqa: E402

QUESTIONS = [("a farmer has 3 cows and buys 4 more. how many cows?", [" 7", " 6", " 12"], 0),
             ("sam had 9 pens and lost 2. how many pens?", [" 11", " 7"], 1),
             ("5 + 6 =", [" 11", " 10", " 1"], 0),
             ("there are 8 cats and 2 leave. how many stay?", [" 10", " 4", " 6"], 2),
             ("a box has 4 rows of 3 eggs. how many eggs?", [" 12", " 7"], 0)]
TEXTS = ["the farmer has 12 cows and 3 dogs.", "sam buys 4 pens at 2 dollars each, so he pays 8 dollars.",
         "a box holds 6 eggs"]


def _tasks(tmp_path):
    from lm_eval.tasks import TaskManager

    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"question": q, "choices": c, "label": lab}) + "\n" for q, c, lab in QUESTIONS))
    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))

    def common(path):
        return f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {path}\ntest_split: test\n"

    (tmp_path / "mc.yaml").write_text("task: serve_mc\n" + common(qa) + "output_type: multiple_choice\n"
                                      "doc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\n"
                                      "doc_to_target: '{{label}}'\nmetric_list:\n  - metric: acc\n")
    (tmp_path / "gen.yaml").write_text("task: serve_gen\n" + common(qa) + "output_type: generate_until\n"
                                       "doc_to_text: '{{question}}\n'\ndoc_to_target: '{{label}}'\n"
                                       "generation_kwargs:\n  until: ['.', '?', '!', ';', 'x']\n  max_gen_toks: 12\n"
                                       "metric_list:\n  - metric: exact_match\n")
    (tmp_path / "ppl.yaml").write_text("task: serve_ppl\n" + common(text) + "output_type: loglikelihood_rolling\n"
                                       "doc_to_text: ''\ndoc_to_target: '{{text}}'\n"
                                       "metric_list:\n  - metric: word_perplexity\n")
    return TaskManager(include_path=str(tmp_path), include_defaults=False)


def _run(model: str, model_args: str, tasks, names: list[str], batch_size: int = 1) -> dict:
    from lm_eval import simple_evaluate

    res = simple_evaluate(model=model, model_args=model_args, tasks=names, task_manager=tasks, batch_size=batch_size,
                          device="cpu", log_samples=True)
    return {name: [s["resps"] for s in sorted(res["samples"][name], key=lambda s: s["doc_id"])] for name in names}


def _lm(name: str, args: str):
    from lm_eval.api.registry import get_model

    return get_model(name).create_from_arg_string(args, {"device": "cpu"})


def _requests(kind: str, args: list[tuple]):
    from lm_eval.api.instance import Instance

    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def test_lm_eval_requests_through_the_server_equal_the_adapters():
    """lm-eval's own request objects, sent by its ``local-completions`` model (batches of 4: lists of prompts)
    and answered by the in-process adapter: the same log-likelihoods, greedy flags, rolling sums and texts."""
    folder = pretrained.path("arith-ar")
    inproc = _lm("setdlm", "pretrained=arith-ar")
    pairs = [(q, " " + c) for q, choices, _ in QUESTIONS for c in choices]
    gens = [(q + "\n", {"until": [".", "?"], "max_gen_toks": 12}) for q, _, _ in QUESTIONS]
    with running(setdlm.load("arith-ar"), "arith-ar", max_batch=4) as (url, _):
        api = f"model=arith-ar,base_url={url}/v1/completions,tokenizer_backend=huggingface,tokenizer={folder}," \
              "num_concurrent=1,max_retries=1,batch_size=4"
        served = _lm("local-completions", api + ",add_bos_token=True")
        scores = served.loglikelihood(_requests("loglikelihood", pairs), disable_tqdm=True)
        texts = served.generate_until(_requests("generate_until", gens), disable_tqdm=True)
        rolling = _lm("local-completions", api).loglikelihood_rolling(
            _requests("loglikelihood_rolling", [(t,) for t in TEXTS]), disable_tqdm=True)
    expected = inproc.loglikelihood(_requests("loglikelihood", pairs), disable_tqdm=True)
    assert [s for s, _ in scores] == pytest.approx([s for s, _ in expected], abs=1e-4)
    assert [g for _, g in scores] == [g for _, g in expected]
    assert texts == inproc.generate_until(_requests("generate_until", gens), disable_tqdm=True)
    assert rolling == pytest.approx(inproc.loglikelihood_rolling(_requests("loglikelihood_rolling", [(t,) for t in TEXTS]),
                                                                 disable_tqdm=True), abs=1e-4)


@pytest.mark.slow
def test_lm_eval_through_the_server_scores_as_the_in_process_adapter(tmp_path):
    """The same through lm-eval's task pipeline (``simple_evaluate`` on local YAML + jsonl tasks)."""
    tasks = _tasks(tmp_path)
    folder = pretrained.path("arith-ar")
    inproc = _run("setdlm", "pretrained=arith-ar", tasks, ["serve_mc", "serve_gen", "serve_ppl"])
    with running(setdlm.load("arith-ar"), "arith-ar", max_batch=4) as (url, _):
        api = f"model=arith-ar,base_url={url}/v1/completions,tokenizer_backend=huggingface,tokenizer={folder}," \
              "num_concurrent=1,max_retries=1"
        # lm-eval sends the context with BOS only when asked (add_bos_token: the tokenizer's post-processor) ...
        served = _run("local-completions", api + ",add_bos_token=True", tasks, ["serve_mc", "serve_gen"],
                      batch_size=4)
        # ... while its rolling windows put the prefix token (BOS) in front themselves
        served |= _run("local-completions", api, tasks, ["serve_ppl"])
    for doc_in, doc_served in zip(inproc["serve_mc"], served["serve_mc"]):
        assert [r[0][0] for r in doc_served] == pytest.approx([r[0][0] for r in doc_in], abs=1e-4)
        assert [r[0][1] for r in doc_served] == [r[0][1] for r in doc_in]  # is_greedy
    assert [d[0][0] for d in served["serve_ppl"]] == pytest.approx([d[0][0] for d in inproc["serve_ppl"]], abs=1e-4)
    assert served["serve_gen"] == inproc["serve_gen"]
