"""Several choices per request (issue #45 point 4): ``n`` independent samples, each its own seed stream, and a
list of prompts on ``/v1/completions``, indexed as OpenAI indexes them and batched through the one batcher,
each choice what its row gives alone; 16 stop strings; ``GET /v1/models/{id}``; vLLM's ``/tokenize`` and
``/detokenize``. Read with the official openai client where it has the call."""


import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from setdlm.chat import chat_prompt  # noqa: E402
from setdlm.decoding import generate  # noqa: E402
from setdlm.seeds import derive_seed  # noqa: E402

from support import CharTokenizer, openai_client, post_json, running, tiny_model  # noqa: E402

TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}assistant:"


@pytest.fixture(scope="module")
def server():
    model = tiny_model("setdlm", L=48, seed=2)
    model.tokenizer = CharTokenizer()
    model.tokenizer.chat_template = TEMPLATE
    with running(model, "tiny", max_batch=4, max_queue=8) as (url, app):
        yield url, model, app


post, client = post_json, openai_client


def _seed(seed: int, j: int) -> int:
    return seed if j == 0 else derive_seed(seed, j)


def test_n_samples_each_with_its_own_seed_stream(server):
    url, model, app = server
    kw = dict(max_new_tokens=12, temperature=0.9, threshold=0.3)
    out = client(url).completions.create(model="tiny", prompt="to be", n=3, max_tokens=12, temperature=0.9, seed=7,
                                         extra_body={"threshold": 0.3})
    assert [c.index for c in out.choices] == [0, 1, 2]
    texts = [generate(model, "to be", seed=_seed(7, j), **kw) for j in range(3)]
    assert [c.text for c in out.choices] == [t.texts[0] for t in texts]
    assert len({c.text for c in out.choices}) > 1  # independent samples, not copies
    assert out.usage.prompt_tokens == 6 and out.usage.completion_tokens == sum(len(t.tokens[0]) for t in texts)
    extra = out.model_extra["setdlm"]
    assert [c["seed"] for c in extra["choices"]] == [_seed(7, j) for j in range(3)] and extra["seed"] == 7

    chunks = list(client(url).completions.create(model="tiny", prompt="to be", n=3, max_tokens=12, temperature=0.9,
                                                 seed=7, stream=True, extra_body={"threshold": 0.3}))
    joined = ["".join(ch.choices[0].text for ch in chunks if ch.choices[0].index == j) for j in range(3)]
    assert joined == [c.text for c in out.choices]
    assert sum(ch.choices[0].finish_reason is not None for ch in chunks) == 3
    assert chunks[-1].usage.completion_tokens == out.usage.completion_tokens


def test_greedy_n_is_refused_unless_copies_are_asked_for(server):
    url, model, _ = server
    status, err = post(url, {"prompt": "to be", "n": 2, "max_tokens": 6})
    assert status == 400 and err["error"]["param"] == "n" and "identical" in err["error"]["message"]
    status, out = post(url, {"prompt": "to be", "n": 2, "max_tokens": 6, "greedy_copies": True})
    alone = generate(model, "to be", max_new_tokens=6).texts[0]
    assert status == 200 and [c["text"] for c in out["choices"]] == [alone, alone]
    for n in (0, 17, "2"):
        status, err = post(url, {"prompt": "to be", "n": n, "temperature": 1.0})
        assert status == 400 and err["error"]["param"] == "n"


def test_a_list_of_prompts_gives_choices_in_openai_order_each_as_alone(server):
    url, model, app = server
    prompts = ["to be", "a", [1, 4, 5, 6]]  # strings and token ids alike (ids taken as they come)
    before = app.state.batcher.stats()["forwards"]
    out = client(url).completions.create(model="tiny", prompt=prompts, n=2, max_tokens=10, temperature=0.7, seed=3)
    assert [c.index for c in out.choices] == list(range(6))
    for c in out.choices:
        p, j = divmod(c.index, 2)
        assert c.text == generate(model, prompts[p], max_new_tokens=10, temperature=0.7, seed=_seed(3, j)).texts[0]
    assert out.usage.prompt_tokens == 6 + 2 + 4  # each prompt once, not once per sample
    rows = sum(c["nfe"] for c in out.model_extra["setdlm"]["choices"])
    assert app.state.batcher.stats()["forwards"] - before < rows  # the choices shared forwards (the one batcher)
    greedy = client(url).completions.create(model="tiny", prompt=["to be", "a"], max_tokens=8)
    assert [c.text for c in greedy.choices] == [generate(model, p, max_new_tokens=8).texts[0] for p in ("to be", "a")]
    status, err = post(url, {"prompt": ["a"] * 17, "max_tokens": 2})
    assert status == 400 and err["error"]["param"] == "prompt" and "at most 16" in err["error"]["message"]
    status, err = post(url, {"prompt": ["a"] * 13, "max_tokens": 2})  # more than --max-batch + --max-queue (12)
    assert status == 400 and err["error"]["param"] == "prompt" and "--max-batch + --max-queue" in err["error"]["message"]
    status, err = post(url, {"prompt": ["a", ""], "max_tokens": 2})
    assert status == 400 and err["error"]["param"] == "prompt" and "prompt[1]" in err["error"]["message"]


def test_sixteen_stop_strings(server):
    url, model, _ = server
    stops = [f"{c}{c}" for c in "bcdfghjklmnpqrs"] + ["e"]
    status, out = post(url, {"prompt": "to be", "max_tokens": 20, "stop": stops})
    assert status == 200 and out["choices"][0]["text"] == generate(model, "to be", max_new_tokens=20, stop=stops).texts[0]
    status, err = post(url, {"prompt": "to be", "stop": stops + ["zz"]})
    assert status == 400 and err["error"]["param"] == "stop" and "1 to 16" in err["error"]["message"]


def test_one_model_route(server):
    url, _, _ = server
    card = client(url).models.retrieve("tiny")
    assert card.id == "tiny" and card.model_extra["context_length"] == 48
    with pytest.raises(openai.NotFoundError):
        client(url).models.retrieve("other")


def test_tokenize_and_detokenize_as_vllm_spells_them(server):
    url, model, _ = server
    status, out = post(url, {"prompt": "to be"}, "/tokenize")
    ids = [1] + model.tokenizer.encode("to be")  # what the server decodes the prompt from: BOS first
    assert status == 200 and out["tokens"] == ids and out["count"] == 6 and out["max_model_len"] == 48
    _, used = post(url, {"prompt": "to be", "max_tokens": 1})
    assert used["usage"]["prompt_tokens"] == out["count"]
    _, bare = post(url, {"prompt": "to be", "add_special_tokens": False, "return_token_strs": True}, "/tokenize")
    assert bare["tokens"] == ids[1:] and bare["token_strs"] == list("to be")
    msgs = [{"role": "user", "content": "hi"}]
    _, chat = post(url, {"messages": msgs}, "/tokenize")
    assert chat["tokens"] == chat_prompt(model.tokenizer, msgs)
    _, text = post(url, {"tokens": ids}, "/detokenize")
    assert text == {"prompt": "to be"}
    for path, body, param in (("/tokenize", {}, "prompt"), ("/tokenize", {"prompt": 5}, "prompt"),
                              ("/detokenize", {"tokens": [10**6]}, "tokens"), ("/tokenize", {"prompt": "a", "model": "x"},
                                                                               "model")):
        status, err = post(url, body, path)
        assert status in (400, 404) and err["error"]["param"] == param, (path, body, err)
