"""What the server checks before a request reaches the model (docs/serve.md, "Limits and safety"): the
``Host`` header (an allow-list when bound to loopback, against DNS rebinding; :class:`Guard`), a JSON
content type on every POST (so that a web page cannot send a CORS-simple form post), and the body size
(413 beyond the limit, read in pieces so that an oversized body is never held whole).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging

from .schemas import APIError

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")  # Host names a loopback server answers by default

log = logging.getLogger("setdlm.serve")


def is_loopback(host: str) -> bool:
    """Is ``host`` (an address to bind) a loopback address or ``localhost``?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name of a ``Host`` header, without its port: ``"[::1]:8000"`` → ``"::1"``."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """ASGI middleware: 403 to a request whose ``Host`` is not in ``allowed`` (None: any host), 401 to a request
    to ``/v1/*`` without ``Authorization: Bearer <api_key>`` when there is a key (vLLM's rule); a request cut by
    the end of the shutdown grace period (its task cancelled) is one log line, not a traceback."""

    def __init__(self, app, allowed: tuple[str, ...] | None, api_key: str | None = None):
        self.app, self.allowed, self.api_key = app, allowed, api_key

    async def __call__(self, scope, receive, send):
        started = False

        async def sending(message):
            nonlocal started
            started = True
            await send(message)

        try:
            await self._call(scope, receive, sending)
        except asyncio.CancelledError:
            if scope["type"] != "http":
                raise
            log.warning("%s %s: cut off, the server shut down before it finished (setdlm serve --grace)",
                        scope["method"], scope["path"])
            if not started:
                from starlette.responses import JSONResponse

                err = APIError(503, "the server shut down before this request finished", type="server_error")
                await JSONResponse(err.body(), status_code=503)(scope, receive, send)

    async def _call(self, scope, receive, send):
        if scope["type"] == "http" and self.allowed is not None:
            header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if host_name(header).lower() not in self.allowed:
                from starlette.responses import JSONResponse

                err = APIError(403, f"Host header {header[:80]!r} is not allowed: this server answers "
                                    f"{', '.join(self.allowed)} (setdlm serve --allow-host NAME adds one)", "Host",
                               code="host_not_allowed")
                return await JSONResponse(err.body(), status_code=403)(scope, receive, send)
        if scope["type"] == "http" and self.api_key is not None and scope["path"].startswith("/v1/") and \
                not authorized(dict(scope["headers"]).get(b"authorization", b""), self.api_key):
            from starlette.responses import JSONResponse

            err = APIError(401, "a valid API key is needed: send the header 'Authorization: Bearer <key>' (setdlm "
                                "serve --api-key)", type="authentication_error", code="invalid_api_key")
            return await JSONResponse(err.body(), status_code=401, headers={"WWW-Authenticate": "Bearer"})(
                scope, receive, send)
        await self.app(scope, receive, send)


def authorized(header: bytes, key: str) -> bool:
    """Does the ``Authorization`` header carry ``Bearer <key>``? (compared in constant time)"""
    scheme, _, token = header.decode("latin-1").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


async def read_json_body(request, limit: int) -> bytes | None:
    """The body of a POST, checked: JSON content type (415), at most ``limit`` bytes (413, refused from the
    ``Content-Length`` before reading, or as soon as the pieces read exceed it). None when the client went
    away before sending all of it (logged in one line)."""
    from starlette.requests import ClientDisconnect

    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise APIError(415, f"Content-Type must be application/json, got {kind[:60]!r}", "Content-Type")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"the body is {int(declared):,} bytes; the limit is {limit:,} (setdlm serve "
                            "--max-body-mb)", code="body_too_large")
    parts, size = [], 0
    try:
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise APIError(413, f"the body exceeds the limit of {limit:,} bytes (setdlm serve --max-body-mb)",
                               code="body_too_large")
            parts.append(part)
    except ClientDisconnect:
        client = request.client
        log.warning("%s: the client went away after sending %d bytes of its body; nothing was decoded",
                    f"{client.host}:{client.port}" if client else "a client", size)
        return None
    return b"".join(parts)
