"""``benchmarks/attach_under_load_table.py``: the reliability table from the benchmark's runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.attach_under_load_table import table

ROOT = Path(__file__).resolve().parents[2]


def _run(d: float, wall: float, nice: int, sn: str | None, session: str = "own") -> dict:
    return {
        "duration_s": d, "wall_s": wall, "rc": 0, "startup_s": 0.4, "finish_s": wall - d - 0.4,
        "requests_per_s_attached": 15.0 + nice, "recorded_span_s": d - 0.01,
        "hooks_off_late_s": {"engine": 0.002, "worker": 0.011}, "session_nice": sn,
        "placement": {"session": session, "autogroup_nice": nice, "nice": nice},
    }  # fmt: skip


def test_rows_by_setting_and_duration_with_the_target_counted(tmp_path: Path) -> None:
    runs = [_run(3, 3.5, -5, None), _run(3, 5.2, 0, "off"), _run(3, 4.9, -5, None),
            _run(30, 31.9, -5, None), _run(30, 32.1, -5, None), _run(3, 9.0, 0, "off")]  # fmt: skip
    rows = table(runs)
    assert len(rows) == 2 + 3  # header, rule, then (default, 3), (off, 3), (default, 30)
    by = {r.split(" | ")[0].lstrip("| ") + f" D{r.split(' | ')[1]}": r for r in rows[2:]}
    dflt = by["session own, no flag, group nice -5, nice -5 D3"]
    assert "3.50 / 4.90" in dflt and "| 2 of 2 |" in dflt and "| 10.0-10.0 |" in dflt
    off = by["session own, --session-nice off, group nice 0, nice 0 D3"]
    assert "5.20 / 9.00" in off and "| 0 of 2 |" in off  # 5.2 > 3 + 2
    assert "| 1 of 2 |" in by["session own, no flag, group nice -5, nice -5 D30"]
    assert "| 2-11 |" in dflt  # the hooks' lateness in ms, every process
    assert "| 4.20 / 0.40 / 0.80 |" in dflt  # median wall, start and finish (3.5 and 4.9)
    assert "| 32.00 / 0.40 / 1.60 |" in by["session own, no flag, group nice -5, nice -5 D30"]

    f = tmp_path / "r.json"
    f.write_text(json.dumps({"runs": runs}))
    p = subprocess.run(
        [sys.executable, "benchmarks/attach_under_load_table.py", str(f)],
        capture_output=True, text=True, cwd=ROOT, check=True,
    )  # fmt: skip
    assert p.stdout.splitlines() == rows


def test_a_group_nice_raised_before_the_start_is_its_own_row() -> None:
    # the attach raises its own group to -5 as well, so the placement reads the same: only
    # the benchmark's label tells the two apart
    raised = dict(_run(3, 3.4, -5, None), group_nice_before_start=-5)
    rows = table([_run(3, 5.6, -5, None), raised, _run(3, 5.1, -5, None)])
    assert len(rows) == 2 + 2
    pre = [r for r in rows[2:] if "group nice -5 before the start" in r]
    assert len(pre) == 1 and "| 1 of 1 |" in pre[0] and "3.40" in pre[0]
    assert any("| 0 of 2 |" in r for r in rows[2:] if r not in pre)
