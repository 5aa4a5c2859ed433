"""``setdlm serve``: an OpenAI-compatible server with set streaming, continuous batching and a live
decode-order page (docs/serve.md). Needs the optional extra ``setdlm[serve]`` (Starlette, uvicorn)."""

from .app import Server, create_app, serve
from .options import ServeOptions

__all__ = ["ServeOptions", "Server", "create_app", "serve"]
