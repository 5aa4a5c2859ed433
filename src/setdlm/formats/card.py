"""The model card: the ``README.md`` every checkpoint carries (docs/method.md §9.3): family, schedule,
architecture, tokenizer, training data and arguments, and a results table when given (Hugging Face Hub ready)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import UserError
from ..family import FamilyConfig
from .backbones import format_named


def _table(rows: Sequence[Mapping]) -> str:
    cols = list(dict.fromkeys(k for r in rows for k in r))

    def fmt(v) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def bench_table(bench) -> str:
    """Markdown for ``bench``: a string (inserted as is), a mapping ``{metric: value}``, or a list of row
    mappings (one table row each, columns = the union of their keys)."""
    if bench is None:
        return ""
    if isinstance(bench, str):
        return bench.strip()
    if isinstance(bench, Mapping):
        return _table([{"metric": k, "value": v} for k, v in bench.items()])
    rows = list(bench)
    if not all(isinstance(r, Mapping) for r in rows):
        raise UserError("bench must be a markdown string, a {metric: value} mapping or a list of row mappings")
    return _table(rows)


def _family(fam: dict):
    """The :class:`~setdlm.family.FamilyConfig` of config.json's ``family`` (its registry entry: ``.spec``)."""
    return FamilyConfig.from_dict(fam)


def model_card(config: Mapping, *, bench=None, repo_id: str | None = None) -> str:
    """The README.md of a checkpoint whose ``config.json`` is ``config`` (see :mod:`setdlm.formats.checkpoint`)."""
    fam = config["family"]
    family = _family(fam)
    arch = config["architecture"]
    training = config.get("training") or {}
    source = config.get("source") or {}
    tok = config.get("tokenizer") or {}
    data = training.get("data")
    tags = list(dict.fromkeys(["setdlm", "diffusion-language-model", fam["family"]]))
    front = ["---", "library_name: setdlm", "pipeline_tag: text-generation", "tags:"] + [f"- {t}" for t in tags]
    if isinstance(data, str) and data.startswith("hf:"):
        front += ["datasets:", f"- {data[3:].split(':')[0].split('@')[0]}"]
    front.append("---")
    backbone = format_named(config).describe(arch)
    name = repo_id or source.get("name") or "setdlm model"
    lines = front + ["", f"# {name}", "",
                     f"{'An' if family.spec.title[0] in 'aeiou' else 'A'} {family.spec.title} language model in the "
                     "[setdlm](https://pypi.org/project/setdlm/) format.", "",
                     "| | |", "|---|---|", f"| family | `{fam['family']}` |",
                     f"| schedule | {family.spec.describe(family)} |", f"| backbone | {backbone} |",
                     f"| tokenizer | {tok.get('kind', '?')}, {tok.get('vocab_size', '?')} tokens, MASK id "
                     f"{fam['mask_token_id']} |", f"| weights | {config.get('dtype', '?')}"
                     f"{', EMA weights included' if config.get('ema') else ''} |"]
    if source.get("command"):  # trained here: the command that reproduces it
        lines.append(f"| made by | {source.get('name', '?')}: `{source['command']}` |")
    elif source:
        lines.append(f"| converted from | {source.get('name', '?')} ({source.get('layout', '?')}) |")
    if training:
        lines += ["", "## Training", "", "| argument | value |", "|---|---|"]
        keys = ("data", "init_from", "preset", "steps", "batch_size", "lr", "lr_schedule", "warmup", "ema", "seed")
        lines += [f"| {k} | `{training[k]}` |" for k in keys if training.get(k) not in (None, "")]
    table = bench_table(bench)
    if table:
        lines += ["", "## Results", "", table]
    ref = repo_id or "PATH"
    lines += ["", "## Use", "", "```python", "import setdlm", "", f'model = setdlm.load("{ref}")',
              'out = model.generate(["Once upon a time"], max_new_tokens=64)', "print(out.texts[0])", "```", ""]
    return "\n".join(lines)
