"""The server's options (docs/serve.md, "Limits and safety"): one frozen :class:`ServeOptions`, checked once
when it is made. ``setdlm serve`` builds it from its flags (one flag per field: ``--max-body-mb``);
:func:`~setdlm.serve.serve`, :func:`~setdlm.serve.create_app` and the batcher take it as it is."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UserError
from .guard import LOOPBACK_HOSTS, is_loopback


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class ServeOptions:
    """Where the server listens and what it accepts; a bad value is a :class:`~setdlm.errors.UserError`
    naming its field."""

    host: str = "127.0.0.1"  # the address to listen on
    port: int = 8000  # 0: any free port
    max_batch: int = 16  # rows decoded together at most
    max_queue: int = 64  # requests waiting beyond the free rows at most (more get 429); 0: none wait
    timeout: float = 300.0  # seconds a request may take
    max_body_mb: float = 4.0  # request body limit in MiB (more gets 413)
    allow_hosts: tuple[str, ...] = ()  # on loopback, Host names answered besides LOOPBACK_HOSTS
    grace: float = 30.0  # on SIGTERM / Ctrl-C, seconds requests in flight get to finish
    api_key: str | None = None  # requests to /v1/* must send "Authorization: Bearer <api_key>" (vLLM's --api-key)

    def __post_init__(self):
        checks = {
            "host": (isinstance(self.host, str) and self.host != "", "must name an address, got {!r}"),
            "port": (_integer(self.port) and 0 <= self.port <= 65535, "must be an integer in [0, 65535], got {!r}"),
            "max_batch": (_integer(self.max_batch) and self.max_batch >= 1, "must be >= 1, got {!r}"),
            "max_queue": (_integer(self.max_queue) and self.max_queue >= 0, "must be >= 0, got {!r}"),
            "timeout": (_number(self.timeout) and self.timeout > 0, "must be > 0 seconds, got {!r}"),
            "max_body_mb": (_number(self.max_body_mb) and self.max_body >= 1, "must be > 0 (MiB), got {!r}"),
            "allow_hosts": (isinstance(self.allow_hosts, tuple) and all(isinstance(h, str) and h
                                                                        for h in self.allow_hosts),
                            "must be a tuple of host names, got {!r}"),
            "grace": (_number(self.grace) and self.grace >= 0, "must be a number of seconds >= 0, got {!r}"),
            "api_key": (self.api_key is None or (isinstance(self.api_key, str) and self.api_key.strip() == self.api_key
                                                 and len(self.api_key) >= 8),
                        "must be a string of at least 8 characters without surrounding spaces, got {!r}"),
        }
        for name, (ok, rule) in checks.items():
            if not ok:
                raise UserError(f"{name} {rule.format(getattr(self, name))}", fields=(name,))

    @property
    def max_body(self) -> int:
        """The request body limit in bytes."""
        return int(self.max_body_mb * 2**20)

    @property
    def allowed_hosts(self) -> tuple[str, ...] | None:
        """The ``Host`` names answered: on loopback :data:`~setdlm.serve.guard.LOOPBACK_HOSTS` and
        ``allow_hosts`` (against DNS rebinding); bound elsewhere, any (None)."""
        if not is_loopback(self.host):
            return None
        return LOOPBACK_HOSTS + tuple(h.lower() for h in self.allow_hosts)
