"""The hook families are one table, late targets included, on the real vLLM classes.

Late targets exist only on live objects (the metadata builders vLLM has imported, the
model's ``compute_logits``, the drafter's ``propose``); they are resolved from the model
runner on the first enabled step. Here the runner is a stand-in whose model and drafter
are real vLLM classes (instances made without ``__init__``: only their types matter), and
the builders are every ``AttentionMetadataBuilder`` subclass the tree's sparse-MLA modules
define, the seed's ``ROCMAiterMLASparseMetadataBuilder`` among them.
"""

from __future__ import annotations

import importlib
import logging
import types
from typing import Any

import pytest

from probe.engine import hooks
from probe.engine.hooks import builders, step
from probe.engine.hooks._base import Installer

from .vllm_env import tree_has

pytestmark = [pytest.mark.wheels, pytest.mark.usefixtures("clean_probe")]

MISSING = object()
SPARSE_MODULES = (
    "vllm.v1.attention.backends.mla.flashmla_sparse",
    "vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse",
    "vllm.v1.attention.backends.mla.indexer",
)


def _runner() -> Any:
    """A runner-shaped holder of the real model class and the tree's MTP drafter: V1's
    ``EagleProposer`` where the tree has the classic runner, else MRV2's speculator."""
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM

    model = object.__new__(DeepseekV2ForCausalLM)
    if tree_has("vllm.v1.spec_decode.eagle"):
        from vllm.v1.spec_decode.eagle import EagleProposer

        return types.SimpleNamespace(get_model=lambda: model, drafter=object.__new__(EagleProposer))
    from vllm.v1.worker.gpu.spec_decode.mtp.speculator import MTPSpeculator

    return types.SimpleNamespace(get_model=lambda: model, speculator=object.__new__(MTPSpeculator))


def _late(runner: Any) -> list[tuple[Any, Any, str]]:
    out = []
    for fam in hooks.FAMILY_TABLE:
        for target, owner in fam.late_targets(runner):
            out.append((target, owner, fam.name))
    return out


def test_every_target_carries_its_family() -> None:
    assert list(hooks.FAMILIES) == [f.name for f in hooks.FAMILY_TABLE]
    for fam in hooks.FAMILY_TABLE:
        assert fam.targets and all(t.family == fam.name for t in fam.targets), fam.name
    for target, _owner, fam_name in _late(_runner()):
        assert target.family == fam_name


def test_status_reports_the_families_enable_accepts() -> None:
    hooks.install(lazy=False)
    installed = {h.family for h in hooks.INSTALLER.hooks.values()}
    assert installed <= set(hooks.FAMILIES)  # no "phase" or "sync" pseudo-families
    assert hooks.targets(sorted(installed))  # enable/install take these names


def test_late_targets_cover_the_seed_builder_logits_and_drafter() -> None:
    for mod in SPARSE_MODULES:
        importlib.import_module(mod)
    late = _late(_runner())
    ids = {t.hook_id for t, _o, _f in late}
    assert "build.ROCMAiterMLASparseMetadataBuilder.build" in ids
    assert "build.FlashMLASparseMetadataBuilder.build" in ids
    assert "phase.logits" in ids and "phase.draft.propose" in ids


def test_late_target_lifecycle_restores_by_identity(caplog: pytest.LogCaptureFixture) -> None:
    for mod in SPARSE_MODULES:
        importlib.import_module(mod)
    late = _late(_runner())
    before = {(id(o), t.name): vars(o).get(t.name, MISSING) for t, o, _f in late}
    inst = Installer()
    for target, owner, _fam in late:
        assert inst.install_on(target, owner), target.hook_id
        assert vars(owner)[target.name] is not before[(id(owner), target.name)]
        assert inst.hooks[(id(owner), target.name)].family == target.family
    with caplog.at_level(logging.WARNING, logger="probe"):
        target, owner, _f = late[0]
        assert not inst.install_on(target, owner)  # a second install changes nothing
    assert "already installed" in caplog.text
    inst.uninstall()
    for target, owner, _f in late:
        assert vars(owner).get(target.name, MISSING) is before[(id(owner), target.name)]
    for target, owner, _f in late:  # and again: reinstall, uninstall
        assert inst.install_on(target, owner)
    inst.uninstall()
    for target, owner, _f in late:
        assert vars(owner).get(target.name, MISSING) is before[(id(owner), target.name)]


def test_a_builder_base_that_does_not_resolve_is_reported_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(builders, "BUILDER_BASE", ("vllm.v1.attention.backend", "NoSuchBuilder"))
    with pytest.raises(LookupError, match="NoSuchBuilder"):
        builders.FAMILY.late_targets(_runner())
    report = hooks.LAST_REPORT
    n = len(report.missing)
    hooks._families[:] = ["builders"]
    hooks._first_step(_runner())
    assert ("builders.late", report.missing[n][1]) == report.missing[n]
    assert "NoSuchBuilder" in report.missing[n][1]


@pytest.mark.usefixtures("needs_v1")
def test_v1s_drafter_span_is_one_hooked_call() -> None:
    """V1 calls ``drafter.propose`` only inside ``propose_draft_token_ids``: with that
    hooked (``phase.v1.draft``), the drafter's own ``propose`` stays vLLM's; without it
    (excluded, or failed to install) the drafter's span is the DRAFT phase."""
    from vllm.v1.spec_decode.eagle import EagleProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner = object.__new__(GPUModelRunner)
    runner.drafter = object.__new__(EagleProposer)
    target = next(t for t in step.TARGETS if t.hook_id == "phase.v1.draft")
    inst = Installer()
    assert inst.install_on(target, GPUModelRunner)
    try:
        ids = {t.hook_id for t, _o in step.FAMILY.late_targets(runner)}
        assert "phase.draft.propose" not in ids
    finally:
        inst.uninstall()
    ids = {t.hook_id for t, _o in step.FAMILY.late_targets(runner)}
    assert "phase.draft.propose" in ids
