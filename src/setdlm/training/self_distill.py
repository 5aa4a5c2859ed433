"""A frozen model's own greedy continuations of offline prompts: the training data of a drafter (docs/drafter.md).

A drafter is accepted where it guesses what the base model will say, so it learns from what the base says: each
prompt (a chat question rendered by the model's chat template, or an arithmetic word problem) is decoded greedily
by the base (AR, batched) and the prompt and its continuation are stored as one record of a JSON-lines file,
written batch by batch, so a killed run resumes where it stopped (records already in the file are skipped).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..chat import chat_prompt
from ..data.chat_prompts import chat_questions
from ..data.tasks import reasoning_split
from ..decoding import generate


@dataclass(frozen=True)
class DistillPrompt:
    key: str  # unique within a data set (the file's resume key)
    kind: str  # "chat" or "word"
    text: str  # the user's question


def distill_prompts(split: str, chat: int, word: int, *, seed: int = 0) -> list[DistillPrompt]:
    """``chat`` chat questions and ``word`` medium word problems of ``split``, interleaved (chat first)."""
    qs = [DistillPrompt(f"chat:{q}", "chat", q) for q in chat_questions(split, chat, seed=seed)]
    ws = [DistillPrompt(f"word:{e.question}", "word", e.question)
          for e in reasoning_split(split, word, level="medium", seed=seed)]
    out = []
    for i in range(max(len(qs), len(ws))):
        out += qs[i:i + 1] + ws[i:i + 1]
    return out


def prompt_ids(model, p: DistillPrompt) -> list[int]:
    """The prompt as the chat model reads it: its chat template around the question, the assistant's turn open."""
    return chat_prompt(model.tokenizer, p.text)


def read_records(path: str | Path) -> list[dict]:
    """The records of a self-distillation file (a torn last line, from a killed run, is dropped)."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def distill(model, prompts: list[DistillPrompt], path: str | Path, *, max_new_tokens: int = 128,
            batch_size: int = 32, progress: bool = True) -> list[dict]:
    """Decode every prompt of ``prompts`` not yet in ``path`` greedily with ``model`` (AR), appending one record
    ``{"key", "kind", "prompt": ids, "completion": ids}`` per prompt; returns every record of the file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    records = read_records(path)
    if records:  # rewrite without a torn tail before appending
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    done = {r["key"] for r in records}
    todo = [p for p in prompts if p.key not in done]
    bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), desc="self-distill", unit="prompt",
               disable=not progress)
    with path.open("a", encoding="utf-8") as f:
        for i in range(0, len(todo), batch_size):
            chunk = todo[i:i + batch_size]
            ids = [prompt_ids(model, p) for p in chunk]
            with torch.no_grad():
                out = generate(model, ids, max_new_tokens=max_new_tokens)
            for p, pi, gen in zip(chunk, ids, out.tokens):
                rec = {"key": p.key, "kind": p.kind, "prompt": pi, "completion": [int(t) for t in gen]}
                f.write(json.dumps(rec) + "\n")
                records.append(rec)
            f.flush()
            bar.update(len(chunk))
    bar.close()
    return records
