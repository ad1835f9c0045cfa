"""Every file a ``probe`` command writes goes through here: nothing partial, nothing
followed, nothing overwritten unasked.

    >>> target = check_target("run.pftrace", force=False, flag="--out")   # doctest: +SKIP
    >>> with write_to(target) as f:                                      # doctest: +SKIP
    ...     f.write(data)

- ``-`` means standard output (:func:`check_target` returns ``None``).
- The target must be a regular file (or absent): a directory, a symbolic link, a FIFO or
  a device node is refused before anything is written, and so is an existing file unless
  ``force``.
- The bytes go to a temporary file next to the target, created with
  ``O_CREAT|O_EXCL|O_NOFOLLOW`` under an unpredictable name (a link planted in a shared
  folder is never written through), fsynced, then renamed over the target. A failure
  (ENOSPC, EROFS, ...) removes the temporary file and leaves the target as it was.

User mistakes are :class:`probe.errors.UsageError` (exit 2); a write that fails is
:class:`probe.errors.RuntimeFailure` (exit 1); both name the file and the reason.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from probe.errors import RuntimeFailure, UsageError

__all__ = [
    "STDOUT",
    "check_target",
    "create_exclusive",
    "new_file_in_place",
    "os_reason",
    "path_for",
    "write_bytes",
    "write_stdout",
    "write_to",
]

STDOUT = "-"


def os_reason(exc: OSError) -> str:
    """``No space left on device``: the reason of an ``OSError`` in one line."""
    return exc.strerror or " ".join(str(exc).split())


def check_target(path: str | os.PathLike[str], *, force: bool, flag: str) -> Path | None:
    """The output file named by ``flag``, checked before any work starts; ``None`` for ``-``.

    Raises :class:`UsageError` for a target that is not a regular file, one that exists
    without ``force``, a folder that does not exist or is not writable.
    """
    if os.fspath(path) == STDOUT:
        return None
    p = Path(path)
    try:
        st: os.stat_result | None = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise UsageError(f"{flag} {p}: {os_reason(exc)}") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{flag} {p}: is a directory")
        if stat.S_ISLNK(st.st_mode):
            raise UsageError(f"{flag} {p}: is a symbolic link (give the file it points to)")
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{flag} {p}: not a regular file (a FIFO, socket or device)")
        if not force:
            raise UsageError(f"{flag} {p}: exists (use --force to overwrite)")
    parent = p.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {p}: directory {parent} does not exist")
    try:
        if os.statvfs(parent).f_flag & os.ST_RDONLY:
            raise UsageError(f"{flag} {p}: {parent} is on a read-only file system")
    except OSError as exc:
        raise UsageError(f"{flag} {p}: {os_reason(exc)}") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {p}: directory {parent} is not writable")
    return p


# secrets, shutil and tempfile are imported where used: ``probe attach`` checks its
# --record target before its enable, and every import there delays the attachment


def _tmp_name(target: Path) -> Path:
    import secrets

    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")


def create_exclusive(path: Path, mode: int = 0o644) -> int:
    """Create ``path`` with ``O_CREAT|O_EXCL|O_NOFOLLOW``; returns the descriptor."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, mode)


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _commit(tmp: Path, target: Path) -> None:
    # the target may have changed since check_target: never replace a non-regular file
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(target)
        if not stat.S_ISREG(st.st_mode):
            raise RuntimeFailure(f"{target}: no longer a regular file; not replaced")
    os.replace(tmp, target)
    _fsync_dir(target.parent)


@contextlib.contextmanager
def write_to(target: Path | None) -> Iterator[BinaryIO]:
    """A binary file whose bytes become ``target`` (``None``: stdout) when the block ends
    without an exception; on any failure nothing of it is left."""
    if target is None:
        import tempfile

        with tempfile.TemporaryFile() as buf:
            yield buf  # type: ignore[misc]
            buf.seek(0)
            _copy_to_stdout(buf)
        return
    tmp = _tmp_name(target)
    try:
        fd = create_exclusive(tmp)
    except OSError as exc:
        raise RuntimeFailure(f"{target}: cannot create a file there ({os_reason(exc)})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        _commit(tmp, target)
    except OSError as exc:
        raise RuntimeFailure(
            f"{target}: write failed ({os_reason(exc)}); nothing written"
        ) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


@contextlib.contextmanager
def path_for(target: Path | None) -> Iterator[Path]:
    """A fresh temporary path for a writer that takes a file name; it becomes ``target``
    (``None``: stdout) when the block ends without an exception.

    The file is created here (``O_EXCL|O_NOFOLLOW``, an unpredictable name) before the
    writer opens it, so the writer opens our own regular file, never a planted link.
    """
    if target is None:
        import shutil
        import tempfile

        d = Path(tempfile.mkdtemp(prefix="probe-out-"))
        try:
            tmp = d / "out"
            os.close(create_exclusive(tmp, 0o600))
            yield tmp
            with open(tmp, "rb") as f:
                _copy_to_stdout(f)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        return
    tmp = _tmp_name(target)
    try:
        os.close(create_exclusive(tmp))
    except OSError as exc:
        raise RuntimeFailure(f"{target}: cannot create a file there ({os_reason(exc)})") from None
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise RuntimeFailure(f"{target}: the temporary file was replaced; not written")
            os.fsync(fd)
        finally:
            os.close(fd)
        _commit(tmp, target)
    except OSError as exc:
        raise RuntimeFailure(
            f"{target}: write failed ({os_reason(exc)}); nothing written"
        ) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_bytes(target: Path | None, data: bytes) -> None:
    """``data`` into ``target`` (``None``: stdout), all or nothing."""
    with write_to(target) as f:
        f.write(data)


def _copy_to_stdout(src: BinaryIO) -> None:
    import shutil

    out = sys.stdout.buffer
    try:
        sys.stdout.flush()
        shutil.copyfileobj(src, out)
        out.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise RuntimeFailure(f"standard output: {os_reason(exc)}") from None


def write_stdout(text: str) -> None:
    """Print ``text`` and flush; a failing stdout (``/dev/full``) is one clear error."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise RuntimeFailure(f"standard output: {os_reason(exc)}") from None


def new_file_in_place(target: Path) -> None:
    """Make ``target`` (checked by :func:`check_target`) a new empty regular file for a
    writer that must write in place (a recording, readable while it grows): an old
    regular file and its ``-wal``/``-shm`` are removed, the new one is created with
    ``O_EXCL|O_NOFOLLOW``."""
    for suffix in ("", "-wal", "-shm"):
        old = Path(f"{target}{suffix}")
        with contextlib.suppress(FileNotFoundError):
            if suffix and not stat.S_ISREG(os.lstat(old).st_mode):
                raise UsageError(f"{old}: not a regular file; remove it first")
            old.unlink()
    try:
        os.close(create_exclusive(target))
    except OSError as exc:
        raise RuntimeFailure(f"{target}: cannot create it ({os_reason(exc)})") from None
