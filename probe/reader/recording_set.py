"""Several recordings read as one (the rolling files of an agent, the ranks of several
hosts, a glob), and a recording's steps in chunks, as the offline writers stream them."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from probe.reader.recording import Recording
from probe.reader.recording_open import (
    RecordingError,
)
from probe.step import Step


def iter_step_chunks(
    rec: Recording | RecordingSet, size: int = 1024, pid: int | None = None
) -> Iterator[list[Step]]:
    """The steps of :meth:`Recording.iter_steps` (every value checked as it does) in lists
    of at most ``size``: what a writer holds at once is one chunk, whatever the length of
    the recording (SQLite reads the rows a page at a time under the cursor)."""
    if size < 1:
        raise ValueError(f"chunk size must be at least 1, got {size}")
    chunk: list[Step] = []
    for s in rec.iter_steps(pid):
        chunk.append(s)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def expand_paths(names: Iterable[str | Path]) -> list[Path]:
    """Recording names as given on a command line: a name with ``*``, ``?`` or ``[`` that
    is not a file is a glob (``ranks/*.probe.db``, ``'**'`` included), its matches sorted;
    a recording folder (``NAME.probe/``) is itself, any other folder stands for every
    recording below it (``*.probe.db`` files and recording folders: an agent's
    ``--record-dir``), sorted;
    every path once, in the order given. A glob that matches nothing, or a folder that holds
    no recording, raises :class:`RecordingError`."""
    import glob

    from probe.reader.columnar_schema import MANIFEST, is_columnar

    out: list[Path] = []
    seen: set[tuple[int, int] | str] = set()
    for name in names:
        s = str(name)
        if any(c in s for c in "*?[") and not Path(s).exists():
            found = sorted(glob.glob(s, recursive=True))
            if not found:
                raise RecordingError(f"{s}: no recording matches")
            paths = [Path(f) for f in found]
        elif _is_dir(s) and not is_columnar(s):
            base = glob.escape(s)
            found = sorted(
                [*glob.glob(os.path.join(base, "**", "*.probe.db"), recursive=True),
                 *(os.path.dirname(m) for m in glob.glob(
                     os.path.join(base, "**", MANIFEST), recursive=True))]
            )  # fmt: skip
            if not found:
                raise RecordingError(
                    f"{s}: a folder with no recording (*.probe.db, or a recording folder) in it"
                )
            paths = [Path(f) for f in found]
        else:
            paths = [Path(s)]
        for p in paths:
            key = _identity(p)
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


def _is_dir(name: str) -> bool:
    """``name`` is a folder (a link loop or an unsearchable parent is not: the open says
    what is wrong with it)."""
    try:
        return os.path.isdir(name)
    except (OSError, ValueError):
        return False


def _identity(p: Path) -> tuple[int, int] | str:
    """What makes two names one file: its device and inode; a name that does not lead to
    a file (a link loop, a dangling link, a parent that cannot be searched) is itself,
    and the open names its problem in one line."""
    import os

    try:
        st = os.stat(p)
    except (OSError, ValueError):
        return os.path.abspath(p)
    return (st.st_dev, st.st_ino)


def open_many(names: Iterable[str | Path]) -> Recording | RecordingSet:
    """The recordings named (globs expanded, :func:`expand_paths`), opened and validated:
    one :class:`Recording`, or a :class:`RecordingSet` reading several as one. A file that
    is not a readable recording raises :class:`RecordingError` naming it (those opened
    before it are closed)."""
    paths = expand_paths(names)
    if not paths:
        raise RecordingError("no recording given")
    recs: list[Recording] = []
    try:
        for p in paths:
            recs.append(Recording.open(p))
        return recs[0] if len(recs) == 1 else RecordingSet(recs)
    except BaseException:
        for r in recs:
            r.close()
        raise


class RecordingSet:
    """Several recordings read as one, with :class:`Recording`'s reading methods.

    The rolling files of one agent, or the ranks of several hosts: their processes side by
    side, and their steps in (pid, step) order across the files. A pid found in several
    files is one process (an agent's rolling files of one host), its steps read from each
    file in turn; the same pid in the recordings of two hosts (``meta`` ``host``) raises
    :class:`RecordingError`, as they cannot be told apart. Builder ids are renumbered where
    the files numbered one process's builders differently.
    """

    def __init__(self, recordings: list[Recording]) -> None:
        self.recordings = recordings
        self.path = recordings[0].path
        hosts: dict[int, tuple[str, Path]] = {}
        for r in recordings:
            host = str(r.meta().get("host") or "")
            for pid in [int(p["pid"]) for p in r.processes()]:
                seen = hosts.get(pid)
                if seen is not None and seen[0] != host:
                    raise RecordingError(
                        f"{r.path}: pid {pid} is also in {seen[1]}, recorded on another host "
                        f"({host or '?'} and {seen[0] or '?'}): read them apart"
                    )
                hosts.setdefault(pid, (host, r.path))
        self._names: dict[int, dict[int, str]] = {}
        self._remap: list[dict[int, dict[int, int]]] = []  # per file: pid -> its id -> ours
        for r in recordings:
            remap: dict[int, dict[int, int]] = {}
            for pid, names in r.builder_names().items():
                ours = self._names.setdefault(pid, {})
                ids = {n: i for i, n in ours.items()}
                for i, name in names.items():
                    if name not in ids:
                        ids[name] = len(ours) + 1
                        ours[ids[name]] = name
                    if ids[name] != i:
                        remap.setdefault(pid, {})[i] = ids[name]
            self._remap.append(remap)

    def meta(self) -> dict[str, Any]:
        """The first file's meta, with ``files``: how many were read as one."""
        return {**self.recordings[0].meta(), "files": len(self.recordings)}

    def processes(self) -> list[dict[str, Any]]:
        """Each process once, as its first file has it, with ``host`` (the file's meta)
        and ``dropped`` its total: a ring's count of dropped records only grows, and each
        rolling file keeps it as of its own end, so the largest is the process's."""
        out: dict[int, dict[str, Any]] = {}
        for r in self.recordings:
            host = str(r.meta().get("host") or "")
            for p in r.processes():
                pid = int(p["pid"])
                seen = out.get(pid)
                if seen is None:
                    out[pid] = {**p, "host": host}
                elif (p.get("dropped") or 0) > (seen.get("dropped") or 0):
                    seen["dropped"] = p["dropped"]
        return [out[pid] for pid in sorted(out)]

    def builder_names(self, pid: int | None = None) -> dict[int, dict[int, str]]:
        return {p: dict(names) for p, names in self._names.items() if pid in (None, p)}

    def step_counts(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for r in self.recordings:
            for pid, n in r.step_counts().items():
                out[pid] = out.get(pid, 0) + n
        return out

    def record_count(self) -> int:
        return sum(r.record_count() for r in self.recordings)

    def iter_steps(self, pid: int | None = None) -> Iterator[Step]:
        """Every step of every file (of ``pid``, or all) in (pid, step) order; a step
        number found in two files comes from the earlier file first."""
        import dataclasses
        import heapq

        def each(i: int, r: Recording) -> Iterator[tuple[int, int, int, Step]]:
            remap = self._remap[i]
            for s in r.iter_steps(pid):
                ids = remap.get(s.pid)
                if ids and s.builds:
                    builds = tuple(
                        dataclasses.replace(b, builder_id=ids.get(b.builder_id, b.builder_id))
                        for b in s.builds
                    )
                    s = dataclasses.replace(s, builds=builds)
                yield s.pid, s.step, i, s

        its = [each(i, r) for i, r in enumerate(self.recordings)]
        for *_, s in heapq.merge(*its, key=lambda t: t[:3]):
            yield s

    def batches(
        self, table: str, columns: list[str] | None = None, pid: int | None = None,
        size: int = 65_536,
    ) -> Iterator[Any]:  # fmt: skip
        """The table's rows of every file (of ``pid``, or all) as Arrow record batches, in
        the order :meth:`iter_steps` gives their steps: by pid, then step, a step found in
        two files from the earlier file first. Builders are named, not numbered, in a
        batch: nothing to renumber. A process's files are read one after the other where
        their steps follow on (an agent's rolling files); where they interleave, that
        process's rows are read whole and ordered."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if pid is None:
            for p in sorted(self.step_counts()):
                yield from self.batches(table, columns, p, size)
            return
        want = columns if columns is None or "step" in columns else [*columns, "step"]
        ranges = [rg for r in self.recordings if (rg := _step_range(r, pid)) is not None]
        follows = all(a[1] <= b[0] for a, b in itertools.pairwise(ranges))
        if follows:
            chained: Iterator[Any] = (
                b for r in self.recordings for b in r.batches(table, want, pid, size)
            )
        else:
            parts = [b for r in self.recordings for b in r.batches(table, want, pid, size)]
            if not parts:
                return
            whole = pa.Table.from_batches(parts)
            order = pc.sort_indices(whole, [("step", "ascending")])  # stable: file order kept
            chained = iter(whole.take(order).to_batches(max_chunksize=size))
        for b in chained:
            yield b if want is columns else b.select(columns)

    @property
    def stores_counts(self) -> bool:
        """Whether every file stores each step's record counts (all columnar)."""
        return all(getattr(r, "stores_counts", False) for r in self.recordings)

    def steps_vouched(self) -> frozenset[str]:
        """The step columns every file's statistics vouch for (none where a file is not
        columnar): see :meth:`probe.reader.columnar_read.ColumnarRecording.steps_vouched`."""
        out: frozenset[str] | None = None
        for r in self.recordings:
            mine = r.steps_vouched() if hasattr(r, "steps_vouched") else frozenset()
            out = mine if out is None else out & mine
        return out or frozenset()

    def faults(self) -> list[dict[str, Any]]:
        return [f for r in self.recordings for f in r.faults()]

    def outside(self) -> list[dict[str, Any]]:
        return [o for r in self.recordings for o in r.outside()]

    def anomalies(self) -> list[str]:
        return [a for r in self.recordings for a in r.anomalies()]

    def close(self) -> None:
        for r in self.recordings:
            r.close()


def _step_range(rec: Recording, pid: int) -> tuple[int, int] | None:
    """The first and last step number of ``pid`` in one file (None: it has none there),
    its step column read a batch at a time."""
    import pyarrow.compute as pc

    lo = hi = None
    for b in rec.batches("steps", ["step"], pid):
        mm = pc.min_max(b.column(0)).as_py()
        lo = mm["min"] if lo is None else min(lo, mm["min"])
        hi = mm["max"] if hi is None else max(hi, mm["max"])
    return None if lo is None or hi is None else (lo, hi)
