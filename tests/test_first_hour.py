"""The first hour (docs/errors.md, README.md): what a new user meets going through the README and docs/
works as written or fails in one clear line. One section per trap; each test fails on the code before it."""

import json
import re
from pathlib import Path

import pytest
import torch

import setdlm
from setdlm.formats import pretrained
from setdlm.errors import UserError
from setdlm.evaluation.likelihood import heldout_rows, training_args

from support import assert_one_line_error, run

# ---------------------------------------------------------------------------------------------------------
# shipped models name no path of the machine that built them
# ---------------------------------------------------------------------------------------------------------

# an absolute POSIX path of two or more parts, or a Windows drive path, not inside a URL
ABSOLUTE = re.compile(r"(?<![\w:/.~-])/(?:[\w.-]+/)+[\w.-]*|\b[A-Za-z]:\\\\?[\w.-]")


def shipped_texts():
    """(file, text) for every shipped model file: the text files whole, safetensors files' JSON headers."""
    for folder in sorted(p for p in pretrained.root().iterdir() if p.is_dir()):
        for f in sorted(folder.iterdir()):
            if f.suffix == ".safetensors":
                with f.open("rb") as h:
                    n = int.from_bytes(h.read(8), "little")
                    yield f, h.read(n).decode("utf-8")
            else:
                yield f, f.read_text(encoding="utf-8")


def test_no_shipped_file_names_an_absolute_path():
    found = [(f"{f.parent.name}/{f.name}", m) for f, text in shipped_texts() for m in ABSOLUTE.findall(text)]
    assert len(list(shipped_texts())) >= 6 * 5
    assert not found, found


def test_the_pattern_catches_build_paths():
    assert ABSOLUTE.findall('"data": "/work/runs/protocol/data/x.jsonl"') == ["/work/runs/protocol/data/x.jsonl"]
    assert ABSOLUTE.findall("`C:\\\\runs\\\\x`") and not ABSOLUTE.findall("https://pypi.org/project/setdlm/ a/b")


@pytest.mark.parametrize("name", [n for n in pretrained.available() if n.startswith("arith-")])
def test_arith_models_rebuild_their_heldout_rows(name):
    """`setdlm eval arith-ar` (task likelihood) needs the run's held-out rows: the data must be here."""
    model = setdlm.load(name)
    rows = heldout_rows(training_args(name), model.tokenizer)
    assert len(rows) == 512 and rows.input_ids.shape[1] == model.family.length


def test_missing_training_data_is_one_clear_line(tmp_path, capsys):
    model = setdlm.load("arith-ar")
    model.save(tmp_path / "m", training_args={**training_args("arith-ar"), "data": "/nowhere/train.jsonl"})
    with pytest.raises(UserError, match="'/nowhere/train.jsonl', which cannot be read here: pass data"):
        heldout_rows(training_args(tmp_path / "m"), model.tokenizer)
    assert_one_line_error(*run(["eval", str(tmp_path / "m")], capsys)[::2], "pass --data (a file")


# ---------------------------------------------------------------------------------------------------------
# --speculate works at the default --max-new-tokens; its window is bounded by the room
# ---------------------------------------------------------------------------------------------------------


def test_speculate_alone_works_at_the_default_length(capsys):
    """`setdlm generate --prompt "ROMEO:" --speculate`: the default 128 new tokens do not fit L=128 after the
    prompt, so the default is capped at the room (122 here); the text is --window 1's at that length."""
    code, spec, err = run(["generate", "--prompt", "ROMEO:", "--speculate", "--ignore-eos"], capsys)
    assert code == 0, err
    code, ref, err = run(["generate", "--prompt", "ROMEO:", "--window", "1", "--max-new-tokens", "122",
                          "--ignore-eos"], capsys)
    assert code == 0 and spec == ref and len(setdlm.load("shakespeare-setdlm-smax8").tokenizer.encode(ref)) > 100


def test_speculate_too_long_names_the_flag_and_the_largest_value(capsys):
    assert_one_line_error(*run(["generate", "--prompt", "ROMEO:", "--speculate", "--max-new-tokens", "123"],
                               capsys)[::2], "--speculate needs", "--max-new-tokens can be at most 122")


def test_speculation_window_is_bounded_by_the_room():
    """window=1000 on a 128-token context: the drafts never reach past the rows' new tokens, so the window is
    the room (8 here); no forward holds more queries than (8 + 1) horizons x 8 offsets + the cached tokens,
    and the tokens are window 1's."""
    from setdlm.decoding import generate
    from setdlm.decoding.api import decode_config
    from setdlm.decoding.settings import DecodeSettings

    from support import recorded

    model = setdlm.load("shakespeare-setdlm-smax8")
    wide = DecodeSettings(speculate=True, window=1000)
    assert decode_config(model, wide, mode="generate", cache_order="position", trace=False, room=8).window == 8
    assert decode_config(model, wide, mode="generate", cache_order="position", trace=False).window == 127
    traced, rec = recorded(model)
    out = generate(traced, ["ROMEO:", "JULIET: O"], speculate=True, window=1000, max_new_tokens=8, ignore_eos=True)
    assert out.tokens == generate(model, ["ROMEO:", "JULIET: O"], window=1, max_new_tokens=8, ignore_eos=True).tokens
    assert max(c.ids.shape[1] for c in rec.calls[1:]) <= 9 * 8 + 8 + 1


# ---------------------------------------------------------------------------------------------------------
# the word-problem models get their training format: the question, then a newline
# ---------------------------------------------------------------------------------------------------------

QUESTION = "Tom has 3 apples. He buys 6 more. He gives away 4. How many apples does Tom have now?"


def test_arith_prompts_end_with_the_training_newline(tmp_path):
    from setdlm.data.prompt import encode_prompt, encode_prompts

    model = setdlm.load("arith-ar")
    tok = model.tokenizer
    assert tok.prompt_end == "\n"
    assert encode_prompt(tok, QUESTION) == encode_prompt(tok, QUESTION + "\n") == [tok.bos_token_id] + \
        tok.encode(QUESTION + "\n")
    assert encode_prompt(tok, "") == [tok.bos_token_id]  # unconditional stays unconditional
    # an infilling prefix that holds no newline yet gets it too, as the server's infilling prompt (issue #46, 12)
    assert encode_prompts(model, [QUESTION], "prefix", add_bos=True)[0] == [tok.bos_token_id] + \
        tok.encode(QUESTION + "\n")
    model.save(tmp_path / "m")  # the format travels with the tokenizer
    assert setdlm.load(tmp_path / "m").tokenizer.prompt_end == "\n"
    assert setdlm.load("shakespeare-ar").tokenizer.prompt_end is None


def test_the_quantization_guide_example_answers_right(capsys):
    """docs/quantization.md's command: without the newline the model read the question's end as its first
    line and answered `#### 6`."""
    code, out, err = run(["generate", "arith-ar", "--quantize", "int8", "--max-new-tokens", "24", "--prompt",
                          QUESTION], capsys)
    assert code == 0, err
    assert out.split() == ["3+6=9", "9-4=5", "####", "5"], out
    assert QUESTION in (Path(__file__).parents[1] / "docs" / "quantization.md").read_text()


# ---------------------------------------------------------------------------------------------------------
# setdlm models; "did you mean" for a mistyped name
# ---------------------------------------------------------------------------------------------------------


def test_setdlm_models_lists_every_shipped_model(capsys):
    code, out, err = run(["models"], capsys)
    assert code == 0, err
    lines = out.split("\n\n")[0].splitlines()  # the shipped models; installed GGUF models follow
    assert lines[0].split() == ["NAME", "PARAMETERS", "SIZE", "FAMILY", "CONTEXT", "TASK"]
    assert [line.split()[0] for line in lines[1:]] == pretrained.available() + pretrained.drafters()
    assert len(pretrained.available()) == 8
    row = next(line for line in lines if line.startswith("arith-setdlm-smax8 "))
    assert "setdlm D=4 M=8 " in row and " 192 " in row and "word problems" in row
    row = next(line for line in lines if line.startswith("arith-setdlm-smax8-ar "))
    assert "setdlm D=4 M=8 ar_weight=1 " in row  # the next-token head shows
    d = pretrained.describe("shakespeare-ar")
    model = setdlm.load("shakespeare-ar")
    assert d["parameters"] == sum(p.numel() for p in model.backbone.parameters()) and d["context"] == 128
    assert d["family"] == "ar" and d["task"].startswith("Shakespeare")


def test_a_mistyped_model_name_says_what_it_meant(capsys):
    assert_one_line_error(*run(["generate", "arith-arr", "--prompt", "x"], capsys)[::2], "did you mean 'arith-ar'?")
    with pytest.raises(UserError, match="did you mean 'shakespeare-ar'"):
        setdlm.load("shakespeare_ar")
    with pytest.raises(UserError, match="did you mean 'arith-ar'\\? shipped models: arith-ar"):
        pretrained.path("arith-arr")


# ---------------------------------------------------------------------------------------------------------
# training says what it does: a start summary, a loss line every --log-every, warnings
# ---------------------------------------------------------------------------------------------------------

SMALL_RUN = ["--vocab-size", "4096", "--preset", "small", "--length", "64", "--batch-size", "4", "--hidden-size",
             "32", "--n-layers", "1", "--n-heads", "2", "--eval-every", "0", "--save-every", "0"]


def test_training_prints_a_summary_loss_lines_and_warnings(tmp_path, capsys):
    from support import write_hamlet

    data = write_hamlet(tmp_path / "h.txt", 4500)
    code, out, err = run(["train", "--out", str(tmp_path / "run"), "--data", data, "--steps", "6", "--log-every", "2",
                          *SMALL_RUN], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert re.fullmatch(r"training setdlm \(0\.\d\dM parameters\) on .*h\.txt: tokenizer bpe, \d+ tokens; \d+ rows "
                        r"of 64 tokens, [1-7] held out; 256 tokens per step; steps 1-6, a loss line every 2", lines[0])
    assert [line.split(":")[0] for line in lines[1:4]] == ["step 2", "step 4", "step 6"]
    assert all(re.search(r"loss \d+\.\d{4}, lr ", line) for line in lines[1:4])
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 3, err
    assert re.search(r"--vocab-size 4096 asked, but the BPE tokenizer learned only \d+ tokens", warnings[0])
    assert re.search(r"the held-out set is [1-7] rows? \(--eval-fraction 0.05 of \d+ rows\)", warnings[1])
    assert "--warmup 200 is longer than --steps 6" in warnings[2]


def test_loss_lines_reach_a_pipe_as_they_happen(tmp_path):
    """A run of many steps whose stdout is a pipe: its first loss line arrives while it still trains (the
    reader waits for the line, then stops the run; an unflushed line would arrive only at exit)."""
    import subprocess
    import sys
    import threading

    from support import subprocess_env, write_hamlet

    data = write_hamlet(tmp_path / "h.txt", 4500)
    proc = subprocess.Popen([sys.executable, "-m", "setdlm", "train", "--out", str(tmp_path / "run"), "--data", data,
                             "--steps", "3000", "--log-every", "1", "--warmup", "0", *SMALL_RUN],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=subprocess_env())
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.extend([proc.stdout.readline(), proc.stdout.readline()]))
    reader.start()
    reader.join(timeout=300)  # a safety net only: the lines come within seconds when flushed
    running = proc.poll() is None
    proc.kill()
    proc.wait()
    assert running and len(got) == 2 and got[1].startswith("step 1: loss "), got


# ---------------------------------------------------------------------------------------------------------
# polish: flags in CLI errors, grammar, --help, Model.fill, constraint= taking what the README says
# ---------------------------------------------------------------------------------------------------------


def test_cli_errors_spell_flags_not_python(capsys):
    assert_one_line_error(*run(["generate", "arith-ar", "--quantize", "gguf", "--prompt", "x"], capsys)[::2],
                          "--quantize gguf keeps", "(use --quantize int8 or --quantize int4)")
    code, _, err = run(["generate", "--speculate", "--threshold", "0.5", "--prompt", "x"], capsys)
    assert_one_line_error(code, err, "--speculate verifies", "--threshold does not apply (leave the flag out)")
    assert "None" not in err and "quantize=" not in err
    with pytest.raises(UserError, match=r"quantize='gguf' keeps"):  # the library keeps its own words
        setdlm.load("arith-ar", quantize="gguf")


def test_messages_agree_in_number(capsys, tmp_path):
    from setdlm.formats.card import model_card
    from setdlm.serve.schemas import parse_request

    assert_one_line_error(*run(["generate", "--max-new-tokens", "1000000000000", "--prompt", "x"], capsys)[::2],
                          "decoding 1 row of up to", "lower --max-new-tokens")
    model = setdlm.load("shakespeare-ar")
    with pytest.raises(Exception, match="the prompt has 3 tokens and"):
        parse_request(json.dumps({"prompt": "abc", "max_tokens": 1000}).encode(), chat=False, model=model,
                      model_name="m", width=128)
    cfg = json.loads((pretrained.path("arith-ar") / "config.json").read_text())
    assert "An autoregressive (AR) language model" in model_card(cfg)


def test_help_gives_each_command_a_whole_sentence(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    text = " ".join(out.split())
    assert "serve Serve a model over an OpenAI-compatible HTTP API with set streaming, continuous batching and a " \
           "live decode-order page at / (needs the extra setdlm[serve]; docs/serve.md). models" in text


def test_model_fill_exists_as_the_readme_says():
    model = setdlm.load("shakespeare-bd3lm-s4")
    tok, mask = model.tokenizer, model.family.mask_token_id
    row = [tok.bos_token_id] + tok.encode("ROMEO: But soft") + [mask] * 4 + tok.encode(" the east")
    from setdlm.decoding import fill

    assert model.fill([row]).tokens == fill(model, [row]).tokens and len(model.fill([row]).tokens[0]) == 4


def test_constraint_takes_a_schema_a_pydantic_class_or_choices():
    pydantic = pytest.importorskip("pydantic")
    from setdlm.decoding.structured.constraint import choice, json_schema
    from setdlm.decoding.settings import DecodeSettings

    class Answer(pydantic.BaseModel):
        n: int

    assert DecodeSettings(constraint={"type": "integer"}).constraint == json_schema({"type": "integer"})
    assert DecodeSettings(constraint=Answer).constraint == json_schema(Answer.model_json_schema())
    assert DecodeSettings(constraint=["yes", "no"]).constraint == choice(["yes", "no"])
    assert DecodeSettings(constraint=[{"type": "integer"}, None]).constraint == (json_schema({"type": "integer"}),
                                                                                  None)  # one per row
    model = setdlm.load("arith-ar")
    out = model.generate([QUESTION, QUESTION], constraint=[["#### 5", "#### 7"], {"type": "integer"}],
                         max_new_tokens=8)
    assert out.texts[0] in ("#### 5", "#### 7") and int(out.texts[1]) >= 0
    with pytest.raises(TypeError, match="a JSON Schema \\(dict\\), a Pydantic model class or a list of choices"):
        DecodeSettings(constraint=3)
