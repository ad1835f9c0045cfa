"""The rocpd schema: AMD's own SQL files when ROCm is installed, else the probe's own tables.

rocprofiler-sdk installs its schema as SQL files under
``<ROCm>/share/rocprofiler-sdk-rocpd/`` (``rocpd_tables.sql``, ``rocpd_indexes.sql``,
``rocpd_views.sql``, ``data_views.sql``, ``summary_views.sql``, ``marker_views.sql``;
newer releases add ``versions.yml`` and ``versions/<X.Y.Z>/``). :func:`schema_for` uses
those files when they hold the version asked for, with the placeholder rule of
rocprofiler-sdk's ``sql.cpp``; otherwise it falls back to :data:`FALLBACK_VERSIONS`, the
tables of AMD's files declared once below (:data:`_TABLES`) with one pass-through
``rocpd_*`` view per table, as ``rocpd_views.sql`` has. The fallback has no analysis views
(``data_views.sql``, ``summary_views.sql``): those come with ROCm.

Layouts (:func:`layout_of`), by schema version: 3.x keeps ``nid``/``pid``/``tid`` on each
row (``inline``); 4.1 puts them on ``rocpd_track`` (``track``); 4.0 (``spine``) also
moves every start/end into a ``rocpd_timestamp`` table referenced by ``start_id``/
``end_id``, which only the reader handles.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_VERSION",
    "FALLBACK_VERSIONS",
    "INSTALL_ROOTS",
    "RocpdSql",
    "amd_sql",
    "fallback_sql",
    "find_installed",
    "layout_of",
    "schema_for",
    "substitute",
]

DEFAULT_VERSION = "3"
"""What the side-car claims by default: the schema rocprofv3 of ROCm 7.0 writes."""

FALLBACK_VERSIONS = ("3", "3.0.3", "4.1.0")
"""Versions whose tables the probe can create without ROCm's SQL files."""

INSTALL_ROOTS = ("/opt/rocm",)
"""ROCm installs searched for the SQL files (and every ``/opt/rocm-*`` beside them)."""

SHARE = Path("share") / "rocprofiler-sdk-rocpd"
"""Where rocprofiler-sdk installs its schema under a ROCm prefix (its CMake ``install``)."""

# The tables of AMD's rocpd_tables.sql (ROCm/rocm-systems, projects/rocprofiler-sdk/
# source/share/rocprofiler-sdk-rocpd, MIT): snapshot 1b1610fc (version "3"),
# versions/3.0.3 @ ba070c37 and versions/4.1.0 @ a195360b. One line per table; every table
# but rocpd_metadata starts with "id" (autoincrement primary key) and "guid". A column is
# name:TYPE, with a version prefix when only some versions have it (3: = 3 and 3.0.3,
# 303: = 3.0.3, 4: = 4.1.0), ">table" for a foreign key to table(id) and {A|B} for a
# CHECK (col IN (A, B)); indented lines continue a table.
# Types: I INTEGER, INT, B BIGINT, T TEXT, R REAL, J JSONB; "!" NOT
# NULL, "u" UNIQUE, "=x" DEFAULT x, J is DEFAULT "{}" NOT NULL unless J? / J[].
_TABLES = """
rocpd_metadata -guid tag:T! value:T!
rocpd_string string:T!u
rocpd_info_node hash:B!u machine_id:T!u 4:name:T system_name:T hostname:T release:T version:T
    hardware_name:T domain_name:T
rocpd_info_process nid:I!>rocpd_info_node ppid:I pid:I! 4:name:T init:B fini:B start:B end:B
    command:T environment:J extdata:J
rocpd_info_thread nid:I!>rocpd_info_node ppid:I pid:I!>rocpd_info_process tid:I! name:T start:B
    end:B extdata:J
4:rocpd_info_category name:T! extdata:J
rocpd_info_agent nid:I!>rocpd_info_node pid:I!>rocpd_info_process type:T{CPU|GPU} absolute_index:I
    logical_index:I type_index:I uuid:I name:T 4:generic_name:T model_name:T vendor_name:T
    product_name:T 3:user_name:T extdata:J
rocpd_info_queue nid:I!>rocpd_info_node pid:I!>rocpd_info_process name:T extdata:J
rocpd_info_stream nid:I!>rocpd_info_node pid:I!>rocpd_info_process name:T extdata:J
rocpd_info_pmc nid:I!>rocpd_info_node pid:I!>rocpd_info_process agent_id:I>rocpd_info_agent
    303:target_arch:T{CPU|GPU|NIC} 3+4:target_arch:T{CPU|GPU} event_code:INT instance_id:I name:T!
    symbol:T! 4:qualifier:T description:T long_description:T="" component:T units:T=""
    value_type:T{ABS|ACCUM|RELATIVE} block:T expression:T is_constant:I is_derived:I
    303:spm_support:I extdata:J
rocpd_info_code_object nid:I!>rocpd_info_node pid:I!>rocpd_info_process agent_id:I>rocpd_info_agent
    uri:T load_base:B load_size:B load_delta:B storage_type:T{FILE|MEMORY} extdata:J
rocpd_info_kernel_symbol nid:I!>rocpd_info_node pid:I!>rocpd_info_process
    code_object_id:I!>rocpd_info_code_object kernel_name:T display_name:T kernel_object:I
    kernarg_segment_size:I kernarg_segment_alignment:I group_segment_size:I private_segment_size:I
    sgpr_count:I arch_vgpr_count:I accum_vgpr_count:I extdata:J
4:rocpd_info_address_range nid:I!>rocpd_info_node pid:I!>rocpd_info_process address_base:B
    address_low:B address_high:B extdata:J
4:rocpd_info_source_code nid:I!>rocpd_info_node pid:I!>rocpd_info_process
    address_id:I>rocpd_info_address_range file:T line_number:I lines:J[] instructions:J[] extdata:J
4:rocpd_info_pc nid:I!>rocpd_info_node pid:I!>rocpd_info_process function:T!
    address_id:I>rocpd_info_address_range file:T line:I extdata:J
rocpd_track nid:I!>rocpd_info_node 4:ppid:I pid:I>rocpd_info_process tid:I>rocpd_info_thread
    4:agent_id:I>rocpd_info_agent 4:queue_id:I>rocpd_info_queue 4:stream_id:I>rocpd_info_stream
    name_id:I>rocpd_string extdata:J
3:rocpd_event category_id:I>rocpd_string stack_id:I parent_stack_id:I correlation_id:I call_stack:J
    line_info:J extdata:J
4:rocpd_event category_id:I>rocpd_info_category stack_id:I parent_stack_id:I correlation_id:I
    extdata:J
rocpd_arg event_id:I!>rocpd_event position:I! type:T! name:T! value:T extdata:J
4:rocpd_line_info event_id:I!>rocpd_event source_code_id:I>rocpd_info_source_code
    pc_id:I>rocpd_info_pc extdata:J
4:rocpd_call_stack event_id:I!>rocpd_event pc_id:I>rocpd_info_pc depth:I! extdata:J
rocpd_pmc_event event_id:I>rocpd_event 303:sample_id:I>rocpd_sample pmc_id:I!>rocpd_info_pmc
    value:R=0.0 303:xcc:I 303:shader_engine:I 303:instance:I extdata:J?
3:rocpd_region nid:I!>rocpd_info_node pid:I!>rocpd_info_process tid:I!>rocpd_info_thread start:B!
    end:B! name_id:I!>rocpd_string event_id:I>rocpd_event extdata:J
4:rocpd_region track_id:I!>rocpd_track name_id:I!>rocpd_string start:B! end:B!
    event_id:I>rocpd_event extdata:J
rocpd_sample track_id:I!>rocpd_track 4:name_id:I!>rocpd_string timestamp:B! event_id:I>rocpd_event
    extdata:J
rocpd_kernel_dispatch 3:nid:I!>rocpd_info_node 3:pid:I!>rocpd_info_process
    3:tid:I>rocpd_info_thread 4:track_id:I!>rocpd_track 3:agent_id:I!>rocpd_info_agent
    kernel_id:I!>rocpd_info_kernel_symbol dispatch_id:I! 3:queue_id:I!>rocpd_info_queue
    3:stream_id:I!>rocpd_info_stream start:B! end:B! private_segment_size:I group_segment_size:I
    workgroup_size_x:I! workgroup_size_y:I! workgroup_size_z:I! grid_size_x:I! grid_size_y:I!
    grid_size_z:I! 303:graph_exec_id:I!=0 303:graph_node_id:I!=0 region_name_id:I>rocpd_string
    event_id:I>rocpd_event extdata:J
rocpd_memory_copy 3:nid:I!>rocpd_info_node 3:pid:I!>rocpd_info_process 3:tid:I>rocpd_info_thread
    4:track_id:I!>rocpd_track start:B! end:B! name_id:I!>rocpd_string
    dst_agent_id:I>rocpd_info_agent dst_address:I src_agent_id:I>rocpd_info_agent src_address:I
    size:I! 3:queue_id:I>rocpd_info_queue 3:stream_id:I>rocpd_info_stream 303:graph_exec_id:I!=0
    303:graph_node_id:I!=0 region_name_id:I>rocpd_string event_id:I>rocpd_event extdata:J
rocpd_memory_allocate 3:nid:I!>rocpd_info_node 3:pid:I!>rocpd_info_process
    3:tid:I>rocpd_info_thread 4:track_id:I!>rocpd_track 3:agent_id:I>rocpd_info_agent
    type:T{ALLOC|FREE|REALLOC|RECLAIM} level:T{REAL|VIRTUAL|SCRATCH} start:B! end:B!
    4:name_id:I!>rocpd_string address:I size:I! 3:queue_id:I>rocpd_info_queue
    3:stream_id:I>rocpd_info_stream 4:region_name_id:I>rocpd_string event_id:I>rocpd_event
    extdata:J
303:rocpd_graph_launch nid:I!>rocpd_info_node pid:I!>rocpd_info_process tid:I>rocpd_info_thread
    agent_id:I>rocpd_info_agent queue_id:I>rocpd_info_queue start:B! end:B! graph_exec_id:I!
    kernel_dispatch_count:I!=0 event_id:I>rocpd_event extdata:J
303:rocpd_event_operation nid:I!>rocpd_info_node pid:I!>rocpd_info_process tid:I>rocpd_info_thread
    agent_id:I!>rocpd_info_agent event_obj:I! type_id:I! issue_id:I! queue_id:I!>rocpd_info_queue
    stream_id:I!>rocpd_info_stream start:B! end:B! type:T{WAIT|SIGNAL} event_id:I>rocpd_event
"""

# Version prefixes of _TABLES and the fallback versions each one covers.
_PREFIXES = {"": {"3", "3.0.3", "4.1.0"}, "3": {"3", "3.0.3"}, "303": {"3.0.3"}, "4": {"4.1.0"}}
_PREFIXES["3+4"] = {"3", "4.1.0"}
_TYPES = {"I": "INTEGER", "INT": "INT", "B": "BIGINT", "T": "TEXT", "R": "REAL", "J": "JSONB"}
_COLUMN = re.compile(
    r"(?:([\d+]+):)?(\w+):([A-Z]+)(!?)(u?)(?:=(\S+?))?(\?|\[\])?(?:\{([\w|]+)\})?(?:>(\w+))?$"
)
_TABLE_CHECKS = {
    "rocpd_info_address_range": (
        '"address_low" BIGINT CHECK ("address_low" >= "address_base")',
        '"address_high" BIGINT CHECK ("address_high" >= "address_low")',
    )
}


def _prefix_versions(prefix: str | None) -> set[str]:
    return _PREFIXES[prefix or ""]


def _column_sql(m: re.Match[str]) -> str:
    _, name, code, notnull, unique, default, json_kind, check, _ = m.groups()
    decl = [f'"{name}"', _TYPES[code]]
    if code == "J":
        decl.append(f'DEFAULT "{"[]" if json_kind == "[]" else "{}"}"')
        notnull = "" if json_kind == "?" else "!"
    elif default is not None:
        decl.append(f"DEFAULT {default}")
    if notnull:
        decl.append("NOT NULL")
    if unique:
        decl.append("UNIQUE ON CONFLICT ABORT" if name == "string" else "UNIQUE")
    if check:
        values = ", ".join(f"'{v}'" for v in check.split("|"))
        decl.append(f'CHECK ("{name}" IN ({values}))')
    return " ".join(decl)


def _tables(version: str) -> list[tuple[str, list[str], list[tuple[str, str]]]]:
    """(table, column declarations, foreign keys) of the fallback ``version``."""
    out = []
    for line in re.sub(r"\n\s+", " ", _TABLES).strip().splitlines():
        head, *specs = line.split()
        tprefix, _, table = head.rpartition(":")
        if version not in _prefix_versions(tprefix):
            continue
        cols = ['"id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT']
        if specs[:1] == ["-guid"]:
            specs = specs[1:]
        else:
            cols.append('"guid" TEXT DEFAULT "{{guid}}" NOT NULL')
        fks: list[tuple[str, str]] = []
        for spec in specs:
            m = _COLUMN.match(spec)
            if m is None:
                raise AssertionError(f"bad column spec {spec!r} in {table}")
            if version not in _prefix_versions(m.group(1)):
                continue
            if table in _TABLE_CHECKS and m.group(2) in ("address_low", "address_high"):
                cols.append(_TABLE_CHECKS[table][m.group(2) == "address_high"])
            else:
                cols.append(_column_sql(m))
            if m.group(9):
                fks.append((m.group(2), m.group(9)))
        out.append((table, cols, fks))
    return out


@dataclass(frozen=True)
class RocpdSql:
    """The SQL that makes a rocpd database of one schema version, before substitution.

    ``views`` run in order after ``tables`` and ``indexes`` (the order of rocprofiler-sdk's
    Python ``RocpdSchema.write_schema``). ``suffixed`` is whether tables carry the
    ``{{uuid}}`` suffix (AMD's 4.1.0 views only work without it). ``source`` says where
    the text came from, for messages.
    """

    version: str
    tables: str
    indexes: str
    views: tuple[str, ...]
    source: str
    suffixed: bool = True

    def script(self, uuid: str, guid: str) -> str:
        """Everything in execution order, placeholders substituted (see :func:`substitute`)."""
        parts = [self.tables, self.indexes, *self.views]
        return "\n".join(substitute(p, uuid if self.suffixed else "", guid) for p in parts)

    def view_names(self, uuid: str) -> list[str]:
        text = "\n".join(substitute(v, uuid if self.suffixed else "", "") for v in self.views)
        return re.findall(r"CREATE\s+VIEW\s+IF\s+NOT\s+EXISTS\s+`?(\w+)`?", text, re.IGNORECASE)


def substitute(text: str, uuid: str, guid: str) -> str:
    """rocprofiler-sdk's placeholder rule (``sql.cpp``, ``rocpd_sql_load_schema``).

    ``{{uuid}}`` becomes the uuid with ``-`` as ``_`` and a leading ``_`` (nothing when
    empty); ``{{guid}}`` the guid unchanged.
    """
    u = uuid.replace("-", "_")
    if u and not u.startswith("_"):
        u = "_" + u
    return text.replace("{{uuid}}", u).replace("{{guid}}", guid)


def fallback_sql(version: str) -> RocpdSql:
    """The probe's own tables for ``version`` (one of :data:`FALLBACK_VERSIONS`)."""
    if version not in FALLBACK_VERSIONS:
        raise ValueError(
            f"no built-in rocpd schema {version!r}; built in: {', '.join(FALLBACK_VERSIONS)} "
            "(other versions need ROCm's SQL files)"
        )
    tables = _tables(version)
    ddl = []
    for table, cols, fks in tables:
        body = [*cols]
        body += [
            f"FOREIGN KEY ({c}) REFERENCES `{ref}{{{{uuid}}}}` (id) ON UPDATE CASCADE"
            for c, ref in fks
        ]
        inner = ",\n    ".join(body)
        ddl.append(f"CREATE TABLE IF NOT EXISTS `{table}{{{{uuid}}}}` (\n    {inner}\n);")
    suffixed = version != "4.1.0"
    views = (
        tuple(
            f"CREATE VIEW IF NOT EXISTS `{t}` AS SELECT * FROM `{t}{{{{uuid}}}}`;"
            for t, _, _ in tables
        )
        if suffixed
        else ()
    )
    return RocpdSql(version, "\n\n".join(ddl), "", views, "built-in tables", suffixed)


_YML_ENTRY = re.compile(r"-\s*version:\s*\"?([\w.]+)\"?((?:\n\s+\w+:\s*\S+)*)")
_YML_FIELD = re.compile(r"(\w+):\s*(\S+)")
_SCHEMA_VERSION = re.compile(r"\(\s*[\"']schema_version[\"']\s*,\s*[\"']([\w.]+)[\"']\s*\)")
_VIEW_KEYS = ("rocpd_views", "rocpd_data_views", "rocpd_summary_views")
_TOP_VIEWS = ("rocpd_views.sql", "data_views.sql", "summary_views.sql", "marker_views.sql")


def _read(p: Path) -> str:
    return p.read_text(encoding="utf-8") if p.is_file() else ""


def amd_sql(share: str | os.PathLike[str], version: str) -> RocpdSql | None:
    """AMD's SQL for ``version`` from a ``share/rocprofiler-sdk-rocpd`` folder, or None.

    With a ``versions.yml`` (newer rocprofiler-sdk), its entry for ``version`` names the
    files; without one (ROCm 7.0), the top-level files are the version their tables file
    inserts as ``schema_version``. A version whose tables file is missing is None.
    """
    d = Path(share)
    yml = _read(d / "versions.yml")
    for m in _YML_ENTRY.finditer(yml):
        if m.group(1) != version:
            continue
        files = dict(_YML_FIELD.findall(m.group(2)))
        tables = _read(d / files.get("rocpd_tables", "-"))
        if not tables:
            return None
        return RocpdSql(
            version,
            tables,
            _read(d / files.get("rocpd_indexes", "-")),
            tuple(t for k in _VIEW_KEYS if (t := _read(d / files.get(k, "-")))),
            str(d),
            suffixed=not version.startswith("4."),
        )
    tables = _read(d / "rocpd_tables.sql")
    claimed = _SCHEMA_VERSION.search(tables)
    if tables and claimed and claimed.group(1) == version:
        views = tuple(t for name in _TOP_VIEWS if (t := _read(d / name)))
        return RocpdSql(version, tables, _read(d / "rocpd_indexes.sql"), views, str(d))
    return None


def _install_dirs(roots: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for root in roots:
        r = Path(root)
        candidates = [r, *sorted(r.parent.glob(r.name + "-*"), reverse=True)]
        out.extend(c / SHARE for c in candidates if (c / SHARE).is_dir())
    return out


def find_installed(version: str, roots: Sequence[str] = INSTALL_ROOTS) -> RocpdSql | None:
    """AMD's SQL for ``version`` from an installed ROCm (``/opt/rocm``, then
    ``/opt/rocm-*`` newest first), or None when no install has it."""
    for d in _install_dirs(roots):
        found = amd_sql(d, version)
        if found is not None:
            return found
    return None


def schema_for(
    version: str,
    *,
    sql_dir: str | os.PathLike[str] | None = None,
    roots: Sequence[str] = INSTALL_ROOTS,
) -> RocpdSql:
    """The SQL for ``version``: from ``sql_dir`` when given (it must have the version),
    else an installed ROCm's, else :func:`fallback_sql`. Raises ``ValueError`` naming what
    was looked at when none has it."""
    if sql_dir is not None:
        found = amd_sql(sql_dir, version)
        if found is None:
            raise ValueError(f"{sql_dir} has no rocpd SQL files for schema version {version!r}")
        return found
    return find_installed(version, roots) or fallback_sql(version)


_V3 = re.compile(r"^3(\.\d+){0,2}$")
_V40 = re.compile(r"^4(\.0(\.\d+)?)?$")
_V41 = re.compile(r"^4\.1(\.\d+)?$")


def layout_of(version: str) -> str | None:
    """``inline`` (3.x), ``spine`` (4.0.x: times in ``rocpd_timestamp``), ``track``
    (4.1.x) or None for a schema version the probe does not know."""
    if _V3.match(version):
        return "inline"
    if _V40.match(version):
        return "spine"
    if _V41.match(version):
        return "track"
    return None
