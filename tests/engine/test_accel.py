"""Which hot path runs: the compiled one when built, pure Python otherwise, said once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from probe.engine import accel

ROOT = Path(__file__).resolve().parents[2]


def _child(code: str, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if k != "PROBE_ACCEL"},
            "PYTHONPATH": str(ROOT),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout + out.stderr


def test_ci_builds_the_extension() -> None:
    if os.environ.get("PROBE_REQUIRE_ACCEL") != "1":
        pytest.skip("PROBE_REQUIRE_ACCEL=1 is set by scripts/test")
    assert accel.COMPILED, accel.WHY_NOT


def test_a_missing_extension_falls_back_with_one_line() -> None:
    code = (
        "import sys, logging; logging.basicConfig(format='%(message)s')\n"
        "sys.modules['probe.engine.accel._accel'] = None  # as when the build found no compiler\n"
        "import probe.engine.accel as a\n"
        "from probe.engine.runtime import RT\n"
        "print('path', a.NAME, type(RT).__mro__[1].__name__)\n"
    )
    out = _child(code)
    assert "path python PyCore" in out
    lines = [ln for ln in out.splitlines() if "pure-Python hot path" in ln]
    assert len(lines) == 1 and "not built" in lines[0], out


def test_probe_accel_0_forces_python_quietly() -> None:
    out = _child(
        "import probe.engine.accel as a; print('path', a.NAME, a.WHY_NOT)", PROBE_ACCEL="0"
    )
    assert "path python PROBE_ACCEL=0" in out and "pure-Python hot path" not in out


@pytest.mark.skipif(not accel.COMPILED, reason=f"compiled path not built: {accel.WHY_NOT}")
def test_the_runtime_says_which_path_its_writer_runs(tmp_path: Path) -> None:
    from probe.engine.ring_writer import RingWriter
    from probe.engine.runtime import RT
    from probe.reader.ring_reader import RingReader
    from probe.records import Decoder

    for name, expect in (("compiled", 1), ("python", 0)):
        RT.reset()
        with accel.use(name), RingWriter.create(tmp_path / name, 64) as writer:
            RT.attach(writer)
            assert RT.hot_path == name
            RT.detach()
            dec = Decoder()
            with RingReader.open(writer.path) as reader:
                for rec in reader.read():
                    dec.feed(rec)
        assert dec.hello is not None and dec.hello.hot_path == expect
    RT.reset()


def test_the_hot_fields_are_typed_as_declared() -> None:
    """The two typing declarations of the hot fields (PyCore's annotations, the Core stub
    in _accel.pyi) name exactly the fields of HOT_FIELDS, so neither drifts unseen."""
    import re

    assert set(accel.PyCore.__annotations__) == set(accel.HOT_FIELDS)
    stub = (Path(accel.__file__).parent / "_accel.pyi").read_text(encoding="utf-8")
    body = stub.split("class Core:", 1)[1].split("\nclass ", 1)[0]
    assert set(re.findall(r"^    (\w+): int$", body, re.M)) == set(accel.HOT_FIELDS)


@pytest.mark.skipif(not accel.COMPILED, reason=f"compiled path not built: {accel.WHY_NOT}")
def test_the_python_core_has_the_compiled_cores_fields() -> None:
    """One table of hot fields: the C Core's members, PyCore and Runtime.reset agree."""
    import probe.engine.accel._accel as c

    members = {n for n, v in vars(c.Core).items() if type(v).__name__ == "member_descriptor"}
    assert members == set(accel.HOT_FIELDS)
    py = accel.PyCore()
    assert {n: getattr(py, n) for n in accel.HOT_FIELDS} == accel.HOT_FIELDS
    from probe.engine.runtime import RT

    RT.step, RT.sample_every = 41, 9
    RT.reset()
    assert {n: int(getattr(RT, n)) for n in accel.HOT_FIELDS} == accel.HOT_FIELDS


@pytest.mark.skipif(not accel.COMPILED, reason=f"compiled path not built: {accel.WHY_NOT}")
def test_a_compiled_span_takes_its_flags_as_a_byte() -> None:
    """The flags a Span sets on each record (Flag.FROM_DISPATCH) are one wire byte."""
    from probe.engine.runtime import RT
    from probe.records import Flag

    c = accel._compiled()
    assert c is not None and isinstance(RT, c.Core)
    span = c.Span(len, RT, 5, False, int(Flag.FROM_DISPATCH))
    assert span("abc") == 3  # dormant: vLLM's original, nothing else
    for bad in (-1, 256):
        with pytest.raises(ValueError, match="flags is a byte"):
            c.Span(len, RT, 5, False, bad)


# -- the hooks' clock: the time stamp counter carried to CLOCK_BOOTTIME (PROBE_CLOCK) ------


def _tsc_or_skip() -> None:
    why = accel._tsc_is_the_kernels()
    if why:
        pytest.skip(f"no TSC clock here: {why}")


@pytest.fixture
def tsc_clock() -> Any:
    _tsc_or_skip()
    assert accel.set_clock("tsc") == ("tsc", "")
    yield
    accel.set_clock("boottime")


@pytest.mark.skipif(not accel.COMPILED, reason=f"compiled path not built: {accel.WHY_NOT}")
def test_the_tsc_clock_reads_the_kernels_boottime_and_never_goes_back(tsc_clock: Any) -> None:
    """Every reading lies between the kernel's own readings around it (give or take 2 µs:
    the anchor's bracket and the rate's error over the anchor's 10 ms), across pauses
    longer than an anchor lives, and no reading is below the one before."""
    c = accel._C
    assert c is not None and accel.clock() == "tsc"
    kernel, boot = time.clock_gettime_ns, time.CLOCK_BOOTTIME
    worst, prev = 0, 0
    for i in range(4000):
        if i % 400 == 0:
            time.sleep(0.012 + 0.002 * (i // 400))  # past the anchor's age: a new anchor
        k0 = kernel(boot)
        t = c.boottime_ns()
        k1 = kernel(boot)
        worst = max(worst, k0 - t, t - k1)
        assert t >= prev
        prev = t
    assert worst < 2_000, f"{worst} ns outside the kernel's readings"
    accel.set_clock("boottime")
    assert accel.clock() == "boottime"
    k0, t, k1 = kernel(boot), c.boottime_ns(), kernel(boot)
    assert k0 <= t <= k1


@pytest.mark.skipif(not accel.COMPILED, reason=f"compiled path not built: {accel.WHY_NOT}")
def test_a_compiled_span_on_the_tsc_clock_is_timed_in_boottime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attached with PROBE_CLOCK=tsc, a compiled span's record carries BOOTTIME ns: its
    start and end lie within the kernel's readings around the call, its length the call's."""
    from probe.engine.ring_writer import RingWriter
    from probe.engine.runtime import RT
    from probe.reader.ring_reader import RingReader
    from probe.records import Decoder, Phase

    _tsc_or_skip()
    monkeypatch.setenv("PROBE_CLOCK", "tsc")
    RT.reset()
    try:
        with accel.use("compiled"), RingWriter.create(tmp_path / "r", 64) as writer:
            RT.attach(writer)
            assert (RT.clock, RT.clock_why) == ("tsc", "")
            span = accel.span_hook(time.sleep, RT, int(Phase.SAMPLE), False)
            RT.enabled, RT.in_step = True, 1
            k0 = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
            span(0.003)
            k1 = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
            RT.enabled, RT.in_step = False, 0
            RT.detach()
            dec = Decoder()
            with RingReader.open(writer.path) as reader:
                got = [d for rec in reader.read() if (d := dec.feed(rec)) is not None]
    finally:
        accel.set_clock("boottime")
        RT.reset()
    (rec,) = [d for d in got if type(d).__name__ == "Span"]
    assert k0 - 2_000 <= rec.t0 < rec.t1 <= k1 + 2_000
    assert 3_000_000 <= rec.t1 - rec.t0 <= k1 - k0 + 4_000


def test_the_tsc_clock_is_taken_only_where_the_kernels_clocksource_is_the_tsc(
    tmp_path: Path,
) -> None:
    src, cpu = tmp_path / "clocksource", tmp_path / "cpuinfo"
    cpu.write_text("processor\t: 0\nflags\t\t: fpu tsc constant_tsc nonstop_tsc sse\n")
    src.write_text("kvm-clock\n")
    if accel._C is None or accel._C.ticks() == 0:
        assert accel._tsc_is_the_kernels(src, cpu) != ""
        return
    assert (
        accel._tsc_is_the_kernels(src, cpu) == "the kernel's clocksource is 'kvm-clock', not 'tsc'"
    )
    src.write_text("tsc\n")
    assert accel._tsc_is_the_kernels(src, cpu) == ""
    cpu.write_text("flags\t\t: fpu tsc constant_tsc\n")
    assert accel._tsc_is_the_kernels(src, cpu) == "the CPU's TSC lacks nonstop_tsc"
    assert "cannot read" in accel._tsc_is_the_kernels(tmp_path / "missing", cpu)
    assert accel.set_clock("boottime") == ("boottime", "PROBE_CLOCK=boottime")
    with pytest.raises(ValueError, match="unknown clock"):
        accel.set_clock("hpet")
