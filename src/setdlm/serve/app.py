"""The ASGI app: OpenAI-compatible endpoints over one model's decoding loop, and the decode-order page
(docs/serve.md). Starlette and uvicorn come with the optional extra ``setdlm[serve]``.

Routes: ``GET /`` (the page), ``GET /health``, ``GET /v1/models``, ``GET /v1/models/{id}``,
``POST /v1/completions``, ``POST /v1/chat/completions`` (:mod:`setdlm.serve.completions`), ``POST /tokenize``
and ``POST /detokenize`` (vLLM's, :mod:`setdlm.serve.tokens`). Errors answer in OpenAI's shape
(:class:`~setdlm.serve.schemas.APIError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from importlib import resources
from typing import TYPE_CHECKING

from ..decoding.settings import family_settings
from ..decoding.structured.constraint import ConstraintCompiler
from ..errors import UserError
from ..formats.loading import load
from . import tokens
from .batching import Batcher
from .completions import Completions
from .guard import Guard, log, read_json_body
from .options import ServeOptions
from .schemas import APIError, parse_request

if TYPE_CHECKING:  # the optional extra setdlm[serve]: imported where used
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response


class Server:
    """One served model: ``model`` under the id ``name`` with ``options`` (its limits, and the ``Host`` names
    answered: :attr:`ServeOptions.allowed_hosts`), its decoding loop (:class:`~setdlm.serve.batching.Batcher`)
    and completion endpoints (:class:`~setdlm.serve.completions.Completions`); each route is a method.
    ``compiler``: the :class:`~setdlm.decoding.structured.constraint.ConstraintCompiler` of its structured outputs
    (bounds, cache, compiling processes; default the library's). :meth:`app` is the Starlette app, whose
    lifespan starts and stops the decoding loop."""

    def __init__(self, model, name: str, options: ServeOptions | None = None,
                 compiler: ConstraintCompiler | None = None):
        self.model, self.name = model, name
        self.options = options if options is not None else ServeOptions()
        self.batcher = Batcher(model, self.options)
        self.completions = Completions(model, name, self.batcher, self.options, compiler)
        self.created = int(time.time())
        self.page = resources.files("setdlm.serve").joinpath("static/index.html").read_text(encoding="utf-8")
        self.takes = family_settings(model.family)  # the page sends only these of its family-specific settings

    # -- routes ------------------------------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        from starlette.responses import HTMLResponse  # the optional extra setdlm[serve], as in app()

        return HTMLResponse(self.page)

    async def health(self, request: Request) -> Response:
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "ok", "model": self.name, "family": self.model.family.family,
                             "dtype": self.model.dtype, "context_length": self.batcher.width, **self.batcher.stats(),
                             "compiling": self.completions.waiting})

    def card(self) -> dict:
        """The served model as ``/v1/models`` lists it."""
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "setdlm",
                "family": self.model.family.family, "context_length": self.batcher.width,
                "max_model_len": self.batcher.width, "settings": self.takes}

    async def models(self, request: Request) -> Response:
        from starlette.responses import JSONResponse

        return JSONResponse({"object": "list", "data": [self.card()]})

    async def one_model(self, request: Request) -> Response:
        from starlette.responses import JSONResponse

        if request.path_params["model"] != self.name:
            raise APIError(404, f"model {request.path_params['model'][:80]!r} not found; this server serves "
                                f"{self.name!r}", "model", code="model_not_found")
        return JSONResponse(self.card())

    async def tokenize(self, request: Request) -> Response:
        return await self._tokenizer(request, tokens.tokenize)

    async def detokenize(self, request: Request) -> Response:
        return await self._tokenizer(request, tokens.detokenize)

    async def _tokenizer(self, request: Request, fn) -> Response:
        """``fn(model, name, body, width)`` in a worker thread (vLLM's ``/tokenize``, ``/detokenize``)."""
        from starlette.responses import JSONResponse, Response

        raw = await read_json_body(request, self.options.max_body)
        if raw is None:
            return Response(status_code=400)
        return JSONResponse(await asyncio.to_thread(fn, self.model, self.name, raw, self.batcher.width))

    async def completion(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def chat_completion(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def _complete(self, request: Request, chat: bool) -> Response:
        from starlette.responses import Response

        raw = await read_json_body(request, self.options.max_body)
        if raw is None:  # the client went away mid-body (logged); there is no one to answer
            return Response(status_code=400)
        arrived = time.monotonic()
        req = await asyncio.to_thread(parse_request, raw, chat=chat, model=self.model, model_name=self.name,
                                      width=self.batcher.width)  # tokenizing a long prompt blocks no one
        return await self.completions.answer(request, req, arrived)

    # -- the app -----------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette):
        self.batcher.start()
        try:
            yield
        finally:
            self.batcher.stop()
            self.completions.compiling.shutdown(wait=False, cancel_futures=True)

    def routes(self) -> list:
        from starlette.routing import Route

        return [Route("/", self.index), Route("/favicon.ico", _favicon), Route("/health", self.health),
                Route("/v1/models", self.models), Route("/v1/models/{model:path}", self.one_model),
                Route("/v1/completions", self.completion, methods=["POST"]),
                Route("/v1/chat/completions", self.chat_completion, methods=["POST"]),
                Route("/tokenize", self.tokenize, methods=["POST"]),
                Route("/detokenize", self.detokenize, methods=["POST"])]

    def app(self) -> Starlette:
        """The Starlette app of these routes behind the :class:`~setdlm.serve.guard.Guard` (Starlette and
        uvicorn come with the optional extra ``setdlm[serve]``)."""
        from starlette.applications import Starlette
        from starlette.middleware import Middleware

        guard = Middleware(Guard, allowed=self.options.allowed_hosts, api_key=self.options.api_key)
        app = Starlette(routes=self.routes(), lifespan=self.lifespan, middleware=[guard],
                        # starlette types every handler as taking any Exception; _api_error gets the APIErrors only
                        exception_handlers={APIError: _api_error, 404: _not_found, 405: _not_found})  # type: ignore[dict-item]
        app.state.batcher, app.state.name, app.state.family = self.batcher, self.name, self.model.family.family
        return app


def create_app(model, name: str, options: ServeOptions | None = None,
               compiler: ConstraintCompiler | None = None) -> Starlette:
    """The Starlette app serving ``model`` under the id ``name`` with ``options`` (its limits, and the ``Host``
    names answered: :attr:`ServeOptions.allowed_hosts`); its decoding loop starts with the app. ``compiler``:
    the :class:`~setdlm.decoding.structured.constraint.ConstraintCompiler` of its structured outputs (bounds, cache,
    compiling processes; default the library's). The app of a :class:`Server`."""
    return Server(model, name, options, compiler).app()


async def _favicon(request):  # the page names none (its icon is empty); other clients ask anyway
    from starlette.responses import Response

    return Response(status_code=204)


async def _api_error(request, exc: APIError):
    from starlette.responses import JSONResponse

    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _not_found(request, exc):
    from starlette.responses import JSONResponse

    status = getattr(exc, "status_code", 404)
    return JSONResponse(APIError(status, f"{request.method} {request.url.path}: "
                                         f"{getattr(exc, 'detail', 'not found')}").body(), status_code=status)


def serve(model_path: str, options: ServeOptions | None = None, *, device: str = "cpu", name: str | None = None,
          log_level: str = "info", quantize: str | None = None, dtype: str | None = None) -> None:
    """Load a model (anything ``setdlm.load`` accepts, or a shipped model's name) and serve it with ``options``
    until interrupted. On loopback only the ``Host`` names of :data:`~setdlm.serve.guard.LOOPBACK_HOSTS` and
    ``options.allow_hosts`` are answered; bound elsewhere, any (with a warning). SIGTERM or Ctrl-C: no new
    connections, requests in flight get ``options.grace`` seconds to finish, then the server exits."""
    try:
        import uvicorn
    except ImportError:
        raise UserError("serving needs the optional extra: pip install 'setdlm[serve]'") from None
    options = options if options is not None else ServeOptions()
    check_listen(options.host, options.port)  # before the model loads: a busy port is one line, not minutes later
    if options.allowed_hosts is None and options.api_key is None:
        log.warning("listening on %s: every interface is served and every machine that reaches it can use this "
                    "server (no authentication); pass --api-key KEY (clients send 'Authorization: Bearer KEY') or "
                    "bind 127.0.0.1", options.host)
    elif options.allowed_hosts is None:
        log.warning("listening on %s: every interface is served; requests to /v1/* need the API key", options.host)
    model = load(model_path, device=device, dtype=dtype, quantize=quantize)
    app = create_app(model, name or _model_name(model_path), options)
    config = uvicorn.Config(app, host=options.host, port=options.port, log_level=log_level,
                            # uvicorn annotates an int but hands it to asyncio.timeout, which takes any float
                            timeout_graceful_shutdown=options.grace)  # type: ignore[arg-type]
    server = server_class()(config)
    server.run()
    if not server.started:  # as uvicorn.run: the startup failed (its log says why)
        raise SystemExit(3)


def server_class():
    """uvicorn's ``Server``, which says where it serves once it listens (the model, the decode-order page and
    the API) and, at SIGTERM / Ctrl-C, ends the requests still running just before the grace period runs
    out: a stream gets an error event as its last, any other request a 503, instead of a connection cut with
    neither an error nor ``[DONE]``."""
    import uvicorn  # the optional extra setdlm[serve], as Starlette in create_app

    class UvicornServer(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            app = self.config.app
            for server in self.servers if self.started else []:
                host, port = server.sockets[0].getsockname()[:2]
                host = f"[{host}]" if ":" in host else host
                logging.getLogger("uvicorn.error").info(
                    "serving %s (%s, context %d): the decode-order page at http://%s:%d/, the API at /v1",
                    app.state.name, app.state.family, app.state.batcher.width, host, port)
                break

        async def shutdown(self, sockets=None):
            grace = self.config.timeout_graceful_shutdown
            batcher = getattr(getattr(self.config.app, "state", None), "batcher", None)
            timer = None
            if grace is not None and batcher is not None:  # a moment before uvicorn cancels what still runs
                timer = asyncio.get_running_loop().call_later(
                    max(grace - min(1.0, grace / 10), 0), batcher.abort, 503,
                    "the server shut down before this request finished (setdlm serve --grace)")
            try:
                await super().shutdown(sockets)
            finally:
                if timer is not None:
                    timer.cancel()

    return UvicornServer


def check_listen(host: str, port: int) -> None:
    """Raise a UserError (one line) unless a server can listen on ``host:port`` (both checked by
    :class:`ServeOptions`)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise UserError(f"host {host!r}: not an address of this machine ({e})") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind(addr)
        except OSError as e:
            raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def _model_name(path: str) -> str:
    return str(path).rstrip("/").split("/")[-1] or str(path)
