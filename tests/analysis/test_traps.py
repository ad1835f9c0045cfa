"""Traps from one function (probe.analysis.traps.traps): ``probe report`` and ``probe doctor``
print the same ones on every committed recording, and a check that cannot run says so.

The checks themselves run on snapshots of the real vLLM classes in
tests/wheels/test_doctor_traps.py (every wheel tree)."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from recordings import committed

from probe.analysis.traps import CHECKS, traps
from probe.cli.main import main
from probe.reader.recording import Recording
from probe.records import Mode, Reason
from probe.step import Step

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = committed()
STOCK = ROOT / "tests/data/stock_mrv2_k1.probe"
BUNDLED = ROOT / "probe/data/default.probe"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def _pairs(rows: list[dict[str, str]]) -> set[tuple[str, str]]:
    return {(r["code"], r["message"]) for r in rows}


def test_every_committed_recording_is_checked() -> None:
    assert len(COMMITTED) >= 5 and str(STOCK.relative_to(ROOT)) in COMMITTED


@pytest.mark.parametrize("path", COMMITTED)
def test_report_and_doctor_print_the_same_traps(
    path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    full = str(ROOT / path)
    rep = json.loads(_run(capsys, "report", full, "--json"))
    doc = json.loads(_run(capsys, "doctor", full, "--json"))
    assert doc, "every committed recording has a snapshot"
    assert _pairs(rep["traps"]) == set().union(*(_pairs(d["traps"]) for d in doc))
    assert _pairs(rep["not_checked"]) == set().union(*(_pairs(d["not_checked"]) for d in doc))
    # and in the words people read (wide, so no message wraps)
    rep_text = _run(capsys, "report", full, "--width", "1000")
    doc_text = _run(capsys, "doctor", full, "--width", "1000")
    in_report = set(re.findall(r"⚠ (.+?)\s*│?\s*$", rep_text, re.M))
    in_doctor = set(re.findall(r"⚠ \w+: (.+?)\s*$", doc_text, re.M))
    assert in_report == in_doctor == {m for _, m in _pairs(rep["traps"])}
    for code, _ in _pairs(rep["not_checked"]):
        assert f"not checked: {code}:" in rep_text and f"not checked: {code}:" in doc_text


def test_the_runs_that_disagreed_now_show_the_doctors_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stock = json.loads(_run(capsys, "report", str(STOCK), "--json"))
    bundled = json.loads(_run(capsys, "report", str(BUNDLED), "--json"))
    assert [t["code"] for t in stock["traps"]] == ["reorder_threshold_far_above_decode"]
    assert [t["code"] for t in bundled["traps"]] == [
        "one_group_limits_engine",
        "spec_decode_needs_uniform_batch",
        "mode_downgraded",
        "reorder_threshold_far_above_decode",
    ]


def _load(path: Path) -> tuple[dict[str, Any], list[Step]]:
    rec = Recording.open(path)
    try:
        (snap,) = [p["snapshot"] for p in rec.processes() if p.get("snapshot")]
        return snap, list(rec.iter_steps())
    finally:
        rec.close()


def _codes(rows: list[dict[str, str]]) -> set[str]:
    return {r["code"] for r in rows}


def test_full_decode_only_without_the_chunked_prefill_fact_is_not_checked() -> None:
    snap, steps = _load(STOCK)
    assert "chunked_prefill" not in snap  # recorded before the probe kept it
    fdo = copy.deepcopy(snap)
    fdo["compilation"]["cudagraph_mode"] = "FULL_DECODE_ONLY"
    got = traps(fdo)
    code = "full_decode_only_with_chunked_prefill"
    assert code in _codes(got["not_checked"]) and code not in _codes(got["traps"])
    (why,) = [r["message"] for r in got["not_checked"] if r["code"] == code]
    assert "chunked prefill" in why
    # with the steps: none ran eager as a mixed batch, so there is nothing to warn of
    got = traps(fdo, steps)
    assert code not in _codes(got["traps"]) | _codes(got["not_checked"])
    # 92 mixed steps dispatched eager under FULL_DECODE_ONLY: the trap, with the count
    mixed = [
        replace(s, mode=Mode.NONE, reason=Reason.MIXED_BATCH_IN_FULL_DECODE_ONLY)
        for s in steps[:92]
    ]
    got = traps(fdo, mixed + steps[92:])
    (msg,) = [r["message"] for r in got["traps"] if r["code"] == code]
    assert "92 eager mixed steps" in msg
    # the stock FULL_AND_PIECEWISE run itself: the check runs and finds nothing
    assert code not in _codes(traps(snap)["traps"]) | _codes(traps(snap)["not_checked"])


def _drop(snap: dict[str, Any], need: str) -> None:
    if need.startswith("groups[]."):
        key = need.removeprefix("groups[].")
        for g in snap.get("groups", []):
            g.pop(key, None)
        return
    *path, last = need.split(".")
    cur = snap
    for part in path:
        cur = cur.get(part) or {}
    cur.pop(last, None)


@pytest.mark.parametrize("check", CHECKS, ids=[c.code for c in CHECKS])
def test_each_check_without_its_facts_says_not_checked(check: Any) -> None:
    snap, _ = _load(BUNDLED)
    for need in check.needs:
        bare = copy.deepcopy(snap)
        _drop(bare, need)
        got = traps(bare)
        (row,) = [r for r in got["not_checked"] if r["code"] == check.code]
        assert need.removeprefix("groups[].") in row["message"]


def test_a_malformed_snapshot_is_not_checked_rather_than_a_crash() -> None:
    snap, _ = _load(BUNDLED)
    bad = copy.deepcopy(snap)
    bad["groups"] = ["not a group"]
    bad["compilation"] = {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": 7}
    got = traps(bad)
    assert "malformed" in " ".join(r["message"] for r in got["not_checked"])
    assert {r["code"] for r in got["not_checked"]} <= {c.code for c in CHECKS}
