"""Triton kernels, one op per file; installed as graphspec.kernels."""
