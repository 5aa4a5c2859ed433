"""A real server on 127.0.0.1 for the serve tests: uvicorn in a thread, stopped at the end."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(model, name: str = "m", *, grace: float | None = None, **kwargs):
    """Serve ``model`` on a free loopback port; yields (base url, app). ``app.state.server`` is the uvicorn
    server (``should_exit = True`` is what SIGTERM does); ``grace``: its shutdown grace period."""
    import uvicorn

    from setdlm.serve import create_app

    app = create_app(model, name, **kwargs)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                          timeout_graceful_shutdown=grace))
    app.state.server = server
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=20)
