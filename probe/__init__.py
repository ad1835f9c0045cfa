"""vllm-graph-probe: per-step CUDA/HIP-graph observability for vLLM."""

__version__ = "0.1.0"
"""The package version (pyproject.toml reads it from here)."""
