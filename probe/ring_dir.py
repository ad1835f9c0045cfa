"""Where rings live and how a reader opens one: the part of :mod:`probe.ring` a reader's
start needs (``probe ps``, ``attach``, ``top`` find the run directory and open the rings
before they import the ring's code, its records and the compiled hot path).

    >>> d = default_ring_dir()  # $PROBE_RUN_DIR or /dev/shm/..., checked  # doctest: +SKIP
    >>> fd = os.open(d / "ring-4242.shm", OPEN_FLAGS)                   # doctest: +SKIP

:mod:`probe.engine.ring_writer` and :mod:`probe.reader.ring_reader` use them.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from probe import config

__all__ = [
    "FALLBACK_PREFIX",
    "OPEN_FLAGS",
    "UnsafeRingDirError",
    "candidate_run_dirs",
    "check_ring_dir",
    "default_ring_dir",
    "private_tmp_dirs",
]

OPEN_FLAGS = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW  # a reader's open (RingReader.open)
FALLBACK_PREFIX = "vllm-graph-probe-"  # a server's private folder: <prefix><uid>-*


class UnsafeRingDirError(PermissionError):
    """A ring directory that another user could write to or that we do not own."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"unsafe ring directory {os.fspath(path)}: {problem}")
        self.path = os.fspath(path)
        self.problem = problem


def check_ring_dir(path: str | os.PathLike[str]) -> Path:
    """Check that ``path`` is a real directory owned by us and writable by nobody else.

    Raises :class:`UnsafeRingDirError` otherwise (``FileNotFoundError`` if it is missing).
    """
    p = Path(path)
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeRingDirError(p, "is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeRingDirError(p, "is not a directory")
    uid = os.getuid()
    if st.st_uid != uid:
        raise UnsafeRingDirError(p, f"owned by uid {st.st_uid}, not by this uid {uid}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeRingDirError(
            p, f"mode {stat.S_IMODE(st.st_mode):#o} is group/world-writable (want 0o700)"
        )
    return p


def default_ring_dir(
    *,
    environ: Mapping[str, str] | None = None,
    shm_root: str | os.PathLike[str] = "/dev/shm",
    tmp_root: str | os.PathLike[str] | None = None,
) -> Path:
    """The directory rings live in, created (mode 0o700) and checked.

    ``$PROBE_RUN_DIR`` if set; else ``<shm_root>/vllm-graph-probe-<uid>`` when
    ``shm_root`` exists; else ``<tmp_root or tempfile.gettempdir()>/vllm-graph-probe-<uid>``.
    Raises :class:`UnsafeRingDirError` (a ``PermissionError``) when the directory is not
    ours or is group/world-writable, and when ``$PROBE_RUN_DIR`` is not an absolute path.
    """
    env = os.environ if environ is None else environ
    explicit = env.get("PROBE_RUN_DIR")
    name = f"vllm-graph-probe-{os.getuid()}"
    if explicit:
        if not os.path.isabs(explicit):
            # a relative one would be a different folder from every working directory
            raise UnsafeRingDirError(explicit, "PROBE_RUN_DIR must be an absolute path")
        d = Path(explicit).resolve()
    elif Path(shm_root).is_dir():
        d = Path(shm_root) / name
    else:
        import tempfile  # the fallback only: not in every reader's start

        d = Path(tmp_root if tmp_root is not None else tempfile.gettempdir()) / name
    try:
        os.makedirs(d, mode=0o700)
        os.chmod(d, 0o700)  # makedirs' mode is filtered by the umask
    except FileExistsError:
        pass
    return check_ring_dir(d)


def private_tmp_dirs(tmp_root: str | None = None) -> list[Path]:
    """Our earlier private fallback folders (safe ones only), oldest first
    (:func:`probe.engine.control_server.run_dir`)."""
    import tempfile

    root = Path(tmp_root if tmp_root is not None else tempfile.gettempdir())
    out = []
    with contextlib.suppress(OSError):
        for d in sorted(root.glob(f"{FALLBACK_PREFIX}{os.getuid()}-*")):
            with contextlib.suppress(UnsafeRingDirError, OSError):
                out.append(check_ring_dir(d))
    return out


def candidate_run_dirs(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Every safe place a server of this user may have put its socket (for readers)."""
    env = os.environ if environ is None else environ
    out: list[Path] = []
    with contextlib.suppress(UnsafeRingDirError, OSError):
        out.append(default_ring_dir(environ=env))
    if env.get(config.RUN_DIR.name):
        return out
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        with contextlib.suppress(UnsafeRingDirError, OSError):
            out.append(check_ring_dir(Path(xdg) / "vllm-graph-probe"))
    out += private_tmp_dirs()
    return out
