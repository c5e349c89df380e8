"""The edge: the `gpuplan` CLI and the HTTP service. Nothing imports this package."""
