"""Read any supported profile, choosing the reader by name and content.

from exporters.timelines.load import load_profiles

profiles = load_profiles(["trace.json.gz", "rocprof_out/", "1234_results.db"])
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from exporters.timelines.inputs import open_regular, read_json_document, regular_file
from exporters.timelines.kineto import read_kineto
from exporters.timelines.model import Profile, ProfileError
from exporters.timelines.rocpd import read_rocpd
from exporters.timelines.rocprofv3_csv import read_rocprofv3_csv
from exporters.timelines.rocprofv3_json import read_rocprofv3_json
from probe.progress import SILENT, Progress

__all__ = ["load_profile", "load_profiles", "profile_path"]


def _kind(p: Path) -> str:
    if p.is_dir():
        return "csv"
    name = p.name.lower()
    if name.endswith(".csv"):
        regular_file(p)
        return "csv"
    if name.endswith((".db", ".sqlite", ".sqlite3", ".rpd")):
        return "rocpd"
    with open_regular(p) as fh:
        head = fh.read(16)
    if head.startswith(b"SQLite format 3"):
        return "rocpd"
    return "json"


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read one profile file or directory, choosing the reader by its name and content.

    A directory or ``.csv``: rocprofv3 CSV; ``.db`` or an SQLite header: rocpd; JSON (or
    ``.json.gz``): Kineto when it has ``traceEvents``, rocprofv3 JSON otherwise.
    Raises :class:`ProfileError` naming the file.
    """
    return load_profiles([path])[0]


def load_profiles(
    paths: Sequence[str | os.PathLike[str]], *, progress: Progress = SILENT
) -> list[Profile]:
    """Read profiles; all CSV files and directories given together form one profile.
    ``progress`` gets a stage per input read (its size is not known in advance)."""
    out: list[Profile] = []
    csvs: list[Path] = []
    for i, raw in enumerate(paths, 1):
        p = Path(raw)
        progress.stage(f"loading {p.name or p} ({i}/{len(paths)})", None, "")
        if not p.exists() and not p.is_symlink():
            raise ProfileError(p, "no such file or directory")
        kind = _kind(p)
        if kind == "csv":
            csvs.append(p)
        elif kind == "rocpd":
            out.append(read_rocpd(p))
        else:
            doc = read_json_document(p)
            if isinstance(doc, dict) and "traceEvents" in doc:
                out.append(read_kineto(p))
            elif isinstance(doc, dict) and "rocprofiler-sdk-tool" in doc:
                out.append(read_rocprofv3_json(p))
            else:
                raise ProfileError(
                    p,
                    "not a profile this probe reads: JSON without 'traceEvents' (Kineto) "
                    "or 'rocprofiler-sdk-tool' (rocprofv3)",
                )
    if csvs:
        progress.stage(f"loading rocprofv3 CSV ({len(csvs)} of {len(paths)} inputs)", None, "")
        prof = read_rocprofv3_csv(csvs)
        meta = dict(prof.meta)
        meta.setdefault("path", ", ".join(str(c) for c in csvs))
        out.insert(0, replace(prof, meta=meta))
    return out


def profile_path(profile: Profile) -> str:
    """The file(s) a profile came from, for messages."""
    meta = profile.meta
    for key in ("path", "paths", "files"):
        v = meta.get(key)
        if isinstance(v, str) and v:
            return v
        if isinstance(v, list | tuple) and v:
            return ", ".join(str(x) for x in v)
    return f"<{profile.source} profile>"
