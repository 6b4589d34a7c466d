"""graphspec/__init__.py: the public surface, resolved on first use (tests/test_cli.py checks that importing
the package and building the CLI's parser import no torch)."""

from __future__ import annotations

import pytest

import graphspec
from graphspec import compiler, config, version
from graphspec.runtime import runtime


def test_the_public_names_resolve_to_their_modules_objects():
    from graphspec import Runtime, SpecConfig, compile

    assert (graphspec.compile, graphspec.Runtime, graphspec.SpecConfig) == (compile, Runtime, SpecConfig)
    assert (compile, Runtime, SpecConfig) == (compiler.compile, runtime.Runtime, config.SpecConfig)
    assert graphspec.__version__ == version.__version__


def test_dir_lists_the_public_names():
    assert set(graphspec.__all__) == {"Runtime", "SpecConfig", "__version__", "compile"}
    assert set(graphspec.__all__) <= set(dir(graphspec))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Compiler'"):
        graphspec.Compiler  # noqa: B018
