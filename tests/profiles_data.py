"""The real profiler output files the timeline tests read, kept in the repository.

``tests/data/profiles`` holds rocprofv3 CSV and JSON files and Kineto traces, and
``tests/data/rocpd-schema`` AMD's own rocpd SQL: byte-for-byte copies from public MIT
repositories, each folder with a ``SOURCES.md`` (repository, path and commit of every
file) and the licence texts. No test reads anything outside the repository.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"


def profiles_dir() -> Path:
    """The folder holding the real profile files and their ``SOURCES.md``."""
    return DATA / "profiles"


def rocpd_schema_dir() -> Path:
    """AMD's rocpd SQL files (ROCm/rocm-systems) and their ``SOURCES.md``."""
    return DATA / "rocpd-schema"


def profile_path(*parts: str) -> Path:
    """Path of one real profile file or folder (it is in the repository: a missing one is
    an error, never a skip)."""
    path = profiles_dir().joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"real profile data missing from the repository: {path}")
    return path
