"""The metadata-build hook writes the same BUILD record on both hot paths, for every shape
of input: the compiled common path (probe.engine.accel._accel.Build) and each case it hands to the
Python record (None fields, metadata without a split, a threshold under another name,
values that do not fit). Inside vLLM it reads plain attributes only: never the
``query_start_loc_cpu`` tensor; the reader derives the real counts (``fill_builds``),
which reproduces the engine-side read on every build of five real recordings."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from ring_drain import drain

from probe.engine import accel
from probe.engine.hooks import builders
from probe.engine.hooks._base import Installer, Target
from probe.engine.ring_writer import RingWriter
from probe.engine.runtime import RT
from probe.reader.assemble import fill_builds
from probe.reader.recording import Recording
from probe.records import Build, BuildTag

QSL = torch.tensor([0, 2, 4, 6, 8, 9, 12], dtype=torch.int32)
ROOT = Path(__file__).resolve().parents[2]


class _Untouchable:
    """A ``query_start_loc_cpu`` that fails the test if anything reads it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the build hook read query_start_loc_cpu.{name} inside vLLM")

    def __getitem__(self, i: Any) -> Any:
        raise AssertionError("the build hook indexed query_start_loc_cpu inside vLLM")


def _cm(**kw: Any) -> Any:
    base = dict(num_actual_tokens=16, num_reqs=6, query_start_loc_cpu=QSL, max_query_len=3)
    return types.SimpleNamespace(**{**base, **kw})


NO_QSL = types.SimpleNamespace(num_actual_tokens=16, num_reqs=6, max_query_len=3)
NO_NPT = types.SimpleNamespace(num_decodes=4, num_prefills=2, num_decode_tokens=8)


def _md(**kw: Any) -> Any:
    base = dict(num_decodes=4, num_prefills=2, num_decode_tokens=8, num_prefill_tokens=4)
    return types.SimpleNamespace(**{**base, **kw})


CASES: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    "common": (_cm(), _md(), {}),
    "padded": (_cm(num_actual_tokens=12), _md(), {}),
    "tensor untouched": (_cm(query_start_loc_cpu=_Untouchable()), _md(), {}),
    "no tensor": (NO_QSL, _md(), {}),
    "no split": (_cm(), types.SimpleNamespace(), {}),
    "split None": (_cm(), _md(num_decodes=None), {}),
    "no prefill tokens": (_cm(), _md(num_prefill_tokens=None), {}),
    "prefill tokens missing": (_cm(), NO_NPT, {}),
    "prefills None": (_cm(), _md(num_prefills=None), {}),
    "prefills not an int": (_cm(), _md(num_prefills=2.0), {}),
    "max_query_len None": (_cm(max_query_len=None), _md(), {}),
    "max_query_len missing": (types.SimpleNamespace(num_actual_tokens=16, num_reqs=6), _md(), {}),
    "decode_threshold": (_cm(), _md(), {"decode_threshold": 7}),
    "no threshold": (_cm(), _md(), {"reorder_batch_threshold": None}),
    "keyword": (_cm(), _md(), {"kw": True}),
    "big": (_cm(num_actual_tokens=2**40), _md(), {}),
}


def _record(case: str, path: str, tmp: Path) -> tuple[list[Any], int]:
    cm, md, opt = CASES[case]

    class SomeMetadataBuilder:
        reorder_batch_threshold: Any = opt.get("reorder_batch_threshold", 2)

        def build(self, common_prefix_len: int, common_attn_metadata: Any) -> Any:
            return md

    if "decode_threshold" in opt:
        SomeMetadataBuilder.reorder_batch_threshold = None
        SomeMetadataBuilder.decode_threshold = opt["decode_threshold"]  # type: ignore[attr-defined]
    RT.reset()
    writer = RingWriter.create(tmp / f"ring-{path}", capacity=256)
    inst = Installer()
    with accel.use(path):
        target = Target("build.t", __name__, "", "build", builders.build(BuildTag.STEP))
        inst.install_on(target, SomeMetadataBuilder)
        if path == "compiled":
            assert type(vars(SomeMetadataBuilder)["build"]).__name__ == "Build"
        RT.attach(writer)
        RT.enabled = True
        b = SomeMetadataBuilder()
        for _ in range(2):  # the second call runs with the class already interned
            out = b.build(0, common_attn_metadata=cm) if opt.get("kw") else b.build(0, cm)
            assert out is md
        RT.enabled = False
        RT.detach()
    inst.uninstall()
    faults = RT.faults if hasattr(RT, "faults") else 0
    recs = [r for r in drain(writer)[0] if isinstance(r, Build)]
    writer.close()
    RT.reset()
    return recs, faults


@pytest.mark.skipif(not accel.COMPILED, reason=f"compiled path not built: {accel.WHY_NOT}")
@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_build_writes_what_the_python_hook_writes(case: str, tmp_path: Path) -> None:
    py, py_faults = _record(case, "python", tmp_path)
    c, c_faults = _record(case, "compiled", tmp_path)
    strip = [(r.tag, r.builder_id, r.flags, *[getattr(r, f) for f in FIELDS]) for r in py]
    assert [(r.tag, r.builder_id, r.flags, *[getattr(r, f) for f in FIELDS]) for r in c] == strip
    assert c_faults == py_faults
    if case in ("common", "tensor untouched", "no tensor"):
        assert len(c) == 2 and not c_faults
        r = c[0]
        assert (r.padded_tokens, r.real_tokens, r.padded_reqs, r.real_reqs) == (16, -1, 6, -1)
        assert (r.num_decodes, r.num_prefill_tokens, r.reorder_batch_threshold) == (4, 4, 2)
        assert r.t0 <= r.t1
    if case == "prefill tokens missing":  # left to the reader
        assert [r.num_prefill_tokens for r in c] == [-1, -1]


FIELDS = [
    "padded_tokens",
    "real_tokens",
    "padded_reqs",
    "real_reqs",
    "max_query_len",
    "reorder_batch_threshold",
    "num_decodes",
    "num_prefills",
    "num_decode_tokens",
    "num_prefill_tokens",
]


def test_a_failing_build_propagates_and_records_nothing(hot_path: str, tmp_path: Path) -> None:
    class Boom:
        def build(self, common_prefix_len: int, common_attn_metadata: Any) -> Any:
            raise KeyError("vllm's own")

    RT.reset()
    writer = RingWriter.create(tmp_path / "ring", capacity=64)
    inst = Installer()
    inst.install_on(
        Target("build.boom", __name__, "", "build", builders.build(BuildTag.STEP)), Boom
    )
    RT.attach(writer)
    RT.enabled = True
    with pytest.raises(KeyError, match="vllm's own"):
        Boom().build(0, _cm())
    assert not RT.in_build
    RT.enabled = False
    RT.detach()
    inst.uninstall()
    assert not [r for r in drain(writer)[0] if isinstance(r, Build)]
    writer.close()
    RT.reset()


RECORDINGS = [
    "probe/data/default.probe",
    "tests/data/chunked_mrv2_k1.probe",
    "tests/data/stock_mrv2_k1.probe",
    "tests/data/serve-tp2.probe",
    "tests/data/groundtruth-window.probe",
]
# FlashMLASparseMetadata has no num_prefill_tokens: the engine-side hook used to fill it in
LEAVES_OUT_PREFILL_TOKENS = {"FlashMLASparseMetadataBuilder"}


@pytest.mark.parametrize("path", RECORDINGS)
def test_the_reader_derives_what_the_engine_used_to_read(path: str) -> None:
    """These recordings were made by the hook that read ``query_start_loc_cpu[num_reqs]``
    inside vLLM (H200: MRV2 k=1 stock and chunked prefill, V1 k=1 under TP=2, a Kineto
    ground-truth window). Blank what the hook now leaves out and derive it again from the
    step's dispatches: every build comes back as recorded."""
    rec = Recording.open(ROOT / path)
    names = rec.builder_names()
    n = 0
    for step in rec.iter_steps():
        blank = []
        for b in step.builds:
            name = names[step.pid][b.builder_id]
            npt = -1 if name in LEAVES_OUT_PREFILL_TOKENS else b.num_prefill_tokens
            blank.append(
                dataclasses.replace(b, real_tokens=-1, real_reqs=-1, num_prefill_tokens=npt)
            )
        assert fill_builds(blank, step.dispatches) == list(step.builds), (path, step.step)
        n += len(blank)
    assert n > 40
