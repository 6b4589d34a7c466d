"""graphspec: speculative decoding as a compiler. Public surface: compile, Runtime, SpecConfig.

They resolve on first use (PEP 562): compile and Runtime import torch and transformers (seconds), and
`graphspec --help` or a bad command line should not wait for that. Modules that need the graphspec:: ops
import graphspec.ops themselves; importing the package registers nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from graphspec.version import __version__

if TYPE_CHECKING:
    from graphspec.compiler import compile
    from graphspec.config import SpecConfig
    from graphspec.runtime.runtime import Runtime

__all__ = ["Runtime", "SpecConfig", "__version__", "compile"]

# public name -> the module that defines it
_LAZY = {"compile": "graphspec.compiler", "Runtime": "graphspec.runtime.runtime", "SpecConfig": "graphspec.config"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
