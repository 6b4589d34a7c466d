"""Kernel tests run on CUDA when there is a GPU, else on the CPU under the Triton interpreter
(see tests/kernels/interpret.py for why this cannot be a plain environment variable here)."""

from __future__ import annotations

from tests.kernels.interpret import use_interpreter

use_interpreter()
