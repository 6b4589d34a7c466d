"""`graphspec serve ARTIFACT`: an OpenAI-compatible HTTP server over a Runtime's continuous-batching
engine. Needs the optional `serve` extra (pip install 'graphspec[serve]': fastapi, uvicorn,
prometheus-client); importing graphspec never imports this package."""

from __future__ import annotations

import gc
import socket
from pathlib import Path
from typing import Any

from graphspec.errors import InputError


def serve(
    artifact: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    chat_template: str | None = None,
    markers: Any = None,
    allow_mismatch: bool = False,
    runtime_options: dict[str, Any] | None = None,
    api_key: str | None = None,
) -> None:
    """Bind host:port, load the artifact (compiling or capturing every step before it listens) and serve
    it until interrupted. runtime_options: Runtime's own (compile_cpu, cpu_draft_dtype). api_key: required
    on every request but /health and /metrics (None: open)."""
    import uvicorn

    from graphspec.runtime.runtime import Runtime
    from graphspec.serve.app import create_app

    with bound_socket(host, port) as sock:
        runtime = Runtime.load(artifact, allow_mismatch=allow_mismatch, **(runtime_options or {}))
        phases = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in runtime.startup_seconds.items())
        where = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        print(f"graphspec serve: {artifact} ready on {where} ({phases})", flush=True)
        app = create_app(runtime, model_name or Path(artifact).resolve().name, chat_template, markers, api_key)
        # The loaded graphs are hundreds of thousands of objects this process keeps until it exits. Frozen
        # (after one last collection), the collector's full passes while serving no longer walk them: one
        # such pass over an 8B pair's graphs took 0.31 s on a CPU, a stall of every request in flight.
        gc.collect()
        gc.freeze()
        uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info")).run(sockets=[sock])


def bound_socket(host: str, port: int) -> socket.socket:
    """The server's TCP socket, bound as uvicorn binds its own (Config.bind_socket) but before the artifact
    loads: a port already in use or an address this machine does not have is refused at once, not after a
    start-up of seconds to minutes."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise InputError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    sock.set_inheritable(True)
    return sock
