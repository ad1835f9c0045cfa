"""A varied-length workload as an engine runs it, built from the declared Step fields: what
the A/B tests compare.

64 requests of 256-token prompts are prefilled in one 16,384-token step, then decode with
MTP k = 1 (each request 2 tokens a step) until each reaches its output length (8-128
tokens, drawn once: the workload), so the batch shrinks from 64 requests to 1 over the
run; the workload runs twice with an idle pause between (two timed repetitions, as the
GPU harness runs it). A step's host time follows its batch (a fixed cost plus a cost per
request), times the arm's ``scale``, times noise: a slow drift (AR(1), 5% standard
deviation, correlation 0.95 step to step), jitter (8%) and, on 1% of steps, a stall of
2-4x. The scheduler's pass between steps (150 us plus 2 us a request) is noisy too.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from probe.records import Mode, Reason
from probe.step import PHASES, Step, new_step

REQUESTS = 64
PROMPT = 256
K = 1  # speculative tokens: a decode step schedules 1 + K tokens per request
ACCEPTED = 1.7  # output tokens a request gains per decode step


def shapes(seed: int = 0, reps: int = 2, max_out: int = 128) -> list[tuple[bool, int, int]]:
    """The workload's batches in order, ``(uniform decode, requests, tokens)``; ``None``
    is not used: an idle pause lies between repetitions (see :func:`steps`)."""
    rng = np.random.default_rng(seed)
    out_len = rng.integers(8, max_out + 1, REQUESTS)
    decode_steps = np.ceil(out_len / ACCEPTED).astype(int)
    one: list[tuple[bool, int, int]] = [(False, REQUESTS, REQUESTS * PROMPT)]
    for n in range(1, int(decode_steps.max()) + 1):
        live = int((decode_steps >= n).sum())
        one.append((True, live, live * (1 + K)))
    return one * reps


def steps(
    batches: Sequence[tuple[bool, int, int]],
    *,
    scale: float = 1.0,
    seed: int = 1,
    pid: int = 4242,
    mode: Mode = Mode.FULL,
    reason: Reason = Reason.HIT,
    t0: int = 10**12,
) -> list[Step]:
    """The steps of one recording of ``batches`` (its decode steps dispatched as
    ``mode``/``reason``, prefills eager as a batch too big): host times ``scale`` times
    the workload's, with this ``seed``'s noise."""
    rng = np.random.default_rng(seed)
    n = len(batches)
    drift = np.zeros(n)
    phi, sd = 0.95, 0.05
    for i in range(1, n):
        drift[i] = phi * drift[i - 1] + rng.normal(0, sd * np.sqrt(1 - phi**2))
    noise = np.exp(drift + rng.normal(0, 0.08, n))
    noise *= np.where(rng.random(n) < 0.01, rng.uniform(2, 4, n), 1.0)
    out: list[Step] = []
    t = t0
    for i, (uniform, reqs, tokens) in enumerate(batches):
        if i and not uniform:
            t += 2_000_000_000  # the pause between repetitions: engine idle
        base = 1_500_000 + 25_000 * reqs if uniform else 40_000_000
        host = int(base * scale * noise[i])
        launch = host // 2
        ph = dict.fromkeys(PHASES, 0) | {
            "prepare_inputs": launch // 3,
            "forward_launch": launch // 3,
            "draft": host // 5,
        }
        out.append(
            new_step(
                pid=pid, step=i + 1, t0=t, t1=t + host, host_ns=host, num_tokens=tokens,
                num_reqs=reqs, mode=mode if uniform else Mode.NONE,
                reason=reason if uniform else Reason.BATCH_TOO_BIG, padded_tokens=tokens,
                padded_reqs=reqs, max_query_len=1 + K if uniform else PROMPT,
                uniform_decode_query_len=1 + K, uniform=uniform, replayed=uniform,
                pieces=0, captures=0, cpu_launch_overhead_ns=launch, phases=ph,
                runner="mrv2",
            )
        )  # fmt: skip
        t += host + int((50_000 + 1_000 * reqs) * rng.uniform(0.8, 1.5))
    return out


def write(path: Path, recorded: Sequence[Step]) -> Path:
    """``recorded`` as a recording at ``path``."""
    from probe.reader.recording import RecordingWriter

    w = RecordingWriter(path)
    for pid in sorted({s.pid for s in recorded}):
        w.add_process(pid, None)
    w.add_steps(recorded)
    w.close()
    return path
