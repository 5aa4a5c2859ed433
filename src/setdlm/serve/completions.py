"""``/v1/completions`` and ``/v1/chat/completions``: a request's choices (``n`` per prompt, a completions
request's list of prompts) decoded as rows of the batcher, answered whole or streamed (docs/serve.md).

Choice ``i = prompt * n + sample`` (OpenAI's order) is the row of its prompt decoded with the request's
settings and seed, sample ``j > 0`` with ``derive_seed(seed, j)``: each choice is what that row gives alone
(:func:`setdlm.decoding.generate` with that seed), whatever else is in the batch.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from ..decoding.structured import constraint
from ..decoding.output import step_record
from ..decoding.session import RowDone, prepare
from ..seeds import derive_seed
from .batching import Batcher, Event, Failed, Gone, Job, QueueFull, Stepped
from .logprobs import Committed, TokenLogprob, chat_logprobs, completion_logprobs, prompt_logprobs
from .options import ServeOptions
from .responses import TextStream, choice, chunk, completion, extension, finish_reason, new_id, summary, usage
from .schemas import APIError, CompletionRequest, param_of
from .tools import answer as tool_answer


class Completions:
    """The completion endpoints of one served ``model`` (id ``name``) over its ``batcher``."""

    def __init__(self, model, name: str, batcher: Batcher, options: ServeOptions,
                 compiler: constraint.ConstraintCompiler | None = None):
        self.model, self.name, self.batcher, self.options = model, name, batcher, options
        self.compiler = compiler if compiler is not None else constraint.DEFAULT_COMPILER  # the app's constraints
        self.compilers = max(1, self.compiler.bounds.workers)
        self.compiling = ThreadPoolExecutor(max_workers=self.compilers, thread_name_prefix="compile")
        self.waiting = 0  # requests with a constraint in or queued for ``compiling``

    # -- rows -------------------------------------------------------------------------------------------------

    def _prepared(self, req: CompletionRequest, index: int, deadline: float):
        """Choice ``index``'s prepared row (with a constraint: compiled within what ``deadline`` leaves)."""
        p, j = req.choices()[index]
        seed = req.seed if j == 0 or req.seed is None else derive_seed(req.seed, j)
        try:
            with constraint.time_limit(deadline - time.monotonic()):
                row = prepare(self.model, req.prompts[p], req.settings, width=self.batcher.width, seed=seed,
                              suffix=req.suffix, compiler=self.compiler)
        except (ValueError, TypeError) as e:  # a constraint no output can meet names the field that asked it
            about = req.constraint_param if req.settings.constraint is not None and \
                repr(req.settings.constraint) in str(e) else None
            raise APIError(400, str(e).splitlines()[0], param_of(e, about)) from None
        if req.logprobs:  # the trace records each query's alternatives
            row = replace(row, config=replace(row.config, top_logprobs=req.logprobs))
        return row

    async def _rows(self, req: CompletionRequest, arrived: float) -> list:
        rows = []
        for i in range(len(req.choices())):
            if req.settings.constraint is None:  # tokenizing a long prompt blocks no one
                rows.append(await asyncio.to_thread(self._prepared, req, i, arrived + self.options.timeout))
                continue
            # compiling a constraint (seconds, bounded) holds its own pool, never the one parsing requests
            if self.waiting >= self.options.max_queue + self.compilers:
                raise APIError(429, f"{self.waiting} constrained requests are compiling or waiting to; retry shortly",
                               type="rate_limit_error", headers={"Retry-After": "1"})
            self.waiting += 1
            try:
                rows.append(await asyncio.get_running_loop().run_in_executor(
                    self.compiling, self._prepared, req, i,
                    arrived + min(self.options.timeout, self.compiler.bounds.seconds)))
            finally:
                self.waiting -= 1
        return rows

    # -- a request ---------------------------------------------------------------------------------------------

    async def answer(self, request, req: CompletionRequest, arrived: float):
        """The response to a parsed request: JSON, or a streaming response."""
        from starlette.responses import JSONResponse, StreamingResponse

        limit = self.options.max_batch + self.options.max_queue
        if len(req.choices()) > limit:
            raise APIError(400, f"{len(req.choices())} choices (n times the prompts) are more than this server takes "
                                f"at once ({limit}: --max-batch + --max-queue)", "n" if req.n > 1 else "prompt")
        loop = asyncio.get_running_loop()
        echoed = None  # each prompt's log-probabilities
        if req.echo is not None and req.logprobs is not None:  # one forward in the decoding thread, between steps
            echoed = await self.batcher.call(lambda: prompt_logprobs(self.model, req.prompts, req.logprobs), loop)
        rid = new_id(req.chat)
        if req.max_tokens == 0:  # the prompt alone
            if req.stream:
                return StreamingResponse(self._echo_stream(req, rid, echoed), media_type="text/event-stream")
            return JSONResponse(self._echo_only(req, rid, echoed))
        rows = await self._rows(req, arrived)
        queue: asyncio.Queue[Event] = asyncio.Queue()
        jobs = [Job(row, loop, queue, deadline=time.monotonic() + self.options.timeout, stream=req.stream, choice=i)
                for i, row in enumerate(rows)]
        try:
            self.batcher.submit_all(jobs)
        except QueueFull as e:
            raise APIError(429, f"{e}; retry shortly", type="rate_limit_error", headers={"Retry-After": "1"}) from None
        watch = asyncio.create_task(self._watch_disconnect(request, jobs, queue))
        if req.stream:
            return StreamingResponse(self._stream(jobs, queue, req, rid, watch, echoed), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            done = await _until_done(jobs, queue)
        finally:
            watch.cancel()
            self._cancel(jobs)
        return JSONResponse(self._body(req, rid, jobs, done, echoed))

    def _cancel(self, jobs: list[Job]) -> None:
        for job in jobs:
            if not job.finished:
                self.batcher.cancel(job)

    async def _watch_disconnect(self, request, jobs: list[Job], queue: asyncio.Queue[Event]):
        """Wait for the ASGI disconnect message (the body is read, so ``receive`` has nothing else to say):
        a client that goes away, streaming or not, cancels its jobs, whose rows leave before the next step."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self._cancel(jobs)
        queue.put_nowait(Gone())

    # -- whole answers -----------------------------------------------------------------------------------------

    def _body(self, req: CompletionRequest, rid: str, jobs: list[Job], done: list, echoed) -> dict:
        constrained = req.settings.constraint is not None
        choices, summaries = [], []
        text: str | None  # None: chat's content beside its tool calls
        for job, d in zip(jobs, done):
            p, _ = req.choices()[job.choice]
            echo = req.echo[p] if req.echo is not None else ""
            entries = self._generated(job, d) if req.logprobs is not None else None
            lp = None
            if entries is not None:
                lp = (chat_logprobs(self.model.tokenizer, entries) if req.chat else
                      completion_logprobs(self.model.tokenizer, (echoed[p] if echoed else []) + entries))
            text, finish, calls = echo + (d.text or ""), finish_reason(d, constrained), None
            if req.tools is not None:  # a call or {"content": text}: a whole document
                text, calls = tool_answer(d.text)
                finish = "tool_calls" if calls else finish
            choices.append(choice(req.chat, job.choice, text, finish, lp, calls))
            summaries.append(self._summary(job, d, entries))
        counts = usage(req.prompt_tokens, sum(len(d.tokens) for d in done))
        return completion(req.chat, rid, self.name, choices, counts, extension(summaries))

    @staticmethod
    def _generated(job: Job, done) -> list[TokenLogprob]:
        """The logprobs of a finished choice's tokens (an ending EOS included: lm-eval reads the last entry as
        the generated token's)."""
        committed = Committed(job.row.prompt_length, job.row.config.top_logprobs)
        for trace in job.traces:
            committed.add(trace)
        return committed.tokens(0, len(done.tokens))

    @staticmethod
    def _summary(job: Job, done, entries: list[TokenLogprob] | None) -> dict:
        assert job.admitted is not None  # a finished job was admitted
        out = summary(done, time.monotonic() - job.admitted, job.row.seed)
        if entries is not None:  # the step that committed each token whose logprob is listed
            out["token_steps"] = [e.step for e in entries]
        return out

    def _echo_only(self, req: CompletionRequest, rid: str, echoed) -> dict:
        """``max_tokens: 0`` with ``echo``: each prompt's text (and its logprobs), nothing decoded."""
        assert req.echo is not None  # max_tokens 0 comes with echo (schemas)
        choices = [choice(False, i, req.echo[p], "length",
                          completion_logprobs(self.model.tokenizer, echoed[p]) if echoed else None)
                   for i, (p, _) in enumerate(req.choices())]
        return completion(False, rid, self.name, choices, usage(req.prompt_tokens, 0),
                          extension([summary(None, 0.0, None) for _ in choices]))

    # -- streams -------------------------------------------------------------------------------------------

    async def _echo_stream(self, req: CompletionRequest, rid: str, echoed):
        body = self._echo_only(req, rid, echoed)
        for i, c in enumerate(body["choices"]):
            last = chunk(False, rid, self.name, c["text"], finish="length", index=i, logprobs=c["logprobs"],
                         step=body["setdlm"])
            if i == len(body["choices"]) - 1:
                last["usage"] = body["usage"]
            yield _sse(last)
        yield "data: [DONE]\n\n"

    async def _stream(self, jobs: list[Job], queue: asyncio.Queue[Event], req: CompletionRequest, rid: str,
                      watch: asyncio.Task, echoed):
        streams = {job.choice: _ChoiceStream(self, req, job, echoed) for job in jobs}
        try:
            for s in streams.values():
                if (first := s.opening(rid)) is not None:
                    yield _sse(first)
            left, generated = len(jobs), 0
            while left:
                match await queue.get():
                    case Gone():
                        return
                    case Failed(job=job, status=status, message=message):
                        job.finished = True
                        yield _sse(APIError(status, message, type="server_error").body())
                        break
                    case Stepped(job=job, step=step):
                        body = streams[job.choice].event(rid, step)
                        if step.done is not None:
                            job.finished, left, generated = True, left - 1, generated + len(step.done.tokens)
                            if not left:
                                body["usage"] = usage(req.prompt_tokens, generated)
                        yield _sse(body)
            yield "data: [DONE]\n\n"
        finally:  # also when the client disconnects mid-stream (the generator is closed)
            watch.cancel()
            self._cancel(jobs)


class _ChoiceStream:
    """The chunks of one streamed choice: its final text so far (:class:`TextStream`) and, with logprobs,
    those of the tokens that text resolved."""

    def __init__(self, owner: Completions, req: CompletionRequest, job: Job, echoed):
        self.owner, self.req, self.job = owner, req, job
        self.prompt = req.choices()[job.choice][0]
        self.text = TextStream(owner.model.tokenizer, job.row)
        self.committed = Committed(job.row.prompt_length, job.row.config.top_logprobs) \
            if req.logprobs is not None else None
        self.sent = 0  # generated tokens whose logprobs were sent
        self.offset = 0  # characters sent (completions' text_offset)
        self.echoed = echoed[self.prompt] if echoed else []
        self.steps: list[int | None] = []  # the step that committed each token sent (TokenLogprob.step)

    def opening(self, rid: str) -> dict | None:
        """The first chunk: chat's role; completions' echoed prompt (and its logprobs); None: none."""
        req = self.req
        if req.chat:
            return chunk(True, rid, self.owner.name, "", role=True, index=self.job.choice)
        if req.echo is None:
            return None
        echo = req.echo[self.prompt]
        lp = self._format(self.echoed) if self.echoed else None  # counts the echo's characters
        if lp is None:
            self.offset += len(echo)
        return chunk(False, rid, self.owner.name, echo, index=self.job.choice, logprobs=lp)

    def event(self, rid: str, ev) -> dict:
        """The chunk of one step of the choice's row."""
        owner, job = self.owner, self.job
        step = step_record(ev.trace, ev.step, job.row.prompt_length, owner.model.tokenizer)
        delta = self.text.update(ev.trace)
        resolved = len(self.text.ids)
        finish = None
        if self.committed is not None:
            self.committed.add(ev.trace)
        if ev.done is not None:
            delta += self.text.finish(ev.done.text)
            resolved = len(ev.done.tokens)
            finish = finish_reason(ev.done, self.req.settings.constraint is not None)
            step |= owner._summary(job, ev.done, None)
        lp = None
        if self.committed is not None and resolved > self.sent:
            entries = self.committed.tokens(self.sent, resolved)
            self.sent, lp = resolved, self._format(entries)
            self.steps += [e.step for e in entries]
        if ev.done is not None and self.committed is not None:
            step["token_steps"] = self.steps
        content: str | None = delta  # None: chat's content beside its tool calls
        calls = None
        if self.req.tools is not None:  # the answer is JSON until it ends: sent whole, as a call or as text
            if ev.done is None:  # not ended: nothing yet
                content, calls = "", None
            else:
                content, calls = tool_answer(ev.done.text)
            finish = "tool_calls" if calls else finish
        return chunk(self.req.chat, rid, owner.name, content, finish=finish, step=step, index=job.choice, logprobs=lp,
                     tool_calls=calls)

    def _format(self, entries: list[TokenLogprob]) -> dict:
        tok = self.owner.model.tokenizer
        if self.req.chat:
            return chat_logprobs(tok, entries)
        out = completion_logprobs(tok, entries, self.offset)
        self.offset += sum(len(t) for t in out["tokens"])
        return out


async def _until_done(jobs: list[Job], queue: asyncio.Queue[Event]) -> list:
    """Wait for every job's last event; the finished rows in choice order."""
    done: dict[int, RowDone] = {}
    while len(done) < len(jobs):
        match await queue.get():
            case Gone():
                raise APIError(499, "the client closed the request")
            case Failed(job=job, status=status, message=message):  # the batcher's errors: 500, 503, 504
                job.finished = True
                raise APIError(status, message, type="server_error")
            case Stepped(job=job, step=step) if step.done is not None:
                job.finished = True
                done[job.choice] = step.done
    return [done[job.choice] for job in jobs]


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"
