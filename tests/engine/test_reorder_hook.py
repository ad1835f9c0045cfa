"""The reorder hooks write the same REORDER record on both hot paths, for every shape of
input: the compiled common path (probe.engine.accel._accel.Reorder: exact dicts, lists, str ids and
ints) and each case it hands to the Python hook or record (a tuple of ids, numpy counts, a
mapping that is not a dict, int ids, a threshold of another type, a nested call, vLLM
raising, a probe fault)."""

from __future__ import annotations

import types
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ring_drain import drain

from probe.engine import accel
from probe.engine.hooks import reorder
from probe.engine.hooks._base import Installer, Target
from probe.engine.ring_writer import RingWriter
from probe.engine.runtime import RT
from probe.records import Flag, Reorder

# -- MRV2: sort_batch_req_ids(num_tokens_per_req, [draft_tokens,] decode_query_len) -------


def _mrv2_sort(num: Any, *args: Any, **kwargs: Any) -> Any:
    """vLLM's ordering (decodes first, then by length); ``result`` overrides the value."""
    if "result" in kwargs:
        return kwargs["result"]
    dql = kwargs.get("decode_query_len", args[-1] if args else 1)
    return sorted(num, key=lambda r: (num[r] != dql, num[r]))


def _new(s: str) -> str:
    return "".join(list(s))  # an equal str that is not the same object


MRV2: dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]] = {
    "sorted": ({"a": 2, "b": 2, "c": 9}, ({}, 2), {}),
    "moved": ({"a": 9, "b": 2, "c": 2}, ({}, 2), {}),
    "keyword dql": ({"a": 9, "b": 2}, ({},), {"decode_query_len": 2}),
    "0.26 signature": ({"a": 9, "b": 1, "c": 1}, (1,), {}),
    "no dql": ({"a": 3, "b": 1}, (), {}),
    "empty": ({}, ({}, 2), {}),
    "equal ids": ({"a": 2, "b": 9}, ({}, 2), {"result": [_new("a"), _new("b")]}),
    "shorter result": ({"a": 2, "b": 9, "c": 2}, ({}, 2), {"result": ["a", "c"]}),
    "None in result": ({"a": 2, "b": 9}, ({}, 2), {"result": ["a", None]}),
    "tuple result": ({"a": 9, "b": 2}, ({}, 2), {"result": ("b", "a")}),
    "int ids": ({1: 9, 2: 2}, ({}, 2), {}),
    "numpy counts": ({"a": np.int32(2), "b": np.int32(9)}, ({}, 2), {}),
    "numpy dql": ({"a": 2, "b": 9}, ({}, np.int64(2)), {}),
    "OrderedDict": (OrderedDict(a=9, b=2), ({}, 2), {}),
    "huge count": ({"a": 2**70, "b": 2}, ({}, 2), {}),
    "huge dql": ({"a": 2, "b": 2**40}, ({}, 2**40), {}),
    "negative dql": ({"a": -1, "b": 2}, ({}, -1), {}),
    "bool dql": ({"a": 1, "b": 2}, ({}, True), {}),
    "fault (str dql)": ({"a": 2}, ({}, "2"), {}),
}

MRV2_IN_C = {
    "sorted", "moved", "keyword dql", "0.26 signature", "no dql", "empty", "equal ids",
    "shorter result", "None in result", "huge count", "negative dql",
}  # fmt: skip
"""The shapes the compiled path records in C (every other one by the Python record)."""


def _record_mrv2(case: str, path: str, tmp: Path, in_step: int = 1) -> tuple[list[Any], Any, int]:
    num, args, kwargs = MRV2[case]
    owner = types.ModuleType("fake_model_runner")
    owner.sort_batch_req_ids = _mrv2_sort  # type: ignore[attr-defined]
    RT.reset()
    writer = RingWriter.create(tmp / f"ring-{path}", capacity=256)
    inst = Installer()
    with accel.use(path):
        target = Target("reorder.mrv2", __name__, "", "sort_batch_req_ids", reorder.mrv2_sort)
        inst.install_on(target, owner)
        if path == "compiled":
            assert type(vars(owner)["sort_batch_req_ids"]).__name__ == "Reorder"
        RT.attach(writer)
        slow = _Counting()
        RT.enabled = True
        RT.in_step = in_step
        RT.step = 5
        for _ in range(2):
            want = _mrv2_sort(num, *args, **kwargs)
            assert owner.sort_batch_req_ids(num, *args, **kwargs) == want
        RT.in_step = 0
        RT.enabled = False
        RT.detach()
    inst.uninstall()
    faults = dict(RT.faults)
    recs = [r for r in drain(writer)[0] if isinstance(r, Reorder)]
    writer.close()
    RT.reset()
    return recs, faults, slow.calls


class _Counting:
    """``RT.put.reorder`` counting its calls: the compiled fast path never makes one."""

    def __init__(self) -> None:
        self.calls = 0
        self.put = RT.put.reorder
        RT.put.reorder = self

    def __call__(self, *fields: Any) -> Any:
        self.calls += 1
        return self.put(*fields)


def _strip(recs: list[Reorder]) -> list[tuple[Any, ...]]:
    assert all(r.t0 <= r.t1 for r in recs)
    return [(*(getattr(r, f) for f in FIELDS),) for r in recs]


FIELDS = [
    "step", "changed", "flags", "threshold", "num_reqs", "num_decodes", "num_decode_tokens",
    "moved", "spec_as_decode",
]  # fmt: skip

needs_c = pytest.mark.skipif(not accel.COMPILED, reason=f"not built: {accel.WHY_NOT}")


@needs_c
@pytest.mark.parametrize("case", sorted(MRV2))
def test_compiled_mrv2_sort_writes_what_the_python_hook_writes(case: str, tmp_path: Path) -> None:
    py, py_faults, _ = _record_mrv2(case, "python", tmp_path)
    c, c_faults, slow = _record_mrv2(case, "compiled", tmp_path)
    assert _strip(c) == _strip(py)
    assert c_faults == py_faults
    assert len(py) == (0 if case.startswith("fault") else 2)
    assert slow == (0 if case in MRV2_IN_C else len(py))


def test_mrv2_sort_values(hot_path: str, tmp_path: Path) -> None:
    (r, _), faults, _ = _record_mrv2("moved", hot_path, tmp_path)
    assert (r.step, r.changed, r.threshold, r.num_reqs, r.num_decodes) == (5, True, 2, 3, 2)
    assert (r.num_decode_tokens, r.moved, r.spec_as_decode, r.flags) == (4, 3, True, Flag.MRV2)
    (r, _), _, _ = _record_mrv2("shorter result", hot_path, tmp_path, in_step=0)
    assert (r.changed, r.moved, r.num_reqs, r.num_decodes) == (True, 1, 3, 2)
    assert r.flags == Flag.MRV2 | Flag.OUTSIDE_STEP
    (r, _), _, _ = _record_mrv2("equal ids", hot_path, tmp_path)
    assert (r.changed, r.moved) == (False, 0)
    (r, _), _, _ = _record_mrv2("0.26 signature", hot_path, tmp_path)
    assert (r.threshold, r.num_decodes, r.spec_as_decode) == (1, 2, False)
    assert faults == {}
    recs, faults, _ = _record_mrv2("fault (str dql)", hot_path, tmp_path)
    assert recs == [] and faults == {"reorder.mrv2": 1}


# -- V1: GPUModelRunner._may_reorder_batch(self, scheduler_output) ------------------------


class _Batch:
    def __init__(self, ids: Any) -> None:
        self._req_ids = ids

    @property
    def req_ids(self) -> Any:  # as vLLM's InputBatch: the list itself, reordered in place
        return self._req_ids


class _Runner:
    def __init__(self, ids: Any, opt: dict[str, Any]) -> None:
        self.opt = opt
        if "no input_batch" not in opt:
            self.input_batch = _Batch(ids)
        self.reorder_batch_threshold = opt.get("thr", 2)
        if "uq" in opt:
            self.uniform_decode_query_len = opt["uq"]
        self.nested = opt.get("nested", False)

    def _may_reorder_batch(self, scheduler_output: Any) -> None:
        """Decodes first, in place (as ``reorder_batch_to_split_decodes_and_prefills``)."""
        if self.nested:
            self.nested = False
            self._may_reorder_batch(scheduler_output)
        batch = getattr(self, "input_batch", None)
        ids = batch._req_ids if batch is not None else None
        if isinstance(ids, list) and self.reorder_batch_threshold is not None:
            n = scheduler_output.num_scheduled_tokens
            thr = self.reorder_batch_threshold
            ids.sort(key=lambda r: (r is None, r is not None and n[r] > thr))
            if self.opt.get("drop"):
                ids.pop()
        if "raise" in self.opt:
            raise self.opt["raise"]


V1: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    "unchanged": (["a", "b", "c"], {"a": 2, "b": 2, "c": 9}, {"uq": 2}),
    "reordered": (["c", "a", "b"], {"a": 2, "b": 2, "c": 9}, {"uq": 2}),
    "no threshold": (["c", "a"], {"a": 2, "c": 9}, {"thr": None, "uq": 2}),
    "no uq": (["c", "a"], {"a": 2, "c": 9}, {}),
    "uq 1": (["c", "a"], {"a": 1, "c": 9}, {"uq": 1, "thr": 1}),
    "threshold 128": (["c", "a"], {"a": 2, "c": 200}, {"uq": 2, "thr": 128}),
    "keyword": (["c", "a"], {"a": 2, "c": 9}, {"uq": 2, "kw": True}),
    "None holes": (["c", None, "a"], {"a": 2, "c": 9}, {"uq": 2}),
    "dropped": (["c", "a", "b"], {"a": 2, "b": 2, "c": 9}, {"uq": 2, "drop": True}),
    "tuple ids": (("c", "a"), {"a": 2, "c": 9}, {"uq": 2}),
    "int ids": ([3, 1], {1: 2, 3: 9}, {"uq": 2}),
    "numpy counts": (["c", "a"], {"a": np.int32(2), "c": np.int32(9)}, {"uq": 2}),
    "numpy threshold": (["c", "a"], {"a": 2, "c": 9}, {"uq": 2, "thr": np.int64(2)}),
    "mapping": (["c", "a"], types.MappingProxyType({"a": 2, "c": 9}), {"uq": 2}),
    "huge count": (["c", "a"], {"a": 2, "c": 2**70}, {"uq": 2}),
    "nested": (["c", "a"], {"a": 2, "c": 9}, {"uq": 2, "nested": True}),
    "vllm raises": (["c", "a"], {"a": 2, "c": 9}, {"uq": 2, "raise": KeyError("vllm's own")}),
    "fault (no input_batch)": (["a"], {"a": 2}, {"no input_batch": True}),
    "fault (str uq)": (["c", "a"], {"a": 2, "c": 9}, {"uq": "2"}),
}

V1_IN_C = {
    "unchanged", "reordered", "no threshold", "no uq", "uq 1", "threshold 128", "keyword",
    "None holes", "dropped", "vllm raises",
}  # fmt: skip


def _record_v1(case: str, path: str, tmp: Path) -> tuple[list[Any], Any, int]:
    ids, counts, opt = V1[case]

    class Runner(_Runner):
        _may_reorder_batch = _Runner._may_reorder_batch  # in vars(Runner), to be wrapped

    RT.reset()
    writer = RingWriter.create(tmp / f"ring-{path}", capacity=256)
    inst = Installer()
    with accel.use(path):
        target = Target("reorder.v1", __name__, "", "_may_reorder_batch", reorder.v1_may_reorder)
        inst.install_on(target, Runner)
        if path == "compiled":
            assert type(vars(Runner)["_may_reorder_batch"]).__name__ == "Reorder"
        RT.attach(writer)
        slow = _Counting()
        RT.enabled = True
        RT.in_step = 1
        RT.step = 9
        for _ in range(2):
            runner = Runner(list(ids) if isinstance(ids, list) else ids, opt)
            so = types.SimpleNamespace(num_scheduled_tokens=counts)
            try:
                if opt.get("kw"):
                    runner._may_reorder_batch(scheduler_output=so)
                else:
                    runner._may_reorder_batch(so)
            except KeyError as exc:
                assert exc is opt["raise"]
        RT.in_step = 0
        RT.enabled = False
        RT.detach()
    inst.uninstall()
    faults = dict(RT.faults)
    recs = [r for r in drain(writer)[0] if isinstance(r, Reorder)]
    writer.close()
    RT.reset()
    return recs, faults, slow.calls


@needs_c
@pytest.mark.parametrize("case", sorted(V1))
def test_compiled_v1_reorder_writes_what_the_python_hook_writes(case: str, tmp_path: Path) -> None:
    py, py_faults, _ = _record_v1(case, "python", tmp_path)
    c, c_faults, slow = _record_v1(case, "compiled", tmp_path)
    assert _strip(c) == _strip(py)
    assert c_faults == py_faults
    want = 0 if case.startswith("fault") else 4 if case == "nested" else 2
    assert len(py) == want
    # the nested call takes the Python hook; the outer one stays in C
    assert slow == (0 if case in V1_IN_C else 2 if case == "nested" else len(py))


def test_v1_reorder_values(hot_path: str, tmp_path: Path) -> None:
    (r, _), faults, _ = _record_v1("reordered", hot_path, tmp_path)
    assert (r.step, r.changed, r.flags, r.threshold, r.num_reqs) == (9, True, 0, 2, 3)
    assert (r.num_decodes, r.num_decode_tokens, r.moved, r.spec_as_decode) == (2, 4, 3, True)
    (r, _), _, _ = _record_v1("unchanged", hot_path, tmp_path)
    assert (r.changed, r.moved) == (False, 0)
    (r, _), _, _ = _record_v1("no threshold", hot_path, tmp_path)
    assert (r.threshold, r.num_decodes, r.num_decode_tokens, r.changed) == (-1, 0, 0, False)
    (r, _), _, _ = _record_v1("no uq", hot_path, tmp_path)
    assert r.spec_as_decode is False
    (r, _), _, _ = _record_v1("None holes", hot_path, tmp_path)
    assert (r.num_reqs, r.moved) == (3, 3)  # [c, None, a] -> [a, c, None]
    (r, _), _, _ = _record_v1("dropped", hot_path, tmp_path)
    assert (r.num_reqs, r.moved) == (3, 2)  # [c, a, b] -> [a, b]: two positions compared
    (r, _), _, _ = _record_v1("vllm raises", hot_path, tmp_path)
    assert r.changed  # written when vLLM raised, and vLLM's exception passed through
    assert faults == {}
    recs, faults, _ = _record_v1("fault (no input_batch)", hot_path, tmp_path)
    assert recs == [] and faults == {"reorder.v1": 1}
