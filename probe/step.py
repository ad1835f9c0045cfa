"""One engine step on one rank: the declaration every surface reads.

:class:`Step` is the only input of :mod:`probe.analysis.views`, the live view, the report, the
exporters and ``probe ab``. The assembler builds Steps from records in the reader
process; :class:`probe.reader.recording.Recording` stores them and gives them back
(``Recording.iter_steps()``). The ``steps`` table of the recording is derived from this
declaration (:data:`STEP_COLUMNS`): a new scalar field here is a new column there, with
its type and range checked when a recording is read.

    >>> from probe.step import STEP_COLUMNS
    >>> [c.name for c in STEP_COLUMNS][:5]
    ['pid', 'step', 't0_ns', 't1_ns', 'host_ns']

Every field but the detail tuples is a column; ``phases`` is one ``<phase>_ns`` column
per phase. ``Annotated[..., Col(...)]`` sets what the defaults do not: the column name
(``t0`` is ``t0_ns``), the range of an integer (default: not below 0), the values of a
text field.
"""

from __future__ import annotations

import enum
import types
import typing
from dataclasses import MISSING, dataclass, fields, replace
from typing import Annotated

from probe.records import Build, Dispatch, GpuTiming, Mode, Phase, Reason, Reorder, Replay, Span

__all__ = ["PHASES", "PHASE_COLUMNS", "STEP_COLUMNS", "Col", "Column", "GpuSample", "Step"]

PHASE_COLUMNS: tuple[Phase, ...] = (
    Phase.REORDER,
    Phase.PREPARE_INPUTS,
    Phase.DISPATCH,
    Phase.METADATA_BUILD,
    Phase.FORWARD_LAUNCH,
    Phase.LOGITS,
    Phase.SAMPLE,
    Phase.DRAFT,
    Phase.SYNC_STALL,
)
#: the phase names, as keys of :attr:`Step.phases` (and ``<name>_ns`` columns)
PHASES: tuple[str, ...] = tuple(p.name.lower() for p in PHASE_COLUMNS)


@dataclass(frozen=True)
class Col:
    """How a :class:`Step` field is stored, where the defaults do not say it.

    ``name``: the column name (default: the field's); ``min``: the smallest valid integer
    (default 0; None: no bound); ``choices``: the valid values of a text field.
    """

    name: str | None = None
    min: int | None = 0
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Step:
    """One engine step on one rank. Times are CLOCK_BOOTTIME ns; durations ns.

    ``mode``/``reason`` are the target model's dispatch; ``replayed`` is True when a replay
    of that mode was observed (FULL: one replay; PIECEWISE: at least one piece).
    ``cpu_launch_overhead_ns`` runs from step start to the end of the forward launch.
    ``gpu_*`` are the device timings of the forward; they arrive a few steps after the
    step (None until then, and on engines without device timing): ``gpu_busy_ns`` is the
    forward's busy time, ``gpu_idle_before_ns`` the gap since the previous step's last
    event, ``gpu_step_ns`` the step's span on the stream (first to last event).
    ``carried_reqs`` is how many of the step's requests were scheduled before it (carried
    over, running), the rest new this step: 0 means nothing was in flight in the gap
    before the step (the engine-idle rule, :mod:`probe.analysis.rules`); None where it
    was not recorded (recordings of schema version 1).
    """

    pid: int
    step: int
    t0: Annotated[int, Col(name="t0_ns")]
    t1: Annotated[int, Col(name="t1_ns")]
    host_ns: int
    num_tokens: int
    num_reqs: int
    mode: Mode | None
    reason: Reason | None
    padded_tokens: int
    padded_reqs: int
    max_query_len: int
    uniform_decode_query_len: int
    uniform: bool
    replayed: bool
    pieces: int
    captures: int
    cpu_launch_overhead_ns: int | None
    phases: dict[str, int]
    gpu_busy_ns: int | None = None
    gpu_idle_before_ns: int | None = None
    gpu_step_ns: int | None = None
    draft_mode: Mode | None = None
    draft_reason: Reason | None = None
    draft_replays: int = 0
    draft_dispatches: int = 0
    carried_reqs: int | None = None
    runner: Annotated[str, Col(choices=("v1", "mrv2"))] = "v1"
    spans: tuple[Span, ...] = ()
    builds: tuple[Build, ...] = ()
    reorders: tuple[Reorder, ...] = ()
    dispatches: tuple[Dispatch, ...] = ()
    replays: tuple[Replay, ...] = ()

    @property
    def forward(self) -> bool:
        """A step that ran the model (the ones hit rates count)."""
        return self.mode is not None

    @property
    def decode(self) -> bool:
        """A uniform decode batch (each request 1 + speculative tokens)."""
        return self.uniform and self.uniform_decode_query_len >= 1

    @property
    def graph(self) -> bool:
        """Dispatched to a graph (FULL or PIECEWISE)."""
        return self.mode is not None and self.mode != Mode.NONE

    @property
    def gpu(self) -> GpuSample | None:
        """The step's device timing, once it arrived."""
        if self.gpu_busy_ns is None:
            return None
        return GpuSample(self.step, self.gpu_busy_ns, self.gpu_idle_before_ns, self.gpu_step_ns)

    def with_gpu(self, g: GpuSample) -> Step:
        """This step with its device timing joined in."""
        return replace(
            self, gpu_busy_ns=g.busy_ns, gpu_idle_before_ns=g.idle_before_ns, gpu_step_ns=g.step_ns
        )


_REQUIRED = object()
if any(f.default_factory is not MISSING for f in fields(Step)):  # pragma: no cover
    raise TypeError("Step: new_step fills plain defaults only, not default factories")
_STEP_TEMPLATE = {f.name: _REQUIRED if f.default is MISSING else f.default for f in fields(Step)}
_STEP_REQUIRED = frozenset(k for k, v in _STEP_TEMPLATE.items() if v is _REQUIRED)


def new_step(**kw: typing.Any) -> Step:
    """``Step(**kw)``, built without the frozen dataclass's ``__init__``, which sets its 33
    fields one ``object.__setattr__`` at a time (once per step in the reader; this takes
    about half as long). The same fields, defaults and errors for a missing or unknown
    field; ``tests/reader/test_assemble.py`` compares the two."""
    d = _STEP_TEMPLATE | kw
    if len(d) != len(_STEP_TEMPLATE) or not kw.keys() >= _STEP_REQUIRED:
        bad = sorted((kw.keys() - _STEP_TEMPLATE.keys()) or (_STEP_REQUIRED - kw.keys()))
        raise TypeError(f"Step: unknown or missing field(s) {bad}")
    o = object.__new__(Step)
    object.__setattr__(o, "__dict__", d)
    return o


@dataclass(frozen=True)
class GpuSample:
    """Device timing of one step's forward; arrives a few steps after the step.

    ``idle_before_ns`` is None for the first timed step (no previous event).
    """

    step: int
    busy_ns: int
    idle_before_ns: int | None
    step_ns: int | None = None

    @classmethod
    def of(cls, g: GpuTiming) -> GpuSample:
        return cls(
            g.step, g.busy_ns, g.idle_before_ns if g.idle_before_ns >= 0 else None, g.span_ns
        )


@dataclass(frozen=True)
class Column:
    """One column of the recording's ``steps`` table, derived from a :class:`Step` field.

    ``kind`` is ``int``, ``bool``, ``str`` or an enum class (stored as its lower-case
    name); ``phase`` is set for the ``<phase>_ns`` columns of :attr:`Step.phases`.
    """

    name: str
    field: str
    kind: type
    nullable: bool
    min: int | None = 0
    choices: tuple[str, ...] = ()
    phase: str | None = None

    @property
    def sql_type(self) -> str:
        return "TEXT" if self.kind is str or issubclass(self.kind, enum.Enum) else "INTEGER"


def _columns() -> tuple[Column, ...]:
    hints = typing.get_type_hints(Step, include_extras=True)
    out: list[Column] = []
    for f in fields(Step):
        hint = hints[f.name]
        col = Col()
        if typing.get_origin(hint) is Annotated:
            hint, *extra = typing.get_args(hint)
            col = next((x for x in extra if isinstance(x, Col)), col)
        if typing.get_origin(hint) is tuple:
            continue  # the per-step detail records: tables of their own
        if f.name == "phases":
            out.extend(Column(f"{p}_ns", f.name, int, False, phase=p) for p in PHASES)
            continue
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        nullable = typing.get_origin(hint) in (typing.Union, types.UnionType)
        kind = args[0] if nullable else hint
        out.append(Column(col.name or f.name, f.name, kind, nullable, col.min, col.choices))
    return tuple(out)


#: the ``steps`` table, in order
STEP_COLUMNS: tuple[Column, ...] = _columns()
