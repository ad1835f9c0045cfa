"""Locate the real profiler output files kept outside the repository.

The files live in ``<shared>/data/profiles`` (see its ``SOURCES.md``), where ``<shared>``
is ``$PROBE_SHARED_DIR`` if set, else the ``shared`` folder beside the repository root.
They are never copied into the repository; a test that needs one is skipped, with the path
it looked for, when it is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV_VAR = "PROBE_SHARED_DIR"


def shared_dir() -> Path:
    """``$PROBE_SHARED_DIR``, or ``<repo root>/../shared``."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "shared"


def profiles_dir() -> Path:
    """The folder holding the real profile files and their ``SOURCES.md``."""
    return shared_dir() / "data" / "profiles"


def profile_path(*parts: str) -> Path:
    """Path of one real profile file or folder; skips the calling test when it is absent."""
    path = profiles_dir().joinpath(*parts)
    if not path.exists():
        pytest.skip(
            f"real profile data not found at {path}: set {ENV_VAR} to the folder that holds "
            "data/profiles (default: the 'shared' folder beside the repository root)"
        )
    return path
