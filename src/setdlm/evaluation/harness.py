"""lm-evaluation-harness model adapter: ``lm_eval --model setdlm --model_args pretrained=PATH,...``
(docs/method.md §5.1, §5.2, §5.6).

Registration. Importing this module registers the model name ``setdlm`` in lm-eval's registry
(``lm_eval.api.registry.register_model``). setdlm's package metadata also declares it as an
``lm_eval.models`` entry point, which lm-eval releases with plugin discovery load by themselves, so
``lm_eval --model setdlm`` works there as is. With releases that predate plugins (0.4.13 included), run the
harness through ``python -m setdlm.evaluation.harness`` (it takes ``lm_eval``'s arguments), or ``import
setdlm.evaluation.harness`` before ``lm_eval.simple_evaluate(model="setdlm", ...)``.

Requests:

* ``generate_until(context, gen_kwargs)`` — the family's decoder (:func:`setdlm.decoding.generate`) in
  batches: SetDLM window ``window`` (default D) and threshold ``threshold`` (default off: one token per
  step), BD3LM/MDLM ``block_size``; the request's ``until`` strings and EOS stop a row; ``max_gen_toks``
  (capped so that prompt + output fit the context length); ``do_sample``/``temperature``/``top_p``/``top_k``.
* ``loglikelihood(context, continuation)`` — the family's likelihood bound of the continuation given the
  context (the context is clean and first in every order, docs/method.md §2.2): AR exact; SetDLM the any-order NLL
  under a sampled reveal order; MDLM/BD3LM their NELBO. ``samples=k`` averages the bound over k sampled
  orders / masks (the reference's ``num_importance_samples``). ``is_greedy`` is exact for AR and, for
  SetDLM, says whether every continuation token is its query's argmax under the sampled order; MDLM and
  BD3LM report False. The bound is :func:`setdlm.evaluation.likelihood.likelihood`'s, batch for batch: request batch
  ``i`` of sample ``s`` uses the same seeded generator, so these scores add up to what ``setdlm eval``
  reports for the same rows, seed and batch size.
* ``loglikelihood_rolling(text)`` — the bound of the whole text in disjoint windows of the context length.

Paper GSM8K protocol (docs/method.md §5.2): ``gsm8k_paper=true`` with ``--apply_chat_template`` rebuilds the user
turn as the paper's instruction + the bare question, renders the model's chat template with
``enable_thinking=True``, and rewrites a ``\\boxed{x}`` answer as ``... #### x`` for the task's extractors
(``boxed=true`` alone does only the rewriting).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, TypedDict

import torch
from torch import Tensor, nn
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm.auto import tqdm

from ..backbone import Backbone
from ..batch import Batch
from ..data.prompt import max_prompt_tokens, start_ids
from ..decoding import generate
from ..decoding.request import REQUEST_FIELDS, request_settings
from ..decoding.settings import MAX_NEW_TOKENS, DecodeSettings, drafts
from ..errors import UserError
from ..formats.loading import load
from ..objectives import compute_loss, log_probs
from .likelihood import bound_generator

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

    from ..mask_rules import MaskRule
    from ..model import KVCache

PAPER_INSTRUCTION = "Please reason step by step, and put your final answer within $\\boxed{}$. "
_QUESTION = re.compile(r"^\s*Question:\s*(.*?)\s*(?:\nAnswer:\s*)?$", re.S)
_BOXED = re.compile(r"boxed\{([^}]*)\}")
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


class _Reference(TypedDict, total=False):
    """The keywords of the authors' layout that :func:`setdlm.formats.loading.load` takes, those given only."""

    tokenizer: str
    base: str
    D: int


class _Sampling(TypedDict, total=False):
    """The sampling settings an lm-eval request sets (none: the model's own)."""

    temperature: float
    top_p: float
    top_k: int


def boxed_to_hashes(text: str) -> str:
    """``... \\boxed{42} ...`` → ``... \\boxed{42} ... #### 42`` (the last boxed answer; commas dropped), so
    that the gsm8k task's ``#### n`` extractor scores it; text without a boxed answer is unchanged."""
    found = _BOXED.findall(text)
    return f"{text} #### {found[-1].replace(',', '').strip()}" if found else text


def paper_user_turn(content: str) -> str:
    """The paper's GSM8K user message: its instruction + the bare question (lm-eval's ``Question: ...
    Answer:`` scaffolding removed)."""
    m = _QUESTION.match(content)
    return PAPER_INSTRUCTION + (m.group(1) if m else content.strip())


@register_model("setdlm")
class SetDLMLM(LM):
    """A setdlm model (any family) for lm-eval. ``pretrained``: a checkpoint or run folder, a Hub id, or a
    folder / Hub id in the paper authors' layout. The decoding settings: ``settings`` (a
    :class:`~setdlm.decoding.settings.DecodeSettings`, from Python) or, not both, ``max_new_tokens`` (default
    256) and as model_args every field a request sets by name (``window``, ``threshold``, ``block_size``,
    ``cache_order``, ...: :data:`~setdlm.decoding.request.REQUEST_FIELDS`, read as the server reads a request's).
    See the module docstring and docs/pretrained.md for the requests and arguments. ``batch_size="auto"`` means
    1; ``max_batch_size`` is accepted (lm-eval passes it) and unused."""

    def __init__(self, pretrained: str, *, settings: DecodeSettings | None = None, max_new_tokens: int | None = None,
                 samples: int = 1, seed: int = 1234, batch_size: int | str = 1, max_batch_size: int | None = None,
                 device: str | None = None, dtype: str | None = None, ema: bool = False, add_bos: bool = True,
                 boxed: bool = False, gsm8k_paper: bool = False, enable_thinking: bool = True,
                 tokenizer: str | None = None, base: str | None = None, D: int | None = None, **decoding):
        super().__init__()
        unused = sorted(set(decoding) - set(REQUEST_FIELDS))
        if unused:
            raise UserError(f"unknown setdlm model_args: {', '.join(unused)}")
        if not (isinstance(samples, int) and samples >= 1):
            raise UserError(f"samples must be a positive integer, got {samples!r}")
        if dtype is not None and dtype not in _DTYPES:
            raise UserError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        reference = _Reference()
        if tokenizer is not None:
            reference["tokenizer"] = tokenizer
        if base is not None:
            reference["base"] = base
        if D is not None:
            reference["D"] = D
        self.model = load(str(pretrained), ema=ema, device=device, dtype=None if dtype is None else _DTYPES[dtype],
                          **reference)
        if self.model.tokenizer is None:
            raise UserError(f"{pretrained}: the model has no tokenizer; pass tokenizer=FOLDER_OR_HUB_NAME")
        self._tok = self.model.tokenizer
        self.name = str(pretrained)
        self._device = torch.device(device)
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 1  # "auto" → 1
        # a DecodeSettings from Python, or its fields as model_args (read as the server reads a request's); per
        # request: + max_gen_toks, until, sampling
        given = request_settings(decoding, self.L)
        if max_new_tokens is not None:
            given["max_new_tokens"] = max_new_tokens
        self.settings = DecodeSettings.of(settings, given, "SetDLMLM")
        self.settings.check_for(self.model.family.family, drafts=drafts(self.model))
        self.max_new_tokens = self.settings.max_new_tokens or MAX_NEW_TOKENS  # no max_gen_toks; capped at the room
        self.samples, self.seed, self.add_bos = samples, seed, add_bos
        self.boxed, self.paper, self.enable_thinking = boxed or gsm8k_paper, gsm8k_paper, enable_thinking
        from tokenizers import Tokenizer as Backend

        tok = self.model.tokenizer
        self._backend = Backend.from_str(tok.backend.to_str())
        self._backend.encode_special_tokens = False  # contexts may hold chat-template tokens, as in lm-eval's HF LM
        self._renderer: PreTrainedTokenizerFast | None = None
        pad = next((i for i in (tok.pad_token_id, tok.eos_token_id, 0) if i is not None), 0)
        self._pad = pad if pad != self.model.family.mask_token_id else 0  # padding is never scored

    @property
    def decode_kw(self) -> dict:
        """The family-specific decoding settings (:class:`DecodeSettings`)."""
        return {k: getattr(self.settings, k) for k in ("window", "threshold", "block_size", "cache_order")}

    # -- tokens ---------------------------------------------------------------------------------------------

    @property
    def L(self) -> int:
        return self.model.family.length

    def tok_encode(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids if text else []

    def _prefix(self) -> list[int]:
        return start_ids(self.model.tokenizer, eos_fallback=True) if self.add_bos else []

    def _context(self, text: str) -> list[int]:
        ids = self.tok_encode(text)
        pre = self._prefix()
        return ids if pre and ids[:1] == pre else pre + ids

    # -- chat templates ---------------------------------------------------------------------------------------

    @property
    def tokenizer_name(self) -> str:
        return self.name.replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self._tok.chat_template

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        template = self._tok.chat_template
        if template is None:
            raise UserError(f"{self.name}: the tokenizer has no chat template; drop --apply_chat_template")
        messages = [dict(m) for m in chat_history]
        if self.paper:
            users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
            if users:
                messages[users[-1]]["content"] = paper_user_turn(messages[users[-1]]["content"])
        if self._renderer is None:  # transformers renders the Jinja template exactly as for the HF model
            from tokenizers import Tokenizer as Backend
            from transformers import PreTrainedTokenizerFast

            self._renderer = PreTrainedTokenizerFast(tokenizer_object=Backend.from_str(self._backend.to_str()),
                                                     chat_template=template)
        text = self._renderer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                  enable_thinking=self.enable_thinking)
        if not isinstance(text, str):  # tokenize=False renders text; transformers' annotation covers every mode
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not the text")
        return text

    # -- generation -------------------------------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(json.dumps(r.args[1], sort_keys=True, default=str), []).append(i)
        out: dict[int, str] = {}  # by request
        bar = tqdm(total=len(requests), desc="setdlm generate_until", disable=disable_tqdm)
        for idx in groups.values():
            kw = dict(requests[idx[0]].args[1])
            until = kw.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kw.pop("max_gen_toks", self.max_new_tokens))
            sampling = _Sampling()
            if kw.get("do_sample") or (kw.get("temperature") or 0.0) > 0:
                sampling = _Sampling(temperature=float(kw.get("temperature") or 1.0),
                                     top_p=float(kw.get("top_p") or 1.0), top_k=int(kw.get("top_k") or 0))
            room = max_prompt_tokens(self.L)  # left-truncated to the prompt-length rule: room for a token
            prompts = {i: self._context(requests[i].args[0])[-room:] for i in idx}
            for lo in range(0, len(idx), self.batch_size):
                rows = idx[lo:lo + self.batch_size]
                by_len: dict[int, list[int]] = {}  # prompt + output must fit the context length L
                for i in rows:
                    by_len.setdefault(max(1, min(max_new, self.L - len(prompts[i]))), []).append(i)
                for n, part in by_len.items():
                    stop = tuple(dict.fromkeys((*self.settings.stop, *until)))  # the settings' own, and the task's
                    settings = replace(self.settings, max_new_tokens=n, stop=stop, **sampling)
                    res = generate(self.model, [prompts[i] for i in part], settings, seed=self.seed)
                    if res.texts is None:  # the model has a tokenizer (checked when loaded)
                        raise RuntimeError("generate returned no texts")
                    for i, text in zip(part, res.texts):
                        out[i] = boxed_to_hashes(text) if self.boxed else text
                        self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
                bar.update(len(rows))
        bar.close()
        return [out[i] for i in range(len(requests))]

    # -- likelihood -------------------------------------------------------------------------------------------

    def _pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context ids, continuation ids) as lm-eval splits them: trailing spaces move to the continuation,
        and the continuation is what encoding the whole adds to the context."""
        n_space = len(context) - len(context.rstrip())
        if n_space:
            context, continuation = context[:-n_space], context[-n_space:] + continuation
        whole = self._context(context + continuation)
        ctx = self._context(context)
        return ctx, whole[len(ctx):]

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [self._pair(*r.args) for r in requests]
        res = self._score(pairs, disable_tqdm)
        for r, v in zip(requests, res):
            self.cache_hook.add_partial("loglikelihood", r.args, v)
        return res

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for r in tqdm(requests, desc="setdlm loglikelihood_rolling", disable=disable_tqdm):
            ids = self.tok_encode(r.args[0])
            pre = self._prefix()
            if not pre:  # no BOS/EOS to condition on: the first token is context
                pre, ids = ids[:1], ids[1:]
            seq, span = pre + ids, self.L - len(pre)
            # disjoint windows of `span` tokens, each conditioned on what precedes it (left-truncated to fit)
            windows = [(seq[:len(pre) + s], ids[s:s + span]) for s in range(0, len(ids), span)]
            total = sum(ll for ll, _ in self._score(windows, True)) if windows else 0.0
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, total)
            out.append(total)
        return out

    def _score(self, pairs: list[tuple[list[int], list[int]]], disable_tqdm: bool) -> list[tuple[float, bool]]:
        """Bound on log p(continuation | context) and greedy flag of each (context, continuation) pair, in
        batches; the context is left-truncated to fit the context length."""
        fam, backbone = self.model.family, self.model.backbone
        results = []
        backbone.eval()
        for lo in tqdm(range(0, len(pairs), self.batch_size), desc="setdlm loglikelihood", disable=disable_tqdm):
            chunk = pairs[lo:lo + self.batch_size]
            rows = []
            for ctx, cont in chunk:
                cont = cont[-(self.L - 1):] if cont else cont
                rows.append((ctx[-(self.L - len(cont)):] if len(ctx) + len(cont) > self.L else ctx, cont))
            width = max(len(c) + len(t) for c, t in rows) if fam.spec.left_to_right else self.L
            B = len(rows)
            ids = torch.full((B, width), self._pad, dtype=torch.long)
            valid = torch.zeros(B, width, dtype=torch.bool)
            context = torch.zeros(B, width, dtype=torch.bool)
            for b, (ctx, cont) in enumerate(rows):
                n = len(ctx) + len(cont)
                ids[b, :n] = torch.tensor(ctx + cont)
                valid[b, :n] = True
                context[b, :len(ctx)] = True
            batch = Batch(ids, valid, context).to(self._device)
            lls, greedy = torch.zeros(B, dtype=torch.float64), torch.ones(B, dtype=torch.bool)
            for s in range(self.samples):  # batch i of pass s is seeded as evaluation.likelihood seeds it
                g = bound_generator(self.seed, s, lo // self.batch_size, self._device)
                nll, ok = self._bound(backbone, fam, batch, g)
                lls -= nll.double().sum(1).cpu() / self.samples
                greedy &= (ok | ~batch.targets).all(1).cpu()
            results += [(float(ll), bool(gr)) for ll, gr in zip(lls, greedy)]
        return results

    @torch.no_grad()
    def _bound(self, backbone, fam, batch: Batch, generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-position NLL (B, L) of the family's bound (``compute_loss``, as ``setdlm eval`` computes it)
        and whether each target is the argmax of its prediction (exact for AR, under the sampled order for
        SetDLM, all False for MDLM/BD3LM)."""
        capture = _Capture(backbone)
        out = compute_loss(capture, fam, batch, train=False, generator=generator)
        if not fam.spec.ordered:
            return out.nll, torch.zeros_like(batch.attention_mask)
        if capture.logits is None:
            raise RuntimeError(f"{fam.family}'s bound ran no forward of the backbone")
        lp = log_probs(capture.logits, fam.mask_token_id)
        if fam.spec.left_to_right:
            pred = torch.zeros_like(batch.input_ids)
            pred[:, 1:] = lp[:, :-1].argmax(-1)
            return out.nll, pred == batch.input_ids
        if out.order is None:  # an ordered objective that is not left to right (SetDLM) returns its reveal order
            raise RuntimeError(f"{fam.family}'s bound returned no reveal order")
        hit = lp.argmax(-1) == batch.input_ids.gather(1, out.order)  # setdlm: (B, L) by rank
        return out.nll, torch.zeros_like(hit).scatter(1, out.order, hit)


class _Capture(nn.Module):
    """The backbone, keeping its last logits (to read argmaxes next to the bound)."""

    def __init__(self, backbone: Backbone):
        super().__init__()
        self.backbone = backbone
        self.logits: Tensor | None = None
        self.training = backbone.training  # the backbone's mode, as it is (no train() of its modules)

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None,
                attn_mask: Tensor | MaskRule | None = None, cache: KVCache | None = None, *,
                keep: int | Tensor | None = None, logits_start: int = 0) -> Tensor:
        self.logits = self.backbone(input_ids, position_ids, attn_mask, cache, keep=keep, logits_start=logits_start)
        return self.logits

    def new_cache(self, batch: int, capacity: int = 64) -> KVCache:
        return self.backbone.new_cache(batch, capacity)

    def num_parameters(self) -> int:
        return self.backbone.num_parameters()


def main(argv: list[str] | None = None) -> int:
    """``python -m setdlm.evaluation.harness ARGS``: lm-eval's command line with the ``setdlm`` model registered."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
