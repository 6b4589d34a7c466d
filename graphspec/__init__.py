"""graphspec: speculative decoding as a compiler. Public surface: compile, Runtime, SpecConfig."""

from graphspec import ops as _ops  # noqa: F401 - registers the graphspec:: custom ops
from graphspec.compiler import compile
from graphspec.config import SpecConfig
from graphspec.runtime.runtime import Runtime

__all__ = ["Runtime", "SpecConfig", "compile"]
__version__ = "0.1.0"
