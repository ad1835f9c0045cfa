"""The columnar recording's schema, from the one declaration (:data:`probe.step.STEP_COLUMNS`
and :data:`probe.reader.recording_schema.DETAIL_TABLES`): an Arrow schema per table, the
Parquet encodings, the manifest's name and version, and the per-step record counts the
summary reads beside each step (so a report reads the ``steps`` table alone).

A columnar recording is a folder ``NAME.probe/``::

    recording.json        the manifest: format and version, meta, processes (with their
                          static snapshots), builder names, faults, anomalies, and which
                          data files hold what (written whole and renamed into place)
    steps.parquet         one row per engine step and rank, sorted by (pid, step)
    spans.parquet ...     one file per detail table (dispatches, replays, builds, reorders)
    live/<table>.arrows   while it is written: Arrow IPC streams, one record batch per
                          table per flush; the manifest says how many batches are whole

Enums are their lower-case names (dictionary-encoded), booleans and flags are booleans,
times are CLOCK_BOOTTIME ns and durations ns, as in the SQLite recording, so the same SQL
reads either (``docs/recording-format.md``).
"""

from __future__ import annotations

import enum
from typing import Any

# the manifest's name, and what is a columnar recording or an SQLite name (a leaf module)
from probe.reader.recording_names import MANIFEST as MANIFEST
from probe.reader.recording_names import is_columnar as is_columnar
from probe.reader.recording_names import is_sqlite_name as is_sqlite_name
from probe.reader.recording_schema import DETAIL_TABLES, DetailColumn
from probe.records import Flag
from probe.step import STEP_COLUMNS, Column

#: what the manifest's ``format`` key holds
FORMAT = "vllm-graph-probe columnar recording"
#: the version of the folder's layout this probe writes (and the versions it reads)
FORMAT_VERSION = 1
READ_FORMAT_VERSIONS: tuple[int, ...] = (1,)
#: the suffix of a columnar recording's folder
SUFFIX = ".probe"
#: the live streams' folder inside a recording
LIVE = "live"

#: the tables of a recording, in the order they are written and read
TABLES: tuple[str, ...] = ("steps", *(t.name for t in DETAIL_TABLES))

#: per step, how many records of each kind it holds, counted once when the recording is
#: compacted (:data:`COUNT_SQL`), read by the probe-cost pass with the step's columns:
#: name -> what it counts
COUNT_COLUMNS: dict[str, str] = {
    "n_spans": "spans that are not the step's bracket (execute, sample_tokens, forward_launch)",
    "n_bracket_spans": "the step's bracket spans",
    "n_launch_spans": "1 when the target model's forward_launch span is there",
    "n_derived_spans": "prepare_inputs spans ending where a metadata_build span starts",
    "n_dispatches": "dispatch records",
    "n_dispatches_in_phase": "target-model dispatches inside the step's dispatch span",
    "n_replays": "replays that are not captures",
    "n_builds": "metadata builds",
    "n_reorders": "reorder decisions",
}

_BRACKET = (
    "CASE phase WHEN 'execute' THEN 1 WHEN 'sample_tokens' THEN 1 "
    "WHEN 'forward_launch' THEN 1 ELSE 0 END"
)


def count_sql(false: str = "0") -> dict[str, str]:
    """Per detail aggregate, the SQL grouping it by (pid, step): ``pid, step`` then the
    counts (of :data:`COUNT_COLUMNS`), over tables named as the recording's. The one
    definition: SQLite runs it over an SQLite recording, DuckDB over a columnar one when it
    is compacted. ``false``: how the dialect writes a flag that is off (``0``; ``false``)."""
    return {
        "spans": (
            f"SELECT pid, step, count(*) - sum({_BRACKET}), sum({_BRACKET}), "
            f"max(CASE WHEN phase = 'forward_launch' AND drafter = {false} THEN 1 ELSE 0 END) "
            "FROM spans GROUP BY pid, step"
        ),
        "derived": (
            "SELECT a.pid, a.step, count(DISTINCT a.t0_ns || ':' || a.t1_ns) FROM spans AS a "
            "JOIN spans AS b ON b.pid = a.pid AND b.step = a.step AND b.phase = 'metadata_build'"
            f" AND b.drafter = {false} AND b.t0_ns = a.t1_ns WHERE a.phase = 'prepare_inputs' "
            f"AND a.drafter = {false} GROUP BY a.pid, a.step"
        ),
        "dispatches": (
            "SELECT d.pid, d.step, count(*), sum(CASE WHEN d.drafter = "
            f"{false} AND EXISTS (SELECT 1 FROM spans AS s WHERE s.pid = d.pid AND s.step = "
            f"d.step AND s.phase = 'dispatch' AND s.drafter = {false} AND s.t0_ns = d.t0_ns "
            "AND s.t1_ns = d.t1_ns) THEN 1 ELSE 0 END) FROM dispatches AS d GROUP BY d.pid, d.step"
        ),
        "replays": "SELECT pid, step, count(*) FROM replays WHERE kind != 'capture' GROUP BY 1, 2",
        "builds": "SELECT pid, step, count(*) FROM builds GROUP BY 1, 2",
        "reorders": "SELECT pid, step, count(*) FROM reorders GROUP BY 1, 2",
    }


#: which :data:`COUNT_COLUMNS` each aggregate of :func:`count_sql` fills, in its order
COUNT_PARTS: dict[str, tuple[str, ...]] = {
    "spans": ("n_spans", "n_bracket_spans", "n_launch_spans"),
    "derived": ("n_derived_spans",),
    "dispatches": ("n_dispatches", "n_dispatches_in_phase"),
    "replays": ("n_replays",),
    "builds": ("n_builds",),
    "reorders": ("n_reorders",),
}


def is_text(kind: Any) -> bool:
    """A column stored as text: an enum (its lower-case name), the runner, a builder."""
    if isinstance(kind, Flag):
        return False
    return kind is str or (isinstance(kind, type) and issubclass(kind, enum.Enum))


def names_of(c: Column | DetailColumn) -> tuple[str, ...]:
    """The valid values of a text column, in code order (an enum's member values are its
    codes; a ``choices`` column's index is its code)."""
    if isinstance(c, Column) and c.kind is str:
        return c.choices
    kind: Any = c.kind
    return tuple(m.lower() for m in kind.__members__)


def arrow_type(kind: Any) -> Any:
    import pyarrow as pa

    if is_text(kind):
        return pa.string()
    if kind is bool or isinstance(kind, Flag):
        return pa.bool_()
    return pa.int64()


def step_schema(with_counts: bool = True) -> Any:
    """The ``steps`` table's Arrow schema: :data:`STEP_COLUMNS` in order, then (in a
    compacted file) the :data:`COUNT_COLUMNS`."""
    import pyarrow as pa

    fields = [pa.field(c.name, arrow_type(c.kind), nullable=c.nullable) for c in STEP_COLUMNS]
    if with_counts:
        fields += [pa.field(n, pa.int64(), nullable=False) for n in COUNT_COLUMNS]
    return pa.schema(fields)


def detail_schema(name: str) -> Any:
    """A detail table's Arrow schema: ``pid``, ``step``, then its columns (a builder's
    class name may be missing: nullable)."""
    import pyarrow as pa

    t = next(t for t in DETAIL_TABLES if t.name == name)
    fields = [pa.field("pid", pa.int64(), False), pa.field("step", pa.int64(), False)]
    fields += [pa.field(c.name, arrow_type(c.kind), nullable=c.kind is str) for c in t.columns]
    return pa.schema(fields)


def gpu_schema() -> Any:
    """Device timings as they arrive (a few steps late), joined into ``steps`` when the
    recording is compacted."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("pid", pa.int64(), False),
            pa.field("step", pa.int64(), False),
            pa.field("busy_ns", pa.int64(), False),
            pa.field("idle_before_ns", pa.int64()),
            pa.field("step_ns", pa.int64()),
        ]
    )


def live_schema(table: str) -> Any:
    """The schema of a table's live stream (``steps`` without its counts; ``gpu`` too)."""
    if table == "steps":
        return step_schema(with_counts=False)
    if table == "gpu":
        return gpu_schema()
    return detail_schema(table)
