"""A real server on 127.0.0.1 for the serve tests: uvicorn in a thread, stopped at the end; and the output
of a ``setdlm serve`` subprocess, read line by line. Tests wait on events these set, never on the clock."""

from __future__ import annotations

import contextlib
import socket
import threading


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_class():
    from setdlm.serve.app import server_class

    class Server(server_class()):
        """uvicorn's server, telling the test when it listens (``ready``: startup ended, ``started`` says
        whether it succeeded) and when it stopped listening (``closed``: SIGTERM's shutdown began)."""

        def __init__(self, config):
            super().__init__(config)
            self.ready, self.closed = threading.Event(), threading.Event()

        async def startup(self, sockets=None):
            try:
                await super().startup(sockets)
            finally:
                self.ready.set()

        async def shutdown(self, sockets=None):
            for s in self.servers:  # what uvicorn's shutdown does first (closing twice is a no-op)
                s.close()
            self.closed.set()
            await super().shutdown(sockets)

    return Server


@contextlib.contextmanager
def running(model, name: str = "m", *, grace: float | None = None, **options):
    """Serve ``model`` on a free loopback port with the :class:`~setdlm.serve.ServeOptions` ``options``; yields
    (base url, app). ``app.state.server`` is the uvicorn server (``should_exit = True`` is what SIGTERM does;
    its ``closed`` event is set once it stops listening); ``grace``: its shutdown grace period."""
    import uvicorn

    from setdlm.serve import ServeOptions, create_app

    app = create_app(model, name, ServeOptions(**options))
    port = free_port()
    server = _server_class()(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                            timeout_graceful_shutdown=grace))
    app.state.server = server
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    if not (server.ready.wait(60) and server.started):  # the timeout only turns a hang into a failure
        raise RuntimeError("the test server did not start")
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=20)


class Output:
    """The output of a subprocess (``setdlm serve``), read line by line in a thread: ``ready`` is set when a
    line holds ``mark`` (uvicorn's "Uvicorn running on": it listens) or the output ends (it died)."""

    def __init__(self, stream, mark: str = "Uvicorn running on"):
        self.mark, self.lines = mark, []
        self.ready, self.ended = threading.Event(), threading.Event()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in iter(stream.readline, b""):
            self.lines.append(line.decode(errors="replace"))
            if self.mark in self.lines[-1]:
                self.ready.set()
        self.ended.set()
        self.ready.set()

    def text(self) -> str:
        """Everything read so far (after the process exited and ``ended`` is set: all of it)."""
        return "".join(self.lines)


def post_json(url: str, body, path: str = "/v1/completions", headers: dict | None = None):
    """POST ``body`` (a dict, or raw bytes) to ``url + path``: ``(status, parsed JSON answer)``, errors included."""
    import json
    import urllib.error
    import urllib.request

    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def openai_client(url: str, api_key: str = "unused"):
    """The official openai client on the server at ``url`` (no retries: a failure shows at once)."""
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=60)
