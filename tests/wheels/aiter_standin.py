"""AMD's ``aiter`` (the ``amd-aiter`` package) as far as it runs without ROCm, for CPU tests.

``import aiter`` needs ROCm: ``aiter/__init__.py`` imports ``aiter.jit.core``, whose
``jit/utils/cpp_extension.py`` runs ``get_hip_version()`` at import time and raises
``RuntimeError("ROCm version file not found")`` when ``hipconfig`` is not on PATH or
under ROCM_HOME. So nothing of the package can be imported here, and its code is taken
from the installed package's source files instead:

- ``aiter.utility.dtypes``: the real module's source, run with one stand-in, its import
  of ``get_gfx`` (``rocminfo``: needs ROCm), which answers :data:`GFX`.
- ``get_mla_metadata_info_v1``: the real function, compiled from ``aiter/ops/attention.py``
  as written; only ``torch.cuda`` (the device's CU count) is stood in, as :data:`CU_NUM`.
- ``get_mla_metadata_v1``: a HIP kernel (``@compile_ops``). The stand-in is the real
  stub's signature and docstring (compiled from the source without its decorator); a call
  is bound to that signature and checked against the documented inputs, and returns
  ``None`` as documented (the outputs are written in place on the GPU; here they stay as
  the caller allocated them).

The PyPI wheel (0.1.7.post2.dev18) is older than the aiter vLLM 0.26 and 0.33 call:
their builders pass ``get_mla_metadata_v1`` twelve positional arguments (a
``kv_last_page_lens`` third, ``work_info_set`` before ``work_indptr``) and ``page_size``
(0.33 also ``dtype_q``/``dtype_kv``), which that wheel's signature cannot bind (0.26:
"multiple values for argument 'kv_granularity'"). ROCm/aiter's later sources declare
exactly those. :func:`call_signature` is the installed signature with that delta
(:data:`DELTA`) applied and nothing else; a call is bound to it, and what binding the
same call to the installed signature raised is kept in ``calls[i].installed_error``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

GFX = "gfx942"  # MI300X/MI325X: the architecture vLLM's ROCm sparse-MLA path targets
CU_NUM = 304  # compute units of an MI300X
# The installed signature -> the one vLLM calls (see the module docstring).
DELTA = (
    "insert kv_last_page_lens: Tensor after seqlens_kv_indptr",
    "rename work_info to work_info_set and move it before work_indptr",
    "insert page_size: int = 1 before kv_granularity",
    "append intra_batch_mode: bool = False, dtype_q: dtype | None = None, dtype_kv = None",
)


def package_dir() -> Path:
    """The installed ``aiter`` package directory (from the ``amd-aiter`` distribution)."""
    dist = importlib.metadata.distribution("amd-aiter")
    return Path(str(dist.locate_file("aiter")))


def import_error() -> BaseException | None:
    """What ``import aiter`` raises on this machine (None if it imports)."""
    saved = dict(sys.modules)
    try:
        import aiter  # noqa: F401
    except BaseException as exc:  # RuntimeError without ROCm; whatever else it may be
        return exc
    finally:  # leave no half-imported aiter modules behind
        for name in set(sys.modules) - set(saved):
            if name == "aiter" or name.startswith(("aiter.", "aiter_")):
                del sys.modules[name]
    return None


def _functions(path: Path, *names: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text(), str(path))
    found = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names}
    missing = set(names) - set(found)
    if missing:
        raise LookupError(f"{path}: no {', '.join(sorted(missing))}")
    return found


def _compile(fn: ast.FunctionDef, path: Path, namespace: dict[str, Any]) -> Any:
    """The function as written in the source, without its decorators."""
    node = ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))
    fn.decorator_list = []
    exec(compile(node, str(path), "exec"), namespace)
    return namespace[fn.name]


def _dtypes_module(root: Path) -> ModuleType:
    """``aiter.utility.dtypes`` from its source, ``get_gfx`` answering :data:`GFX`."""
    path = root / "utility" / "dtypes.py"
    tree = ast.parse(path.read_text(), str(path))
    body = [
        n
        for n in tree.body
        if not (isinstance(n, ast.ImportFrom) and any(a.name == "get_gfx" for a in n.names))
    ]
    if len(body) != len(tree.body) - 1:
        raise LookupError(f"{path}: the get_gfx import is not where it was")
    mod = ModuleType("aiter.utility.dtypes")
    mod.__file__ = str(path)
    mod.__dict__["get_gfx"] = lambda: GFX
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), mod.__dict__)
    return mod


def call_signature(installed: inspect.Signature) -> inspect.Signature:
    """The installed ``get_mla_metadata_v1`` signature with :data:`DELTA` applied."""
    import torch

    P = inspect.Parameter
    params = dict(installed.parameters)
    if "kv_last_page_lens" in params:  # a release that already has the newer signature
        return installed
    out: list[inspect.Parameter] = []
    for name, p in params.items():
        if name == "work_indptr":
            out.append(params["work_info"].replace(name="work_info_set"))
        if name == "work_info":
            continue
        if name == "kv_granularity":
            out.append(P("page_size", P.POSITIONAL_OR_KEYWORD, default=1, annotation=int))
        out.append(p)
        if name == "seqlens_kv_indptr":
            out.append(p.replace(name="kv_last_page_lens"))
    for name, default, ann in (
        ("intra_batch_mode", False, bool),
        ("dtype_q", None, torch.dtype | None),
        ("dtype_kv", None, torch.dtype | None),
    ):
        if name not in params:
            out.append(P(name, P.POSITIONAL_OR_KEYWORD, default=default, annotation=ann))
    return installed.replace(parameters=out)


@dataclass
class MetadataCall:
    """One ``get_mla_metadata_v1`` call, bound to the signature vLLM calls."""

    arguments: dict[str, Any]
    installed_error: str | None  # binding it to the installed signature raised this


@dataclass
class Aiter:
    """The module the tests put at ``sys.modules["aiter"]``, and what it saw."""

    module: ModuleType
    import_error: BaseException | None
    installed_signature: inspect.Signature
    call_signature: inspect.Signature
    calls: list[MetadataCall] = field(default_factory=list)


def build() -> Aiter:
    """An ``aiter`` module with the real sizing code and a signature-true kernel stand-in."""
    import torch

    root = package_dir()
    dtypes = _dtypes_module(root)
    attention = root / "ops" / "attention.py"
    defs = _functions(attention, "get_mla_metadata_info_v1", "get_mla_metadata_v1")
    props = SimpleNamespace(multi_processor_count=CU_NUM)
    cuda = SimpleNamespace(current_device=lambda: 0, get_device_properties=lambda gpu: props)
    torch_ns = SimpleNamespace(cuda=cuda, uint64=torch.uint64, int32=torch.int32)
    info_v1 = _compile(
        defs["get_mla_metadata_info_v1"],
        attention,
        {"math": math, "torch": torch_ns, "dtypes": dtypes},
    )
    stub = _compile(defs["get_mla_metadata_v1"], attention, {"torch": torch})
    installed = inspect.signature(stub)
    sig = call_signature(installed)
    state = Aiter(ModuleType("aiter"), import_error(), installed, sig)

    def get_mla_metadata_v1(*args: Any, **kwargs: Any) -> None:
        try:
            installed.bind(*args, **kwargs)
            installed_error = None
        except TypeError as exc:
            installed_error = str(exc)
        bound = sig.bind(*args, **kwargs)  # TypeError for anything else
        bound.apply_defaults()
        a = bound.arguments
        qo, kv = a["seqlens_qo_indptr"], a["seqlens_kv_indptr"]
        # Inputs as documented: cumulated q/o and k/v lengths, (batch_size + 1) int32.
        if qo.dtype != torch.int32 or kv.dtype != torch.int32 or qo.shape != kv.shape:
            raise TypeError(f"indptrs must be int32 of one shape: {qo.dtype}{tuple(qo.shape)}")
        if bool((qo[1:] < qo[:-1]).any()) or bool((kv[1:] < kv[:-1]).any()):
            raise ValueError("seqlens indptrs must be cumulative")
        if a["kv_last_page_lens"].shape[0] != qo.shape[0] - 1:
            raise ValueError("kv_last_page_lens must be (batch_size)")
        state.calls.append(MetadataCall(dict(a), installed_error))

    get_mla_metadata_v1.__signature__ = sig  # type: ignore[attr-defined]
    get_mla_metadata_v1.__doc__ = stub.__doc__
    mod = state.module
    mod.__file__ = str(root / "__init__.py")
    mod.__dict__.update(
        dtypes=dtypes,
        get_mla_metadata_info_v1=info_v1,
        get_mla_metadata_v1=get_mla_metadata_v1,
    )
    return state
