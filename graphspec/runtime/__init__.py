"""Runtime: buffers, per-bucket step graphs (captured on CUDA) and the generate loop."""
