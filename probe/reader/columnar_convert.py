"""``probe convert``: a recording (either format; several read as one) written as one
recording of the other format.

    >>> import tempfile, pathlib
    >>> from probe.reader.recording import default_recording
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "run.probe.db"
    >>> convert(default_recording(), out, to_sqlite=True)
    1305
"""

from __future__ import annotations

import json
from pathlib import Path

from probe.reader.columnar import ColumnarWriter
from probe.reader.columnar_schema import is_sqlite_name
from probe.reader.recording_target import writer_at


def convert(
    src: str | Path | list[str | Path], out: str | Path, *, to_sqlite: bool = False,
    chunk: int = 4096,
) -> int:  # fmt: skip
    """Write the recording(s) ``src`` (either format; several read as one) as one new
    recording at ``out``: columnar, or SQLite with ``to_sqlite``; the steps written."""
    from probe.reader.recording import RecordingWriter
    from probe.reader.recording_set import iter_step_chunks, open_many

    rec = open_many(src if isinstance(src, list) else [src])
    n = 0
    try:
        w = writer_at(Path(out)) if to_sqlite or is_sqlite_name(out) else None
        if w is None:
            w = ColumnarWriter(out, commit_every_s=float("inf"))
        meta = rec.meta()
        meta.pop("files", None)
        processes = []
        for p in rec.processes():
            row = dict(p)
            row.pop("host", None)
            snap = row.get("snapshot")
            row["snapshot"] = None if snap is None else json.dumps(snap, default=str)
            processes.append(row)
        if isinstance(w, RecordingWriter):
            w.set_meta(**meta)
            w.add_processes(processes)
        else:
            w.meta = dict(meta)
            w.processes = {int(r["pid"]): r for r in processes}
        for pid, names in rec.builder_names().items():
            w.set_strings(pid, names)
        for f in rec.faults():
            w.set_faults(int(f["pid"]), {str(f["hook"]): (int(f["count"]), bool(f["disabled"]))})
        for o in rec.outside():
            w.set_outside(int(o["pid"]), {str(o["kind"]): int(o["count"])})
        w.add_anomalies(0, rec.anomalies())
        since = 0
        for steps in iter_step_chunks(rec, chunk):
            w.add_steps(steps)
            n += len(steps)
            since += len(steps)
            if since >= 65_536:
                w.commit()
                since = 0
        w.close()
    finally:
        rec.close()
    return n
