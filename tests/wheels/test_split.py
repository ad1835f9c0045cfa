"""vLLM's ``split_decodes_and_prefills`` on real CommonAttentionMetadata, per sparse builder.

The metadata-build hook reads the decode/prefill split off a builder's metadata, and
where the metadata carries none (0.26's ROCm sparse builder) it calls
``probe.reasons.split_from_metadata``, which is vLLM's own function. These rows pin
what that function decides for the thresholds the sparse-MLA builders use, in each
version, and check ``split_from_metadata`` returns the same.

Not covered: reading the split off a real builder's metadata. Building a
FlashMLASparse/ROCm sparse builder needs a DeepSeek-V3.2 ModelConfig (MLA dims,
``index_topk``), an attention layer in the static forward context and, for ``build``,
the FlashMLA/AITER kernels: not cheap on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import pytest

from probe.reasons import split_from_metadata

from .vllm_env import Vllm

pytestmark = pytest.mark.wheels

# num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens
Split = tuple[int, int, int, int]


@dataclass(frozen=True)
class Builder:
    """How a sparse-MLA builder calls split_decodes_and_prefills."""

    threshold: int | None  # None: 1 + k
    require_uniform: bool

    def decode_threshold(self, k: int) -> int:
        return self.threshold if self.threshold is not None else 1 + k


def builders() -> dict[str, Builder]:
    """The split arguments, read from the real classes where they are class attributes."""
    from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseMetadataBuilder
    from vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse import (
        ROCMAiterMLASparseMetadataBuilder,
    )

    return {
        # SM90 with 16 or 32 query heads per rank: {16: 128, 32: 128, 64: 256, 128: 256}.
        # _init_reorder_batch_threshold(128, supports_spec_as_decode=True) keeps 128.
        "flashmla": Builder(128, FlashMLASparseMetadataBuilder.require_uniform_decodes),
        # _init_reorder_batch_threshold(1, supports_spec_as_decode=True) -> 1 + k. 0.33
        # inherits SparseMLACommonMetadataBuilder.require_uniform_decodes (False); 0.26's
        # ROCm builder splits nothing itself, so the probe computes what 0.33 would.
        "rocm": Builder(
            None, getattr(ROCMAiterMLASparseMetadataBuilder, "require_uniform_decodes", False)
        ),
        # The indexer's decode_threshold = next_n = 1 + k; require_uniform unless it
        # flattens (next_n not native to DeepGEMM on the device) or runs varlen.
        "indexer": Builder(None, True),
        "indexer_flat": Builder(None, False),
    }


@dataclass(frozen=True)
class Batch:
    id: str
    q: tuple[int, ...]  # query lens in batch order; 0 = a padding request (FULL graph)
    num_actual_tokens: int  # padded token count when the step runs a FULL graph
    prefilling: tuple[bool, ...]
    k: int = 1
    treat_short_extends_as_decodes: bool = True  # False under prefill context parallel
    expected: dict[str, Split | frozenset[Split]] | None = None


ALL_DECODE_8: Split = (4, 0, 8, 0)
# A cell where releases differ: the expected value is what the tree's own
# split_decodes_and_prefills returns, which must be one of these.
FROM_VLLM: frozenset[Split] = frozenset({(2, 2, 4, 4), ALL_DECODE_8})

# fmt: off
BATCHES = [
    Batch("decode_padded_k1", (2, 2, 2, 0), 8, (False,) * 4,
          expected={"flashmla": ALL_DECODE_8, "rocm": ALL_DECODE_8,
                    "indexer": ALL_DECODE_8, "indexer_flat": ALL_DECODE_8}),
    Batch("decode_padded_k2", (3, 3, 0), 9, (False,) * 3, k=2,
          expected={b: (3, 0, 9, 0) for b in ("flashmla", "rocm", "indexer", "indexer_flat")}),
    Batch("mixed", (2, 2, 7), 11, (False, False, True),
          expected={b: (2, 1, 4, 7) for b in ("flashmla", "rocm", "indexer", "indexer_flat")}),
    # The last request is a 1-token prompt chunk over existing context (a short extend).
    # Uniform splitters cut at the first query length that differs from the first one.
    Batch("short_extend", (2, 2, 1), 5, (False, False, True),
          expected={"flashmla": (2, 1, 4, 1), "rocm": (3, 0, 5, 0),
                    "indexer": (2, 1, 4, 1), "indexer_flat": (3, 0, 5, 0)}),
    Batch("short_extend_pcp", (2, 2, 1), 5, (False, False, True),
          treat_short_extends_as_decodes=False,
          expected={b: (2, 1, 4, 1) for b in ("flashmla", "rocm", "indexer", "indexer_flat")}),
    # Padding rows under PCP: 0.26 counts them as prefills (q != q[0]); 0.33 does not.
    # Which one a tree does is its own split's answer (FROM_VLLM, one of the two).
    Batch("padded_pcp", (2, 2, 0, 0), 8, (False,) * 4, treat_short_extends_as_decodes=False,
          expected={"flashmla": FROM_VLLM, "rocm": ALL_DECODE_8, "indexer": FROM_VLLM,
                    "indexer_flat": ALL_DECODE_8}),
    # A draft one token short of k = 2.
    Batch("short_draft_k2", (3, 3, 2), 8, (False,) * 3, k=2,
          expected={"flashmla": (2, 1, 6, 2), "rocm": (3, 0, 8, 0),
                    "indexer": (2, 1, 6, 2), "indexer_flat": (3, 0, 8, 0)}),
    # Two 7-token prompt chunks: decodes for FlashMLA's threshold of 128, prefills at 1+k.
    Batch("uniform_extends", (7, 7), 14, (True, True),
          expected={"flashmla": (2, 0, 14, 0), "rocm": (0, 2, 0, 14),
                    "indexer": (0, 2, 0, 14), "indexer_flat": (0, 2, 0, 14)}),
    Batch("prefill_only", (200, 150), 350, (True, True),
          expected={b: (0, 2, 0, 350) for b in ("flashmla", "rocm", "indexer", "indexer_flat")}),
]
# fmt: on


def make_metadata(batch: Batch) -> Any:
    """A real CommonAttentionMetadata on CPU tensors, as the V1 runner lays it out.

    Padding requests repeat the last ``query_start_loc`` (query_len 0); the padded
    token count is ``num_actual_tokens``. Fields that exist in only one version are set
    where the dataclass has them.
    """
    import numpy as np
    import torch
    from vllm.v1.attention.backends.utils import CommonAttentionMetadata

    q = torch.tensor(batch.q, dtype=torch.int32)
    qsl = torch.zeros(len(batch.q) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q, 0)
    context = torch.tensor([0 if p else 16 for p in batch.prefilling], dtype=torch.int32)
    seq_lens = context + q
    num_reqs = len(batch.q)
    kw: dict[str, Any] = dict(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        seq_lens=seq_lens,
        num_reqs=num_reqs,
        num_actual_tokens=batch.num_actual_tokens,
        max_query_len=int(q.max()),
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=torch.zeros((num_reqs, 8), dtype=torch.int32),
        slot_mapping=torch.arange(batch.num_actual_tokens, dtype=torch.int64),
        is_prefilling=torch.tensor(batch.prefilling, dtype=torch.bool),
        seq_lens_cpu_upper_bound=seq_lens.clone(),
    )
    names = {f.name for f in fields(CommonAttentionMetadata)}
    if "_seq_lens_cpu" in names:  # 0.26
        kw["_seq_lens_cpu"] = seq_lens.clone()
        kw["_num_computed_tokens_cpu"] = context.clone()
    if "req_idx" in names:  # 0.33
        kw["req_idx"] = np.arange(num_reqs, dtype=np.int32)
    return CommonAttentionMetadata(**kw)


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: b.id)
@pytest.mark.parametrize("builder", ["flashmla", "rocm", "indexer", "indexer_flat"])
def test_split_table(batch: Batch, builder: str, vl: Vllm) -> None:
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    b = builders()[builder]
    cm = make_metadata(batch)
    thr = b.decode_threshold(batch.k)
    treat = batch.treat_short_extends_as_decodes

    real = split_decodes_and_prefills(
        cm,
        decode_threshold=thr,
        require_uniform=b.require_uniform,
        treat_short_extends_as_decodes=treat,
    )

    assert batch.expected is not None
    expected = batch.expected[builder]
    if isinstance(expected, frozenset):
        assert tuple(int(x) for x in real) in expected
        expected = tuple(int(x) for x in real)
    assert tuple(int(x) for x in real) == expected
    assert split_from_metadata(cm, thr, b.require_uniform, treat) == expected


def test_builder_split_arguments(vl: Vllm) -> None:
    """The class attributes the table relies on, per version."""
    got = builders()
    assert got["flashmla"].require_uniform is True
    assert got["rocm"].require_uniform is False


def test_metadata_reads_alike(vl: Vllm) -> None:
    """The metadata the tables build reads the same in every tree."""
    cm = make_metadata(BATCHES[0])
    assert int(cm.query_start_loc_cpu[-1]) == 6  # real tokens
    assert cm.num_actual_tokens == 8  # padded tokens
    assert int((cm.query_start_loc_cpu.diff() > 0).sum()) == 3  # real requests
