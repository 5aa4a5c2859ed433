"""The ASGI app: OpenAI-compatible endpoints over one model's decoding loop, and the decode-order page
(docs/serve.md). Starlette and uvicorn come with the optional extra ``setdlm[serve]``.

Routes: ``GET /`` (the page), ``GET /health``, ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions``. Errors answer in OpenAI's shape (:class:`~setdlm.serve.schemas.APIError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from importlib import resources

from ..decoding.output import step_record
from ..decoding.session import prepare
from .batching import Batcher, Job, QueueFull
from .responses import FINISH, TextStream, chunk, completion, new_id, summary, usage
from .schemas import APIError, parse_request


def create_app(model, name: str, *, max_batch: int = 16, max_queue: int = 64, timeout: float = 300.0):
    """The Starlette app serving ``model`` under the id ``name``; its decoding loop starts with the app."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, StreamingResponse
    from starlette.routing import Route

    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    batcher = Batcher(model, max_batch=max_batch, max_queue=max_queue)
    created = int(time.time())
    page = resources.files("setdlm.serve").joinpath("static/index.html").read_text(encoding="utf-8")

    async def index(request: Request):
        return HTMLResponse(page)

    async def health(request: Request):
        return JSONResponse({"status": "ok", "model": name, "family": model.family.family,
                             "context_length": batcher.width, **batcher.stats()})

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "setdlm",
             "family": model.family.family, "context_length": batcher.width}]})

    async def complete(request: Request, chat: bool):
        req = parse_request(await request.body(), chat=chat, model=model, model_name=name, width=batcher.width)
        try:
            row = prepare(model, req.prompt_ids, req.settings, width=batcher.width, seed=req.seed)
        except ValueError as e:
            raise APIError(400, str(e).splitlines()[0]) from None
        loop = asyncio.get_running_loop()
        job = Job(row, loop, asyncio.Queue(), deadline=time.monotonic() + timeout, stream=req.stream)
        try:
            batcher.submit(job)
        except QueueFull as e:
            raise APIError(429, f"{e}; retry shortly", type="rate_limit_error", headers={"Retry-After": "1"}) from None
        rid = new_id(chat)
        if req.stream:
            return StreamingResponse(_stream(job, req, rid), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            ev = await _until_done(request, job)
        finally:
            if not job.finished:
                batcher.cancel(job)
        return JSONResponse(completion(chat, rid, name, ev.done, len(req.prompt_ids), _seconds(job), row.seed))

    async def _until_done(request: Request, job: Job):
        """Wait for the job's last event; a client that goes away (checked twice a second) cancels it."""
        checked = time.monotonic()
        while True:
            try:
                kind, item = await asyncio.wait_for(job.queue.get(), timeout=0.5)
            except TimeoutError:
                kind = item = None
            if time.monotonic() - checked >= 0.5:
                checked = time.monotonic()
                if await request.is_disconnected():
                    raise APIError(499, "the client closed the request")
            if kind == "error":
                job.finished = True
                raise APIError(item[0], item[1], type="server_error")  # the batcher's errors: 500, 504
            if kind == "step" and item.done is not None:
                job.finished = True
                return item

    async def _stream(job: Job, req, rid: str):
        text = TextStream(model.tokenizer, job.row)
        try:
            if req.chat:
                yield _sse(chunk(True, rid, name, "", role=True))
            while True:
                kind, item = await job.queue.get()
                if kind == "error":
                    job.finished = True
                    yield _sse(APIError(item[0], item[1], type="server_error").body())
                    break
                step = step_record(item.trace, item.step, job.row.prompt_length, model.tokenizer)
                delta = text.update(item.trace)
                done = item.done
                if done is None:
                    yield _sse(chunk(req.chat, rid, name, delta, step=step))
                    continue
                job.finished = True
                delta += text.finish(done.text)
                last = chunk(req.chat, rid, name, delta, finish=FINISH[done.finish_reason], step=step | summary(
                    done, _seconds(job), job.row.seed))
                last["usage"] = usage(len(req.prompt_ids), done)
                yield _sse(last)
                break
            yield "data: [DONE]\n\n"
        finally:  # also when the client disconnects mid-stream (the generator is closed)
            if not job.finished:
                batcher.cancel(job)

    async def completions(request: Request):
        return await complete(request, chat=False)

    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    async def api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    async def not_found(request: Request, exc):
        status = getattr(exc, "status_code", 404)
        return JSONResponse(APIError(status, f"{request.method} {request.url.path}: "
                                             f"{getattr(exc, 'detail', 'not found')}").body(), status_code=status)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        batcher.start()
        try:
            yield
        finally:
            batcher.stop()

    routes = [Route("/", index), Route("/health", health), Route("/v1/models", models),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={APIError: api_error, 404: not_found, 405: not_found})
    app.state.batcher = batcher
    return app


def _seconds(job: Job) -> float:
    """Seconds since the job joined the batch (its events come only after that)."""
    return time.monotonic() - job.admitted


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


def serve(model_path: str, *, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 16, max_queue: int = 64,
          timeout: float = 300.0, device: str = "cpu", name: str | None = None, log_level: str = "info",
          quantize: str | None = None) -> None:
    """Load a model (anything ``setdlm.load`` accepts, or a shipped model's name) and serve it until
    interrupted."""
    try:
        import uvicorn
    except ImportError:
        raise ValueError("serving needs the optional extra: pip install 'setdlm[serve]'") from None
    from ..loading import load

    model = load(model_path, device=device, quantize=quantize)
    app = create_app(model, name or _model_name(model_path), max_batch=max_batch, max_queue=max_queue,
                     timeout=timeout)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


def _model_name(path: str) -> str:
    return str(path).rstrip("/").split("/")[-1] or str(path)
