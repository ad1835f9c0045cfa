"""The probe's cost per engine step and its perturbation, from a crossover stepwise run.

    python benchmarks/gpu/crossover.py RESULTS.json [--recording R.probe.db] [--json OUT]

The harness's ``"design": "crossover"`` switches the probe on and off in blocks counted
from the start of each workload (``llm.generate``), with the order flipped from one
workload to the next: the on block ``b`` of workload ``2j`` faces the off block ``b`` of
workload ``2j+1`` and the other way round. Both sit at the same place in a workload (the
same context lengths and KV-block boundaries), so what depends on that place cancels, and
the flip cancels drift between the two workloads. Per variant it prints, each as the
median of the per-block-pair differences with a bootstrap 95% interval:

- **step**: engine step wall time, on minus off (what the probe adds to a step);
- **launch**: one plain timer pair from step start to the end of the target's forward
  launch (``"bare_timer": true``), on minus off (what the probe adds inside the CPU launch
  overhead window);
- **perturbation**: the probe's own recorded CPU launch overhead in the on blocks minus the
  plain timer's in the facing off blocks (what the probe's headline number is off by),
  with ``--recording``;
- **throughput**: the on block's tokens per second over the facing off block's (the
  median of the per-pair ratios, :func:`pair_throughput`), and ``throughput_steady``
  without each block's first step. With ``"off": "absent"`` the off blocks run detached
  (no wrapper in place) and each on block attaches afresh, as ``probe attach`` does;
- **greedy tokens**: each workload's tokens (the harness's ``token_digests``) compared
  across every variant run of a scenario, hooks on, off, absent or never installed; the
  workloads whose tokens differ are named.

``--diff A B`` (repeatable) also prints variant A's ``step_steady`` minus variant B's, with
a bootstrap interval (each side's block pairs resampled apart): what two designs of one
run differ by, e.g. ``--diff "all off=absent" "all"``, attached against absent beyond
enabled against dormant, or two probe trees (``RESULTS@TAG`` names a file's variants
``TAG: variant``: ``--diff "new: all" "old: all"``). ``--halves`` also prints each
block's first half (``step_early``, steps 1 to block/2 - 1) and second half
(``step_late``) apart: a cost that fades after each switch (a warm-up) reads higher
early, and a long attachment pays about ``step_late``.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

FIRST_BLOCK = 1  # block 0 of a workload holds its prefill steps


def block_pairs(
    rows: Iterable[Sequence[int]], block: int, full_only: bool = True
) -> Iterator[tuple[list[int], list[int]]]:
    """``rows``: (workload, block, on, value). For each block ``b`` >= 1 of each workload
    pair (2j, 2j+1), the values of its on block and of its off block, in step order."""
    for _b, on, off in block_pairs_at(rows, block, full_only):
        yield on, off


def block_pairs_at(
    rows: Iterable[Sequence[int]], block: int, full_only: bool = True
) -> Iterator[tuple[int, list[int], list[int]]]:
    """:func:`block_pairs` with each pair's block index ``b`` (even: the on block is in
    workload 2j; odd: in 2j+1)."""
    by: dict[tuple[int, int], list[int]] = {}
    on_of: dict[tuple[int, int], int] = {}
    for g, b, on, v in rows:
        by.setdefault((g, b), []).append(v)
        on_of[(g, b)] = on
    for (g, b), v in sorted(by.items()):
        if g % 2 or b < FIRST_BLOCK:
            continue
        w = by.get((g + 1, b))
        if w is None or (full_only and (len(v) != block or len(w) != block)):
            continue
        yield (b, v, w) if on_of[(g, b)] else (b, w, v)


def pair_costs(
    rows: Iterable[Sequence[int]],
    block: int,
    full_only: bool = True,
    skip_first: bool = False,
    steps: slice | None = None,
) -> list[float]:
    """Per block pair (:func:`block_pairs`): median(value of the on block) - median(value
    of the off block). ``skip_first``: without each block's first step (whole blocks only;
    where an attach's one-off work lands, as in :func:`pair_throughput`). ``steps``: those
    places of each block only (whole blocks only)."""
    if steps is None:
        steps = slice(1 if skip_first else 0, None)
    whole = full_only or skip_first or steps != slice(0, None)
    return [
        statistics.median(on[steps]) - statistics.median(off[steps])
        for on, off in block_pairs(rows, block, whole)
    ]


def half_costs(rows: Iterable[Sequence[int]], block: int) -> tuple[list[float], list[float]]:
    """:func:`pair_costs` on each half of the blocks (whole blocks only): steps 1 to
    block/2 - 1 (the first step, an attach's one-off work, left out) and block/2 to the
    end. A cost that fades inside a block (a warm-up after a switch: caches, the
    interpreter re-specializing on classes an attach or a detach wrote) reads higher in
    the first half; what a long attachment pays per step is the second."""
    h = block // 2
    return (
        pair_costs(rows, block, steps=slice(1, h)),
        pair_costs(rows, block, steps=slice(h, None)),
    )


def position_diffs(rows: Iterable[Sequence[int]], block: int) -> list[list[int]]:
    """On minus off by a step's place in its block (whole blocks only): element ``i``
    holds, per block pair, step ``i`` of the on block - step ``i`` of the off block."""
    at: list[list[int]] = [[] for _ in range(block)]
    for on, off in block_pairs(rows, block):
        for i, (a, b) in enumerate(zip(on, off, strict=True)):
            at[i].append(a - b)
    return at


def position_costs(diffs: Sequence[Sequence[int]]) -> list[float]:
    """The median of each place's differences (:func:`position_diffs`), in µs: whether a
    cost sits in the first steps after a switch (an attach's one-off work, caches
    refilled) or in every step."""
    return [round(statistics.median(xs) / 1e3, 1) if xs else float("nan") for xs in diffs]


def pair_throughput(
    rows: Iterable[Sequence[int]], block: int, skip_first: bool = False
) -> list[float]:
    """Throughput of the on block over that of its facing off block, per block pair
    (:func:`block_pairs`, whole blocks only): total wall of the off block / total wall of
    the on block. The two blocks do the same work (the same steps of identically shaped
    greedy workloads), so this is tokens per second on / off. ``skip_first``: leave out
    each block's first step (where an attach's one-off work lands: late targets, the
    static snapshot)."""
    k = 1 if skip_first else 0
    return [sum(off[k:]) / sum(on[k:]) for on, off in block_pairs(rows, block)]


def parity_costs(rows: Iterable[Sequence[int]], block: int) -> tuple[list[float], list[float]]:
    """:func:`pair_costs` split by where the on block ran: (pairs whose on block is in
    workload 2j, pairs whose on block is in workload 2j+1). A difference between the two
    workloads of a pair (V1's step moves by hundreds of µs between workloads) enters the
    two with opposite signs."""
    even: list[float] = []
    odd: list[float] = []
    for b, on, off in block_pairs_at(rows, block):
        (odd if b % 2 else even).append(statistics.median(on) - statistics.median(off))
    return even, odd


def balanced(
    even: list[float], odd: list[float], n: int = 2000, seed: int = 0
) -> tuple[float, float, float] | None:
    """The mean of the two parities' medians (:func:`parity_costs`), where the workloads'
    own difference cancels, as a crossover estimate should; with a bootstrap 95% interval
    (each parity resampled apart). :func:`pair_costs`'s one median over all pairs leans to
    the parity with more pairs (blocks 1-11 of a workload: six odd, five even)."""
    return _two_medians(even, odd, lambda x, y: (x + y) / 2, n, seed)


def _two_medians(
    a: list[float], b: list[float], f: Callable[[float, float], float], n: int, seed: int
) -> tuple[float, float, float] | None:
    """``f(median(a), median(b))`` with a bootstrap 95% interval, each side resampled
    apart; None below three values on either side."""
    if len(a) < 3 or len(b) < 3:
        return None
    rng = random.Random(seed)
    est = f(statistics.median(a), statistics.median(b))
    boots = sorted(
        f(
            statistics.median(rng.choices(a, k=len(a))),
            statistics.median(rng.choices(b, k=len(b))),
        )
        for _ in range(n)
    )
    return est, boots[int(0.025 * n)], boots[int(0.975 * n) - 1]


def _balanced_row(even: list[float], odd: list[float]) -> dict[str, Any]:
    b = balanced(even, odd)
    return {
        "pairs": [len(even), len(odd)],
        "median_us": b[0] / 1e3 if b else None,
        "ci95_us": [b[1] / 1e3, b[2] / 1e3] if b else None,
    }


def median_difference(
    a: list[float], b: list[float], n: int = 2000, seed: int = 0
) -> tuple[float, float, float] | None:
    """median(a) - median(b) with a bootstrap 95% interval, each side resampled apart: two
    variants of one run (or pool) against each other, e.g. the cost of attached against
    absent minus that of enabled against dormant, so that what the two share cancels."""
    return _two_medians(a, b, lambda x, y: x - y, n, seed)


def differences(
    rows: list[dict[str, Any]], pairs: Sequence[tuple[str, str]], part: str = "step_steady"
) -> list[dict[str, Any]]:
    """For each (A, B) of variant names: per scenario holding both, A's ``part`` minus
    B's (:func:`median_difference` over their block pairs), in µs.

    A name as printed (``all``) takes that variant's rows; where they ran with more than
    one GPU timing, the name must say which (``all gpu_timing=False``), else ValueError:
    pooling two timings under one name would hide the very difference asked for."""
    by: dict[tuple[str, str], dict[str, list[float]]] = {}  # (scenario, variant) -> timing
    for r in rows:
        got = by.setdefault((r["scenario"], r["variant"]), {})
        got.setdefault(str(r["gpu_timing"]), []).extend(r["_parts"].get(part, []))

    def pick(scen: str, name: str) -> list[float]:
        head, sep, timing = name.rpartition(" gpu_timing=")
        if sep and (scen, head) in by:
            return by[(scen, head)].get(timing, [])
        timings = by.get((scen, name), {})
        if len(timings) > 1:
            raise ValueError(
                f"variant {name!r} ran with gpu_timing {' and '.join(sorted(timings))}: "
                f"name one, e.g. '{name} gpu_timing={sorted(timings)[0]}'"
            )
        return next(iter(timings.values()), [])

    out = []
    for va, vb in pairs:
        for scen in dict.fromkeys(r["scenario"] for r in rows):
            xa, xb = pick(scen, va), pick(scen, vb)
            d = median_difference(xa, xb)
            if d is None:
                continue
            out.append({
                "scenario": scen, "a": va, "b": vb, "part": part,
                "pairs": [len(xa), len(xb)],
                "median_us": d[0] / 1e3, "ci95_us": [d[1] / 1e3, d[2] / 1e3],
            })  # fmt: skip
    return out


def ci95(xs: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """Bootstrap interval of the median (resampling block pairs)."""
    if len(xs) < 3:
        return None
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def recorded_launch(db: Path, window: Sequence[int]) -> list[tuple[int, int]]:
    """(t0, cpu_launch_overhead_ns) of the recording's target steps inside ``window``."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [
            (int(t0), int(lo))
            for t0, lo in con.execute(
                "SELECT t0_ns, cpu_launch_overhead_ns FROM steps WHERE t0_ns BETWEEN ? AND ? "
                "AND cpu_launch_overhead_ns IS NOT NULL ORDER BY t0_ns",
                (window[0], window[1]),
            )
        ]
    finally:
        con.close()


def perturbation_rows(
    bare: list[Sequence[int]], rec: list[tuple[int, int]], slack_ns: int = 2_000_000
) -> list[tuple[int, int, int, int]]:
    """(workload, block, on, value): the probe's recorded launch overhead for on steps
    (matched to the bare timer's row by start time), the bare timer's for off steps."""
    import bisect

    t0s = [t for t, _ in rec]
    out: list[tuple[int, int, int, int]] = []
    for _n, ns, t0, g, b, on in bare:
        if not on:
            out.append((g, b, 0, ns))
            continue
        i = bisect.bisect_left(t0s, t0)  # the probe's step starts just after the timer's
        if i < len(t0s) and t0s[i] - t0 < slack_ns:
            out.append((g, b, 1, rec[i][1]))
    return out


def summarize(res: dict[str, Any], recording: Path | None = None) -> list[dict[str, Any]]:
    out = []
    for e in res.get("experiments", []):
        for r in (e.get("result") or {}).get("runs", []):
            if r.get("design") != "crossover":
                continue
            block = int(r["block"])
            row: dict[str, Any] = {
                "scenario": e.get("scenario"),
                "families": r["families"],
                "hot_path": r.get("hot_path"),
                "gpu_timing": r.get("gpu_timing"),
                "steps": r["steps"],
                "step_median_us": (r["median_off_ns"] or 0) / 1e3,
            }
            if r.get("python_calls") is not None:  # "count_python_calls" (pycalls.py)
                row["python_calls"] = r["python_calls"]
            if r.get("token_digests"):
                w = r.get("workload") or {}
                row["_tokens"] = ((w.get("requests"), w.get("out_len")), r["token_digests"])
            early, late = half_costs(r["step_rows"], block)
            parts = {
                "step": pair_costs(r["step_rows"], block),
                "step_steady": pair_costs(r["step_rows"], block, skip_first=True),
                "step_early": early,
                "step_late": late,
            }
            row["_positions"] = position_diffs(r["step_rows"], block)
            row["_parity"] = parity_costs(r["step_rows"], block)
            row["_ratios"] = {
                "throughput": pair_throughput(r["step_rows"], block),
                "throughput_steady": pair_throughput(r["step_rows"], block, skip_first=True),
            }
            sw = r.get("switches") or []
            row["switch_us"] = {
                "attach": _med([ns for on, _i, ns in sw if on]),
                "detach": _med([ns for on, _i, ns in sw if not on]),
            }
            bare = r.get("bare_rows")
            if bare:
                parts["launch"] = pair_costs(
                    [(g, b, on, ns) for _n, ns, _t, g, b, on in bare], block, False
                )
                off = [ns for _n, ns, _t, _g, _b, on in bare if not on]
                row["launch_off_median_us"] = statistics.median(off) / 1e3 if off else None
                if recording is not None:
                    rec = recorded_launch(recording, r["window_boottime"])
                    parts["perturbation"] = pair_costs(perturbation_rows(bare, rec), block, False)
            reshape = r.get("reshape") or {}
            row["variant"] = (
                "null" if r["families"] == ["none"] else "wrap_only"
                if reshape.get("wrap_only") else "all" if not reshape.get("exclude")
                else "all but " + ",".join(reshape["exclude"])
            ) + (" on=dormant" if r.get("on") == "dormant" else "") + (
                " paused" if r.get("pause_reader") else "") + (
                " touch" if r.get("touch") else "") + (
                " counted" if r.get("python_calls") is not None else "") + (
                f" off={r['off']}" if r.get("off") in ("absent", "reattach") else "") + (
                f" block={block}" if block != 16 else "") + (
                f" clock={r['clock']}" if r.get("clock") in ("tsc",) else "")  # fmt: skip
            _fill(row, parts)
            _fill_ratios(row, row["_ratios"])
            row["by_position_us"] = position_costs(row["_positions"])
            row["step_balanced"] = _balanced_row(*row["_parity"])
            row["_parts"] = parts
            out.append(row)
    return out


def _fill(row: dict[str, Any], parts: dict[str, list[int]]) -> None:
    for k, xs in parts.items():
        c = ci95(xs)
        row[k] = {
            "pairs": len(xs),
            "median_us": statistics.median(xs) / 1e3 if xs else None,
            "ci95_us": [c[0] / 1e3, c[1] / 1e3] if c else None,
        }
    if "perturbation" in row and row.get("launch_off_median_us"):
        m = row["perturbation"]["median_us"]
        row["perturbation"]["share"] = m / row["launch_off_median_us"] if m else None


def _med(xs: list[int]) -> float | None:
    return statistics.median(xs) / 1e3 if xs else None


def _fill_ratios(row: dict[str, Any], ratios: dict[str, list[float]]) -> None:
    for k, xs in ratios.items():
        c = ci95(xs)
        row[k] = {
            "pairs": len(xs),
            "median_ratio": statistics.median(xs) if xs else None,
            "ci95": list(c) if c else None,
        }


_PARTS = ("step", "step_steady", "launch", "perturbation", "step_early", "step_late")
_HALVES = ("step_early", "step_late")  # printed with --halves


def pooled(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (scenario, variant, hot path, GPU timing): the block pairs of every run
    of it pooled (their medians and intervals recomputed over all pairs)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        key = (r["scenario"], r["variant"], r["hot_path"], r["gpu_timing"])
        groups.setdefault(key, []).append(r)
    out = []
    for (scen, variant, hot, gpu), rs in groups.items():
        parts: dict[str, list[int]] = {}
        ratios: dict[str, list[float]] = {}
        for r in rs:
            for k, xs in r["_parts"].items():
                parts.setdefault(k, []).extend(xs)
            for k, ys in r.get("_ratios", {}).items():
                ratios.setdefault(k, []).extend(ys)
        offs = [r["launch_off_median_us"] for r in rs if r.get("launch_off_median_us")]
        row: dict[str, Any] = {
            "scenario": scen, "variant": variant, "families": rs[0]["families"],
            "hot_path": hot, "gpu_timing": gpu, "runs": len(rs),
            "steps": sum(r["steps"] for r in rs),
            "step_median_us": statistics.median(r["step_median_us"] for r in rs),
            "launch_off_median_us": statistics.median(offs) if offs else None,
        }  # fmt: skip
        counted = [r["python_calls"] for r in rs if r.get("python_calls")]
        if counted:
            calls: dict[str, int] = {}
            for c in counted:
                for k, n in c["calls"].items():
                    calls[k] = calls.get(k, 0) + n
            on_steps = sum(c["on_steps"] for c in counted)
            row["python_calls"] = {"calls": calls, "on_steps": on_steps}
        _fill(row, {k: xs for k, xs in parts.items() if k in _PARTS})
        _fill_ratios(row, ratios)
        row["_ratios"] = ratios
        row["_parts"] = parts
        if all("_parity" in r for r in rs):
            row["step_balanced"] = _balanced_row(
                [x for r in rs for x in r["_parity"][0]], [x for r in rs for x in r["_parity"][1]]
            )
        places = [r["_positions"] for r in rs if r.get("_positions")]
        if places and len(places) == len(rs) and len({len(p) for p in places}) == 1:
            # one block length: the places line up across runs
            at = [[x for p in places for x in p[i]] for i in range(len(places[0]))]
            row["by_position_us"] = position_costs(at)
        out.append(row)
    return out


def token_identity(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Greedy tokens, workload by workload, across every run row that recorded them (the
    harness's ``token_digests``): per scenario and workload shape, how many rows and
    workloads were compared and which workloads gave more than one set of tokens. The
    same prompts must give the same tokens whether the hooks were on, off, absent or
    never installed; a row that read nothing (None) is left out."""
    groups: dict[tuple[Any, ...], list[tuple[str, list[str | None]]]] = {}
    for r in rows:
        if "_tokens" in r:
            shape, digests = r["_tokens"]
            groups.setdefault((r["scenario"], *shape), []).append((r["variant"], digests))
    out = []
    for (scen, requests, out_len), got in groups.items():
        width = max(len(d) for _v, d in got)
        differ = []
        for g in range(width):
            seen = {d[g] for _v, d in got if g < len(d) and d[g] is not None}
            if len(seen) > 1:
                differ.append(g)
        out.append({
            "scenario": scen, "requests": requests, "out_len": out_len, "rows": len(got),
            "workloads": width, "differ": differ,
        })  # fmt: skip
    return out


def tagged(arg: str) -> tuple[str, str]:
    """``RESULTS[=RECORDING][@TAG]`` -> (the rest, TAG or ""): runs of two probe trees
    (a before/after in one session) pooled apart under their tags and compared with
    ``--diff``. A ``@`` inside a path (one followed by a ``/``) is not a tag."""
    head, at, tag = arg.rpartition("@")
    if not at or not tag or "/" in tag or not head:
        return arg, ""
    return head, tag


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "results",
        nargs="+",
        help="RESULTS.json[.gz], or RESULTS=RECORDING.probe.db to pair each; a trailing\n"
        "@TAG names its variants 'TAG: variant' (runs of two probe trees in one pool, for\n"
        "--diff 'new: all' 'old: all')",
    )
    ap.add_argument("--recording", type=Path, help="the recording of a single RESULTS")
    ap.add_argument("--pool", action="store_true", help="pool the runs of each variant")
    ap.add_argument("--json", type=Path, help="write the summary here")
    ap.add_argument(
        "--diff",
        nargs=2,
        action="append",
        metavar=("A", "B"),
        default=[],
        help="also print variant A's step_steady minus variant B's, with a bootstrap\n"
        "interval (variant names as printed, e.g. 'all off=absent' 'all'); repeatable",
    )
    ap.add_argument(
        "--halves",
        action="store_true",
        help="also print each block's two halves apart (step_early: steps 1 to block/2-1,\n"
        "step_late: the rest): a cost that fades after each switch reads higher early",
    )
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for arg in a.results:
        arg, tag = tagged(arg)
        path, _, rec = arg.partition("=")
        raw = Path(path).read_bytes()
        if path.endswith(".gz"):
            import gzip

            raw = gzip.decompress(raw)
        recording = Path(rec) if rec else a.recording
        got = summarize(json.loads(raw), recording)
        for r in got:
            if tag:
                r["variant"] = f"{tag}: {r['variant']}"
        rows.extend(got)
    tokens = token_identity(rows)
    if a.pool:
        rows = pooled(rows)
    try:
        diffs = [
            d
            for part in ("step_steady", *(("step_late",) if a.halves else ()))
            for d in differences(rows, [tuple(x) for x in a.diff], part)
        ]
    except ValueError as e:
        ap.error(str(e))
    for r in rows:
        parts = []
        for k in (*_PARTS, "step_balanced"):
            if k in _HALVES and not a.halves:
                continue
            if k in r and r[k]["median_us"] is not None:
                lo_hi = r[k]["ci95_us"] or [float("nan")] * 2
                parts.append(f"{k} {r[k]['median_us']:+.1f} [{lo_hi[0]:+.1f}, {lo_hi[1]:+.1f}] us")
        for k in ("throughput", "throughput_steady"):
            t = r.get(k) or {}
            if t.get("median_ratio") is not None:
                lo_hi = t["ci95"] or [float("nan")] * 2
                parts.append(f"{k} {t['median_ratio']:.4f} [{lo_hi[0]:.4f}, {lo_hi[1]:.4f}]")
        pyc = r.get("python_calls")
        if pyc is not None:
            per = max(1, pyc["on_steps"])
            each = ", ".join(f"{k} {n / per:.2f}" for k, n in sorted(pyc["calls"].items()))
            parts.append(f"python calls per on step: {each or 'none'}")
        runs = f" runs={r['runs']}" if "runs" in r else ""
        print(
            f"{r['scenario']} {r.get('variant', r['families'])!s:12s} {r['hot_path']} "
            f"gpu_timing={r['gpu_timing']}{runs} steps={r['steps']} "
            f"step={r['step_median_us']:.0f}us: " + "; ".join(parts)
        )
    for t in tokens:
        said = (
            "the same in every one"
            if not t["differ"]
            else "DIFFER in workload(s) " + ", ".join(str(g) for g in t["differ"])
        )
        print(
            f"{t['scenario']} greedy tokens over {t['rows']} variant runs x {t['workloads']} "
            f"workloads: {said}"
        )
    for d in diffs:
        lo, hi = d["ci95_us"]
        print(
            f"{d['scenario']} [{d['a']}] - [{d['b']}]: {d['part']} {d['median_us']:+.1f} "
            f"[{lo:+.1f}, {hi:+.1f}] us (pairs {d['pairs'][0]}, {d['pairs'][1]})"
        )
    if a.json:
        for r in rows:
            r.pop("_parts", None)
            r.pop("_ratios", None)
            r.pop("_positions", None)
            r.pop("_parity", None)
            r.pop("_tokens", None)
        out: Any = {"variants": rows, "differences": diffs} if diffs else rows
        if tokens:
            out = {"variants": rows, "differences": diffs, "tokens": tokens}
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
