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
  ``O_CREAT|O_EXCL|O_NOFOLLOW`` under an unpredictable name no longer than the file
  system takes (a link planted in a shared folder is never written through), fsynced,
  then renamed over the target. A writer that opens its file itself (SQLite, an
  exporter plugin) gets a path inside a private folder next to the target instead.
  A failure (ENOSPC, EROFS, ...) removes the temporary and leaves the target as it was.
- A target that was absent when checked is linked into place only if it is still absent;
  one that was replaced (``--force``) only if it is still the file that was checked: of
  two writers to one target at once, one wins and the other fails with one line.
- :func:`install_signal_cleanup` (done by :func:`probe.cli.main`): SIGINT, SIGTERM and
  SIGHUP remove every temporary still open and end the command with status 128+N.
- A command of several outputs writes them :func:`together`: each to its temporary, all
  renamed onto their targets once every one is written, so a failure leaves none of them;
  where a rename fails at the end, the error names the outputs written and those not.

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
    "Outputs",
    "SignalExit",
    "check_target",
    "cleanup_temporaries",
    "create_exclusive",
    "guard_standard_streams",
    "install_signal_cleanup",
    "new_file_in_place",
    "new_growing_file",
    "os_reason",
    "path_for",
    "together",
    "write_bytes",
    "write_stdout",
    "write_to",
]

STDOUT = "-"
NAME_MAX = 255  # bytes of one path component on Linux file systems
SHORT_PATH_MAX = 480  # longer targets are written in the temporary folder (SQLite: 512)

# the temporaries (files or private folders) of writes in progress, removed on a signal
_LIVE: set[Path] = set()
# what each checked target was: (st_dev, st_ino) of the file --force replaces, None: absent
_CHECKED: dict[str, tuple[int, int] | None] = {}


class Outputs:
    """The outputs of one command written :func:`together`: the renames waiting for the
    end (``pending``: target, the rename), and the outputs that cannot wait (``done``: an
    endpoint sent to, a folder written in place), named where the command fails."""

    def __init__(self) -> None:
        self.pending: list[tuple[Path, _Rename]] = []
        self.done: list[str] = []
        #: lines that say what was written, to say once all of it is
        self.lines: list[str] = []

    def left(self, what: str) -> None:
        """Note an output that is there already, whatever happens to the others."""
        self.done.append(what)

    def _discard(self) -> None:
        for _, rename in self.pending:
            rename.discard()
        self.pending.clear()

    def _commit(self) -> None:
        for i, (target, rename) in enumerate(self.pending):
            try:
                rename()
            except RuntimeFailure as exc:
                rest = self.pending[i + 1 :]
                for _, r in rest:
                    r.discard()
                written = [str(t) for t, _ in self.pending[:i]] + self.done
                missing = [str(target)] + [str(t) for t, _ in rest]
                raise RuntimeFailure(
                    f"{exc}; written: {', '.join(written) or 'none'}; "
                    f"not written: {', '.join(missing)}"
                ) from None
        self.pending.clear()


# the outputs being written together, innermost last
_TOGETHER: list[Outputs] = []


@contextlib.contextmanager
def together() -> Iterator[Outputs]:
    """Write the outputs of a block all or none: each :func:`path_for` and
    :func:`write_to` inside it renames its file onto its target when the block ends
    without an exception, and none does when it raises. A failure there names what was
    left (:meth:`Outputs.left`); a rename that fails at the end names the outputs written
    and those not. :attr:`Outputs.lines` are the caller's to say once all are written."""
    out = Outputs()
    _TOGETHER.append(out)
    try:
        yield out
    except BaseException as exc:
        _TOGETHER.remove(out)
        out._discard()
        if out.done and isinstance(exc, RuntimeFailure | UsageError):
            raise type(exc)(f"{exc}; left written: {', '.join(out.done)}") from None
        raise
    _TOGETHER.remove(out)
    out._commit()


class _Rename:
    """A rename waiting for the end of :func:`together` (or run at once outside it)."""

    def __init__(self, tmp: Path, target: Path, d: Path | None, far: bool) -> None:
        self.tmp, self.target, self.d, self.far = tmp, target, d, far

    def __call__(self) -> None:
        try:
            if self.far:
                import shutil

                with open(self.tmp, "rb") as src, write_to(self.target, now=True) as dst:
                    shutil.copyfileobj(src, dst)
            else:
                _commit(self.tmp, self.target)
        except OSError as exc:
            raise RuntimeFailure(
                f"{self.target}: write failed ({os_reason(exc)}); nothing written"
            ) from None
        finally:
            self.discard()

    def discard(self) -> None:
        if self.d is not None:
            _remove_dir(self.d)
        else:
            with contextlib.suppress(FileNotFoundError):
                self.tmp.unlink()
            _LIVE.discard(self.tmp)


def _rename(rename: _Rename, now: bool) -> bool:
    """Run ``rename``, or hold it for the end of :func:`together`; True: held."""
    if _TOGETHER and not now:
        _TOGETHER[-1].pending.append((rename.target, rename))
        return True
    rename()
    return False


class SignalExit(BaseException):
    """SIGINT, SIGTERM or SIGHUP arrived: temporaries are removed; exit 128+``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def cleanup_temporaries() -> None:
    """Remove every temporary of a write still in progress (file or private folder)."""
    import shutil

    for p in list(_LIVE):
        _LIVE.discard(p)
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink()
        except OSError:
            pass


def _on_signal(signum: int, _frame: object) -> None:
    cleanup_temporaries()
    raise SignalExit(signum)


def install_signal_cleanup() -> None:
    """SIGINT, SIGTERM and SIGHUP remove the temporaries and raise :class:`SignalExit`.

    A signal the caller ignores (``nohup``) stays ignored; a command that needs its own
    handlers (``record``, ``attach``) installs them over these while it runs."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _on_signal)


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
    if len(os.fsencode(p.name)) > NAME_MAX:
        raise UsageError(f"{flag} {p}: file name too long (over {NAME_MAX} bytes)")
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
    _CHECKED[os.fspath(p)] = None if st is None else (st.st_dev, st.st_ino)
    return p


# secrets, shutil and tempfile are imported where used: ``probe attach`` checks its
# --record target before its enable, and every import there delays the attachment


def _tmp_name(target: Path) -> Path:
    """``.NAME.PID.RANDOM.tmp`` beside ``target``, NAME cut so that the whole stays within
    :data:`NAME_MAX` bytes (a legal 248-byte target name must still be writable)."""
    import secrets

    tail = f".{os.getpid()}.{secrets.token_hex(6)}.tmp".encode()
    head = os.fsencode(target.name)[: NAME_MAX - 1 - len(tail)]
    return target.with_name(os.fsdecode(b"." + head + tail))


def _private_dir(target: Path) -> Path:
    """A new owner-only folder beside ``target`` (registered for signal cleanup)."""
    try:
        return _new_dir(target.parent, ".probe-")
    except OSError as exc:
        raise RuntimeFailure(f"{target}: cannot create a file there ({os_reason(exc)})") from None


def _new_dir(parent: Path, prefix: str) -> Path:
    """``mkdtemp``, registered for the signal cleanup before it exists (a signal between
    the two would leave it)."""
    import secrets

    for _ in range(100):
        d = parent / f"{prefix}{secrets.token_hex(4)}"
        _LIVE.add(d)
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            _LIVE.discard(d)
            continue
        except BaseException:
            _LIVE.discard(d)
            raise
        return d
    raise FileExistsError(f"no free temporary name in {parent}")


def _remove_dir(d: Path) -> None:
    """Remove a private folder, then forget it (the other order leaves it to a signal
    between the two)."""
    import shutil

    shutil.rmtree(d, ignore_errors=True)
    _LIVE.discard(d)


def _inner_name(target: Path) -> str:
    """The writer's file name inside the private folder: short (SQLite adds ``-journal``
    to it), with the target's suffix (a writer may choose its format by it)."""
    suffix = target.suffix if len(os.fsencode(target.suffix)) <= 32 else ""
    return f"out{suffix}"


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


_UNCHECKED = (-1, -1)


def _commit(tmp: Path, target: Path) -> None:
    # the target may have changed since check_target: never replace a non-regular file,
    # nor a file another writer put there meanwhile
    key = os.fspath(target)
    expected = _CHECKED.get(key, _UNCHECKED)
    try:
        st: os.stat_result | None = os.lstat(target)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise RuntimeFailure(f"{target}: no longer a regular file; not replaced")
    other = f"{target}: another writer wrote it meanwhile; not replaced"
    if expected is None:
        if st is not None:
            raise RuntimeFailure(other)
        try:
            os.link(tmp, target)  # atomic: fails if the name exists by now
        except FileExistsError:
            raise RuntimeFailure(other) from None
        except OSError:  # a file system without hard links
            os.replace(tmp, target)
        else:
            os.unlink(tmp)
    else:
        if expected != _UNCHECKED and (st is None or (st.st_dev, st.st_ino) != expected):
            raise RuntimeFailure(other)
        os.replace(tmp, target)
    _fsync_dir(target.parent)
    if key in _CHECKED:  # a second write to the same target replaces this one
        new = os.lstat(target)
        _CHECKED[key] = (new.st_dev, new.st_ino)


@contextlib.contextmanager
def write_to(target: Path | None, *, now: bool = False) -> Iterator[BinaryIO]:
    """A binary file whose bytes become ``target`` (``None``: stdout) when the block ends
    without an exception (inside :func:`together`: when that ends, unless ``now``); on
    any failure nothing of it is left."""
    if target is None:
        import tempfile

        with tempfile.TemporaryFile() as buf:
            yield buf  # type: ignore[misc]
            buf.seek(0)
            _copy_to_stdout(buf)
        return
    tmp = _tmp_name(target)
    _LIVE.add(tmp)  # before it exists: a signal in between must not leave it
    try:
        fd = create_exclusive(tmp)
    except OSError as exc:
        _LIVE.discard(tmp)
        raise RuntimeFailure(f"{target}: cannot create a file there ({os_reason(exc)})") from None
    held = False
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        held = _rename(_Rename(tmp, target, None, False), now)
    except OSError as exc:
        raise RuntimeFailure(
            f"{target}: write failed ({os_reason(exc)}); nothing written"
        ) from None
    finally:
        if not held:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            _LIVE.discard(tmp)


@contextlib.contextmanager
def path_for(target: Path | None, *, create: bool = True) -> Iterator[Path]:
    """A fresh temporary path for a writer that takes a file name; it becomes ``target``
    (``None``: stdout) when the block ends without an exception.

    The path is inside a new owner-only folder next to the target (nobody else can plant
    a name there) and short (SQLite's ``-journal`` beside it stays a legal name). With
    ``create`` the file is made here (``O_EXCL|O_NOFOLLOW``); without, the writer makes it
    (SQLite, an exporter that refuses an existing file). A write that fails (a full or
    read-only disk, SQLite's own errors included) is one :class:`RuntimeFailure` naming
    the target, and the folder is removed.
    """
    import tempfile

    if target is None:
        d = _new_dir(Path(tempfile.gettempdir()), "probe-out-")
        try:
            tmp = d / "out"
            if create:
                os.close(create_exclusive(tmp, 0o600))
            try:
                yield tmp
            except Exception as exc:
                _raise_write_failure(None, exc)
            with open(tmp, "rb") as f:
                _copy_to_stdout(f)
        finally:
            _remove_dir(d)
        return
    # a path SQLite cannot take (its VFS: 512 bytes) is written in the temporary folder
    # and copied beside the target at the end (the rename stays atomic)
    far = len(os.fsencode(target.absolute())) > SHORT_PATH_MAX
    d = _new_dir(Path(tempfile.gettempdir()), "probe-out-") if far else _private_dir(target)
    tmp = d / _inner_name(target)
    held = False
    try:
        if create:
            os.close(create_exclusive(tmp))
        try:
            yield tmp
        except Exception as exc:
            _raise_write_failure(target, exc)
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise RuntimeFailure(f"{target}: the temporary file was replaced; not written")
            os.fsync(fd)
        finally:
            os.close(fd)
        held = _rename(_Rename(tmp, target, d, far), False)
    except OSError as exc:
        raise RuntimeFailure(
            f"{target}: write failed ({os_reason(exc)}); nothing written"
        ) from None
    finally:
        if not held:
            _remove_dir(d)


def _raise_write_failure(target: Path | None, exc: Exception) -> None:
    """Re-raise ``exc``, as one :class:`RuntimeFailure` when it is the disk's (an
    ``OSError``, or SQLite's full, read-only or I/O error); any other exception as is."""
    where = target if target is not None else "standard output"
    if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError):
        raise RuntimeFailure(f"{where}: write failed ({os_reason(exc)}); nothing written") from None
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is not None and isinstance(exc, sqlite3.OperationalError):
        why = " ".join(str(exc).split())
        if any(w in why for w in ("full", "readonly", "read-only", "I/O error", "unable to open")):
            raise RuntimeFailure(f"{where}: write failed ({why}); nothing written") from None
    raise exc


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


def guard_standard_streams() -> None:
    """Make the process's standard streams safe to use, at its start.

    - A closed descriptor 0, 1 or 2 is held by ``/dev/null`` so that no file the command
      opens takes its number (a message for stderr landing in the output file). Stdout
      is held read-only: a write to it fails, and the command says so on stderr.
    - Text that the stream's encoding cannot carry (a file name that is not UTF-8 under
      ``PYTHONIOENCODING=utf-8:strict``) is written backslash-escaped, never raised.
    """
    import io

    for fd, mode in ((0, os.O_RDONLY), (1, os.O_RDONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
        except OSError:
            held = os.open(os.devnull, mode)
            if held != fd:
                os.dup2(held, fd)
                os.close(held)
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if stream is None:
            stream = io.TextIOWrapper(
                io.FileIO(fd, "w", closefd=False), errors="backslashreplace", line_buffering=True
            )
            setattr(sys, name, stream)
        elif isinstance(stream, io.TextIOWrapper):
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors="backslashreplace")


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


def new_growing_file(path: str | os.PathLike[str], *, force: bool, flag: str) -> Path:
    """A file written in place while it grows (a recording, a rolling file of the agent):
    :func:`check_target` then :func:`new_file_in_place`, in one call. ``-`` is refused (a
    file that grows is not a stream). A finished file written elsewhere and moved into
    place takes :func:`path_for` instead; both leave nothing on a signal but what was
    committed."""
    target = check_target(path, force=force, flag=flag)
    if target is None:
        raise UsageError(f"{flag} -: this output is a file written while it grows, not a stream")
    new_file_in_place(target)
    return target
