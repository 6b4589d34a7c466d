"""graphspec: speculative decoding as a compiler. Public surface: compile, Runtime, SpecConfig."""

from graphspec import ops as _ops  # noqa: F401 - registers the graphspec:: custom ops
from graphspec.compiler import compile
from graphspec.config import SpecConfig
from graphspec.runtime.runtime import Runtime
from graphspec.version import __version__

__all__ = ["Runtime", "SpecConfig", "__version__", "compile"]
