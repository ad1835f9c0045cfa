"""Types of the compiled hot path (probe/engine/accel/_accel.c); see
probe/engine/accel/__init__.py."""

from collections.abc import Callable, Sequence
from typing import Any

RECORD_SIZE: int
HEADER_SIZE: int
STAGE_RECORDS: int
DECLARATION: (
    str  # digest of the declaration its generated header came from (probe.engine.gen_header)
)

def boottime_ns() -> int: ...
def set_clock(name: str) -> str: ...
def clock_is_tsc() -> bool: ...
def ticks() -> int: ...

class Core:
    enabled: int
    in_step: int
    clock_tsc: int
    drafter: int
    in_build: int
    sampling: int
    gpu_timing: int
    step: int
    sample_every: int
    sample_n: int
    timer_every: int
    phase_open: int
    decided: int
    phase_num_reqs: int
    phase_max_q: int
    dec_mode: int
    dec_reason: int
    dec_flags: int
    dec_num_tokens: int
    dec_padded_tokens: int
    dec_num_reqs: int
    dec_padded_reqs: int
    dec_max_q: int
    dec_uq: int
    tee: int
    fwd_open: int
    fwd_mode: int
    fwd_tokens: int
    fwd_full: int
    fwd_pieces: int
    fwd_captures: int
    fwd_passes: int
    fwd_t0: int
    fwd_t1: int
    @property
    def bound_ring(self) -> Ring | None: ...

class Packer:
    def __call__(self, *fields: int) -> bool: ...

class Ring:
    def __init__(self, buffer: Any, capacity: int) -> None: ...
    def write(self, *wire: int) -> bool: ...
    def stage(self, *wire: int) -> bool: ...
    def write_raw(self, rec: bytes | bytearray | memoryview) -> bool: ...
    def write_many(self, recs: Sequence[tuple[int, ...]]) -> int: ...
    def flush(self) -> None: ...
    def total_dropped(self) -> int: ...
    def written(self) -> int: ...
    def publish_dropped(self) -> None: ...
    def bind(self, core: Core) -> None: ...
    def unbind(self) -> None: ...
    def release(self) -> None: ...
    def disown(self) -> None: ...
    def packer(self, kind: int, layout: Sequence[tuple[int, int, int]]) -> Packer: ...

class Span:
    orig: Callable[..., Any]
    phase: int
    def __init__(
        self,
        orig: Callable[..., Any],
        core: Core,
        phase: int,
        drafter: bool = False,
        flags: int = 0,
    ) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

class Gate:
    orig: Callable[..., Any]
    impl: Callable[..., Any]
    def __init__(
        self,
        orig: Callable[..., Any],
        impl: Callable[..., Any],
        core: Core,
        sampling: bool = False,
    ) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

class Forward:
    orig: Callable[..., Any]
    def __init__(
        self,
        orig: Callable[..., Any],
        impl: Callable[..., Any],
        record: Callable[..., Any],
        core: Core,
    ) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

class Replay:
    orig: Callable[..., Any]
    def __init__(
        self,
        orig: Callable[..., Any],
        impl: Callable[..., Any],
        record: Callable[..., Any],
        core: Core,
        which: int,
        fcm: Any = None,
        fwd_record: Callable[..., Any] | None = None,
        full: Any = None,
    ) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
