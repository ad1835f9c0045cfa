"""The doctor's traps (probe.analysis.traps) on snapshots taken from the real vLLM classes.

Each snapshot is made by ``take_snapshot`` from a runner-shaped holder of the real
VllmConfig (graph settings resolved by vLLM's own resolver where it matters) and the
real backend and builder classes; each trap must fire on the configuration that has
it and stay quiet on the one that does not.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from probe.analysis.capture_sizes import SPLIT_SIZE_FIELDS
from probe.analysis.traps import findings
from probe.engine.hooks.snapshot import take_snapshot

from .vllm_env import CAPTURE_SIZES, ENGINES, Vllm, resolve

pytestmark = [pytest.mark.wheels, pytest.mark.usefixtures("clean_probe")]

H200_RECORDING = Path(__file__).resolve().parents[2] / "tests/data/stock_mrv2_k1.probe"


def _codes(snap: dict[str, Any]) -> set[str]:
    return {f["code"] for f in findings(snap)}


def _runner(vc: Any, uq: int, groups: list[Any] | None = None) -> Any:
    return SimpleNamespace(vllm_config=vc, uniform_decode_query_len=uq, attn_groups=groups or [])


def _group(backend: Any) -> Any:
    """An attention group as the runner holds it: a backend and its builder instance."""
    builder = object.__new__(backend.get_builder_cls())  # __init__ needs a model
    return SimpleNamespace(
        backend=backend, kv_cache_spec=None, layer_names=["l0"], metadata_builders=[builder]
    )


def test_decode_graphs_by_request_count(vl: Vllm) -> None:
    """vLLM 0.34 on: decode graphs by request count, derived by vLLM from the capture
    sizes [1, 2, 4, 8, 16, 32] at uq 3 (request sizes 1, 2, 3, 6, within 32 tokens);
    none pads a decode batch, and they reach max_num_seqs 6. With 16 sequences they stop
    at 6 requests, and the trap names the list that stops them."""
    if not vl.has_split_sizes:
        pytest.skip(f"vLLM {vl.version} sizes decode graphs by token capture sizes")
    from .vllm_env import make_vllm_config

    res = resolve(vl, ENGINES["fap_ub_k2"], v2=True)
    snap = take_snapshot(_runner(res.vllm_config, 3))
    assert snap["compilation"]["decode_cudagraph_capture_request_sizes"] == [1, 2, 3, 6]
    assert not {"capture_sizes_not_multiple_of_decode_len",
                "decode_batches_above_largest_capture_size"} & _codes(snap)  # fmt: skip

    def split(max_num_seqs: int, decode: list[int] | None, tokens: int | None = None) -> Any:
        """The engine's sizes resolved afresh by vLLM for this max_num_seqs, with the
        decode request sizes and decode token budget given (``legacy_sizes`` only
        without them)."""
        vc = make_vllm_config(vl, ENGINES["fap_ub_k2"])
        cc = vc.compilation_config
        for name in SPLIT_SIZE_FIELDS:
            setattr(cc, name, None)
        cc.cudagraph_capture_sizes = list(CAPTURE_SIZES)
        cc.max_cudagraph_capture_size = CAPTURE_SIZES[-1]
        cc.decode_cudagraph_capture_request_sizes = decode
        cc.max_decode_cudagraph_capture_tokens = tokens
        vc.scheduler_config.max_num_seqs = max_num_seqs
        vc._split_cudagraph_capture_sizes(decode is None, vc.get_decode_cudagraph_query_lens(3))
        return take_snapshot(_runner(vc, 3))

    # derived from the capture sizes: request counts within 32 tokens, up to 6 of 16
    big = split(16, None)
    (f,) = [f for f in findings(big) if f["code"] == "decode_batches_above_largest_capture_size"]
    assert "stop at 6 requests" in f["message"]
    assert "decode_cudagraph_capture_request_sizes ends at 6" in f["message"]
    # request sizes of their own: graphs up to max_num_seqs, whatever the token sizes
    assert big["compilation"]["max_cudagraph_capture_size"] == 32
    assert "decode_batches_above_largest_capture_size" not in _codes(split(16, [1, 2, 4, 8, 16]))
    # a decode token budget of 30: 10 requests of 3 tokens, the first size past it
    # captured at 10
    capped = split(16, [1, 2, 4, 8, 16], tokens=30)
    (f,) = [f for f in findings(capped) if f["code"] == "decode_batches_above_largest_capture_size"]
    assert "stop at 10 requests" in f["message"]
    assert "max_decode_cudagraph_capture_tokens=30" in f["message"]
    # breakable graphs: the compilation config's own setting, not the environment
    res.vllm_config.compilation_config.use_breakable_cudagraph = True
    assert take_snapshot(_runner(res.vllm_config, 3))["compilation"]["breakable_cudagraph"] is True


@pytest.mark.usefixtures("needs_v1")
def test_capture_sizes_that_pad_or_miss_mtp_decodes(vl: Vllm) -> None:
    # MRV2 keeps the sizes as given ([1, 2, 4, 8, 16, 32]); uq 3: 4, 8, 16, 32 pad.
    res = resolve(vl, ENGINES["fap_ub_k2"], v2=True)
    snap = take_snapshot(_runner(res.vllm_config, 3))
    assert "capture_sizes_not_multiple_of_decode_len" in _codes(snap)
    # V1's resolver rounds them to multiples of uq itself ([3, 6, 9, 18]): nothing pads.
    res_v1 = resolve(vl, ENGINES["fap_ub_k2"], v2=False)
    snap_v1 = take_snapshot(_runner(res_v1.vllm_config, 3))
    assert "capture_sizes_not_multiple_of_decode_len" not in _codes(snap_v1)
    # max_num_seqs 6 x 3 = 18 tokens fits the largest size 18; 16 requests do not.
    assert "decode_batches_above_largest_capture_size" not in _codes(snap_v1)
    res_v1.vllm_config.scheduler_config.max_num_seqs = 16
    big = take_snapshot(_runner(res_v1.vllm_config, 3))
    (f,) = [f for f in findings(big) if f["code"] == "decode_batches_above_largest_capture_size"]
    assert "above 6 requests" in f["message"]


def test_support_attribute_ignored_by_the_indexer(
    vl: Vllm, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.v1.attention.backends.mla.indexer import (
        DeepseekV32IndexerBackend,
        DeepseekV32IndexerMetadataBuilder,
    )

    vc = vl.VllmConfig()
    assert "support_attribute_ignored" not in _codes(
        take_snapshot(_runner(vc, 2, [_group(DeepseekV32IndexerBackend)]))
    )
    # The patch a user would write to model the old ROCm behaviour on the indexer.
    ustd = vl.AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    monkeypatch.setattr(DeepseekV32IndexerMetadataBuilder, "_cudagraph_support", ustd)
    snap = take_snapshot(_runner(vc, 2, [_group(DeepseekV32IndexerBackend)]))
    (g,) = snap["groups"]
    assert g["support_follows_attribute"] is False
    assert g["support"] != ustd.name  # the method decided, as vLLM will see it
    assert "support_attribute_ignored" in _codes(snap)


def test_support_set_on_backend_not_builder(vl: Vllm, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseBackend

    vc = vl.VllmConfig()
    clean = take_snapshot(_runner(vc, 2, [_group(FlashMLASparseBackend)]))
    assert clean["groups"][0]["support_follows_attribute"] is True
    assert not ({"support_attribute_ignored", "support_set_on_backend_not_builder"} & _codes(clean))
    ustd = vl.AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    monkeypatch.setattr(FlashMLASparseBackend, "_cudagraph_support", ustd, raising=False)
    snap = take_snapshot(_runner(vc, 2, [_group(FlashMLASparseBackend)]))
    assert snap["groups"][0]["support"] == "UNIFORM_BATCH"  # what vLLM reads: unchanged
    assert "support_set_on_backend_not_builder" in _codes(snap)


def test_reorder_threshold_far_above_decode_on_h200_snapshot() -> None:
    """FlashMLA sparse on the H200 (16 heads): threshold 256 against uq 2, as recorded."""
    from probe.reader.recording import Recording

    rec = Recording.open(H200_RECORDING)
    [snap] = [p["snapshot"] for p in rec.processes()]
    rec.close()
    msgs = [
        f["message"] for f in findings(snap) if f["code"] == "reorder_threshold_far_above_decode"
    ]
    assert msgs and "256" in msgs[0] and "FlashMLASparseMetadataBuilder" in msgs[0]
    snap["groups"] = [dict(g, reorder_batch_threshold=2) for g in snap["groups"]]
    assert "reorder_threshold_far_above_decode" not in _codes(snap)


def test_full_decode_only_with_chunked_prefill(vl: Vllm) -> None:
    res = resolve(vl, ENGINES["fdo_ub_k1"], v2=True)
    assert res.mode.name == "FULL_DECODE_ONLY"
    sc = res.vllm_config.scheduler_config
    sc.enable_chunked_prefill = True
    assert "full_decode_only_with_chunked_prefill" in _codes(
        take_snapshot(_runner(res.vllm_config, 2))
    )
    sc.enable_chunked_prefill = False
    assert "full_decode_only_with_chunked_prefill" not in _codes(
        take_snapshot(_runner(res.vllm_config, 2))
    )
    fap = resolve(vl, ENGINES["fap_ub_k1"], v2=True).vllm_config
    fap.scheduler_config.enable_chunked_prefill = True
    assert "full_decode_only_with_chunked_prefill" not in _codes(take_snapshot(_runner(fap, 2)))


def test_doctor_readable_at_80_columns(vl: Vllm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every support level appears whole, and no line is wider than the terminal."""
    from rich.console import Console
    from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerBackend
    from vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse import (
        ROCMAiterMLASparseBackend,
        ROCMAiterMLASparseMetadataBuilder,
    )

    from probe.cli.render_report import doctor, render_doctor

    ustd = vl.AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    monkeypatch.setattr(ROCMAiterMLASparseMetadataBuilder, "_cudagraph_support", ustd)
    res = resolve(vl, ENGINES["fap_ustd_k1"], v2=True)
    groups = [_group(ROCMAiterMLASparseBackend), _group(DeepseekV32IndexerBackend)]
    snap = doctor(take_snapshot(_runner(res.vllm_config, 2, groups)))
    console = Console(width=80, record=True, color_system=None)
    render_doctor(snap, console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    for g in snap["groups"]:
        assert f"support {g['support']}" in text
    assert "UNIFORM_SINGLE_TOKEN_DECODE" in text


def _threshold_builder(vl: Vllm, backend: Any, k: int, spec_as_decode: bool) -> Any:
    """The real builder class, its threshold set by its own ``_init_reorder_batch_threshold``
    (through the probe's always-on hook, which keeps what it was asked): the seed's
    ``(1, supports_spec_as_decode=False)`` or the fixed ``(1, True)``. The builder's
    ``__init__`` needs a model; the speculative config here carries only the fields the
    method reads in 0.26 to 0.34 (vLLM 0.34 adds the drafter's extra slots, none for MTP;
    a real SpeculativeConfig needs the target model too)."""
    from probe.engine import hooks

    hooks.install(["static"], lazy=False)
    vc = vl.VllmConfig()
    vc.speculative_config = SimpleNamespace(
        num_speculative_tokens=k, parallel_drafting=False, max_num_new_slots_for_drafting=0
    )
    builder = object.__new__(backend.get_builder_cls())
    builder.vllm_config = vc
    builder._init_reorder_batch_threshold(1, supports_spec_as_decode=spec_as_decode)
    return builder


@pytest.mark.parametrize("k", [1, 2])
def test_mtp_decodes_split_as_prefills_in_the_seeds_before_state(vl: Vllm, k: int) -> None:
    from vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse import ROCMAiterMLASparseBackend

    from probe.analysis.traps import traps

    uq = 1 + k
    before = _threshold_builder(vl, ROCMAiterMLASparseBackend, k, spec_as_decode=False)
    assert before.reorder_batch_threshold == 1  # vLLM's own method left it at 1
    group = SimpleNamespace(
        backend=ROCMAiterMLASparseBackend,
        kv_cache_spec=None,
        layer_names=["l0"],
        metadata_builders=[before],
    )
    snap = take_snapshot(_runner(before.vllm_config, uq, [group]))
    (g,) = snap["groups"]
    assert (g["reorder_batch_threshold"], g["spec_as_decode"]) == (1, False)
    got = traps(snap)
    (f,) = [t for t in got["traps"] if t["code"] == "mtp_decodes_split_as_prefills"]
    assert f"reorder threshold 1, below the decode query length {uq}" in f["message"]
    assert "supports_spec_as_decode false" in f["message"]
    assert "mtp_decodes_split_as_prefills" not in {t["code"] for t in got["not_checked"]}

    after = _threshold_builder(vl, ROCMAiterMLASparseBackend, k, spec_as_decode=True)
    assert after.reorder_batch_threshold == uq  # counted as decodes: raised to 1 + k
    group.metadata_builders = [after]
    fixed = take_snapshot(_runner(after.vllm_config, uq, [group]))
    assert "mtp_decodes_split_as_prefills" not in _codes(fixed)
    # no MTP: a threshold of 1 splits nothing wrong
    plain = take_snapshot(_runner(before.vllm_config, 1, [group]))
    assert "mtp_decodes_split_as_prefills" not in _codes(plain)


def test_full_decode_only_eager_mixed_steps_counted_from_the_replayed_steps(vl: Vllm) -> None:
    """FULL_DECODE_ONLY with chunked prefill, the mixed steps from vLLM's own dispatcher:
    the chunked-prefill MRV2 recording's shapes replayed under FULL_DECODE_ONLY; the
    snapshot is the real resolved config's, without the chunked-prefill fact (as
    recordings taken before the probe kept it)."""
    from probe.analysis.traps import traps
    from probe.analysis.whatif import Replayer, Setting, load_vllm
    from probe.reader.recording import Recording

    path = H200_RECORDING.parent / "chunked_mrv2_k1.probe"
    rec = Recording.open(path)
    steps = list(rec.iter_steps())
    snaps = {p["pid"]: p["snapshot"] for p in rec.processes() if p.get("snapshot")}
    rec.close()
    r = Replayer(steps, snaps)
    with r.session(load_vllm()):
        replayed = r.replay(r.graphs(r.applied(Setting(mode="FULL_DECODE_ONLY"))))
    eager = [s for s in replayed if s.reason is not None and s.reason.label.startswith("mixed")]
    assert eager and all(s.mode is not None and s.mode.name == "NONE" for s in eager)

    res = resolve(vl, ENGINES["fdo_ub_k1"], v2=True)
    assert res.mode.name == "FULL_DECODE_ONLY"
    snap = take_snapshot(_runner(res.vllm_config, 2))
    del snap["chunked_prefill"]
    code = "full_decode_only_with_chunked_prefill"
    alone = traps(snap)
    assert code in {t["code"] for t in alone["not_checked"]}
    assert code not in {t["code"] for t in alone["traps"]}
    got = traps(snap, replayed)
    (f,) = [t for t in got["traps"] if t["code"] == code]
    assert f"{len(eager)} eager mixed steps" in f["message"]
