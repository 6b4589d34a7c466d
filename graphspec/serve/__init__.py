"""`graphspec serve ARTIFACT`: an OpenAI-compatible HTTP server over a Runtime's continuous-batching
engine. Needs the optional `serve` extra (pip install 'graphspec[serve]': fastapi, uvicorn,
prometheus-client); importing graphspec never imports this package."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def serve(
    artifact: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    chat_template: str | None = None,
    markers: Any = None,
    allow_mismatch: bool = False,
    runtime_options: dict[str, Any] | None = None,
) -> None:
    """Load the artifact (compiling or capturing every step before it listens) and serve it until
    interrupted. runtime_options: Runtime's own (compile_cpu, cpu_draft_dtype)."""
    import uvicorn

    from graphspec.runtime.runtime import Runtime
    from graphspec.serve.app import create_app

    runtime = Runtime.load(artifact, allow_mismatch=allow_mismatch, **(runtime_options or {}))
    phases = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in runtime.startup_seconds.items())
    print(f"graphspec serve: {artifact} ready ({phases})", flush=True)
    name = model_name or Path(artifact).resolve().name
    uvicorn.run(create_app(runtime, name, chat_template, markers), host=host, port=port, log_level="info")
