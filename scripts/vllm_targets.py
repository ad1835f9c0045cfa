"""The hook targets and what each surface supports, in the vLLM on the path.

Run with one vLLM (a wheel tree first on PYTHONPATH, or an installed vLLM) and the probe:

    PYTHONPATH=<tree>:. python scripts/vllm_targets.py             # the table, as text
    PYTHONPATH=<tree>:. python scripts/vllm_targets.py --json F    # and the facts into F
    python scripts/vllm_targets.py --markdown F1.json F2.json ...  # one table per surface

Every target of the hook family table (``probe.engine.hooks.FAMILY_TABLE``) and the named late
targets of each family module is looked up the way the installer looks it up, and comes
out as ``resolved``, ``not in this vLLM`` (its module is not shipped: e.g. the classic
runner's on a release with Model Runner V2 only) or ``missing`` (with the reason). The
capabilities are read off the installed classes (modules present, signatures, fields),
never off the version string. ``scripts/vllm_release_check.sh`` runs this per release.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
MRV2_RUNNER = "vllm.v1.worker.gpu.model_runner"
MRV2_MANAGERS = "vllm.v1.worker.gpu.cudagraph_utils"
BUILDERS = (
    ("FlashMLASparseMetadataBuilder", "vllm.v1.attention.backends.mla.flashmla_sparse"),
    ("ROCMAiterMLASparseMetadataBuilder", "vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse"),
    ("DeepseekV32IndexerMetadataBuilder", "vllm.v1.attention.backends.mla.indexer"),
)


def _targets() -> list[Any]:
    """Static targets of every family, then the named late targets of its module."""
    from probe.engine import hooks
    from probe.engine.hooks._base import Target

    out = [t for fam in hooks.FAMILY_TABLE for t in fam.targets]
    seen = {t.hook_id for t in out}
    for fam in hooks.FAMILY_TABLE:
        mod = sys.modules[f"probe.engine.hooks.{'snapshot' if fam.name == 'static' else fam.name}"]
        for value in vars(mod).values():
            if isinstance(value, Target) and value.hook_id not in seen:
                seen.add(value.hook_id)
                out.append(value)
    # the sparse-MLA builders' build methods (the builders family's late targets), by the
    # class and module the probe knows them by
    for name, module in BUILDERS:
        out.append(Target(f"build.{name}.build", module, name, "build", _never))
    return out


def _never(orig: Any, hook: Any) -> Any:
    raise AssertionError("the table only looks targets up")


def _status(t: Any) -> tuple[str, str]:
    from probe.engine.hooks._base import not_in_vllm, resolve_owner

    if not t.module:
        return "late", "found on the live runner at the first step"
    if not_in_vllm(t.module):
        return "not in this vLLM", f"{t.module} is not shipped"
    try:
        owner = resolve_owner(t.module, t.owner)
    except LookupError as exc:
        return "missing", str(exc)
    if t.name in vars(owner) or (t.inherit and hasattr(owner, t.name)):
        return "resolved", ""
    where = getattr(owner, "__qualname__", getattr(owner, "__name__", t.module))
    return "missing", f"{where} has no {t.name!r}"


def _has(module: str) -> bool:
    from probe.engine.hooks._base import not_in_vllm

    if not_in_vllm(module):
        return False
    try:
        importlib.import_module(module)
    except Exception:
        return False
    return True


def _params(fn: Any) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def capabilities() -> dict[str, Any]:
    """What each surface of the probe finds in this vLLM, from its classes."""
    import vllm.config as config

    from probe.analysis.capture_sizes import SPLIT_SIZE_FIELDS

    fields = getattr(config.CompilationConfig, "__dataclass_fields__", {})
    caps: dict[str, Any] = {
        "runner_v1": _has(V1_RUNNER) and _has("vllm.v1.cudagraph_dispatcher"),
        "runner_mrv2": _has(MRV2_RUNNER),
        "resolve_params": sorted(
            _params(config.CompilationConfig.resolve_cudagraph_mode_and_sizes) - {"self"}
        ),
        "split_size_fields": all(k in fields for k in SPLIT_SIZE_FIELDS),
        "breakable_in_config": "use_breakable_cudagraph" in fields,
        "breakable_wrapper": _has("vllm.compilation.breakable_cudagraph"),
    }
    manager = getattr(sys.modules.get(MRV2_MANAGERS) or object(), "CudaGraphManager", None)
    if manager is None and _has(MRV2_MANAGERS):
        manager = getattr(sys.modules[MRV2_MANAGERS], "CudaGraphManager", None)
    if manager is not None:
        init = _params(manager.__init__)
        caps["manager_decode_query"] = (
            "decode_query_lens" if "decode_query_lens" in init else "decode_query_len"
        )
        caps["manager_dispatch_params"] = sorted(_params(manager.dispatch) - {"self"})
        with contextlib.suppress(OSError, TypeError):
            caps["decode_table_by_requests"] = "_decode_descs" in inspect.getsource(manager)
    support = {}
    for name, module in BUILDERS:
        try:
            cls = getattr(importlib.import_module(module), name)
            support[name] = getattr(cls._cudagraph_support, "name", str(cls._cudagraph_support))
        except Exception as exc:
            support[name] = f"missing ({type(exc).__name__})"
    caps["builder_support"] = support
    return caps


def facts() -> dict[str, Any]:
    from probe.analysis.whatif import select_platform

    with contextlib.redirect_stdout(sys.stderr):
        platform = select_platform()
        import vllm

        rows = []
        for t in _targets():
            status, why = _status(t)
            where = ".".join(p for p in (t.module, t.owner, t.name) if p)
            rows.append(
                {"hook": t.hook_id, "family": t.family_name, "where": where,
                 "status": status, "why": why}
            )  # fmt: skip
        caps = capabilities()
    return {"vllm": str(vllm.__version__), "platform": platform, "targets": rows, "caps": caps}


def text(f: dict[str, Any]) -> str:
    rows = f["targets"]
    width = max(len(r["hook"]) for r in rows)
    lines = [f"vLLM {f['vllm']}: hook target resolution ({f['platform']})"]
    for r in rows:
        why = f"  ({r['why']})" if r["status"] == "missing" else ""
        lines.append(f"  {r['hook']:<{width}}  {r['status']:<16} {r['where']}{why}")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines.append("  " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    lines.append("capabilities:")
    lines += [f"  {k}: {v}" for k, v in f["caps"].items()]
    return "\n".join(lines)


_SHORT = {"resolved": "yes", "not in this vLLM": "not in this vLLM", "late": "late"}


def markdown(all_facts: Iterable[dict[str, Any]]) -> str:
    """The supported releases side by side: target resolution, then the surfaces."""
    fs = sorted(all_facts, key=lambda f: tuple(int(x) for x in f["vllm"].split(".")[:3]))
    vs = [f["vllm"] for f in fs]
    head = "| " + " | ".join(["hook target", "where", *vs]) + " |"
    sep = "|" + "---|" * (len(vs) + 2)
    out = [head, sep]
    hooks = list(dict.fromkeys(r["hook"] for f in fs for r in f["targets"]))
    by = [{r["hook"]: r for r in f["targets"]} for f in fs]
    for h in hooks:
        where = next(b[h]["where"] for b in by if h in b)
        cells = []
        for b in by:
            r = b.get(h)
            cells.append("–" if r is None else _SHORT.get(r["status"], f"missing: {r['why']}"))
        out.append(f"| `{h}` | `{where}` | " + " | ".join(cells) + " |")
    out += ["", "| surface | " + " | ".join(vs) + " |", "|---|" + "---|" * len(vs)]

    def row(label: str, cell: Any) -> None:
        out.append(f"| {label} | " + " | ".join(str(cell(f["caps"])) for f in fs) + " |")

    yn = {True: "yes", False: "no"}
    row("classic runner (V1)", lambda c: yn[c["runner_v1"]])
    row("Model Runner V2", lambda c: yn[c["runner_mrv2"]])
    row(
        "hooks: V1 step, dispatch, reorder",
        lambda c: "hooked" if c["runner_v1"] else "not in this vLLM",
    )
    row(
        "resolver takes",
        lambda c: (
            ", ".join(
                p
                for p in c["resolve_params"]
                if p in ("use_v2_model_runner", "piecewise_capture_available")
            )
            or "neither runner nor piecewise flag"
        ),
    )
    row("MRV2 manager takes", lambda c: f"`{c.get('manager_decode_query', '–')}`")
    row(
        "MRV2 decode graphs",
        lambda c: (
            "by request count (`_decode_descs`)"
            if c.get("decode_table_by_requests")
            else "by token capture size"
        ),
    )
    row(
        "graph sizes (doctor, whatif, suggestions)",
        lambda c: (
            "prefill tokens + decode requests"
            if c["split_size_fields"]
            else "`cudagraph_capture_sizes`"
        ),
    )
    row(
        "breakable graphs read from",
        lambda c: (
            "`compilation_config.use_breakable_cudagraph`"
            if c["breakable_in_config"]
            else "`VLLM_USE_BREAKABLE_CUDAGRAPH`"
        ),
    )
    row(
        "`probe whatif` replays",
        lambda c: "V1 and MRV2 recordings" if c["runner_v1"] else "MRV2 recordings",
    )
    for name, _ in BUILDERS:
        row(
            f"`{name}._cudagraph_support` (declared)",
            lambda c, n=name: c["builder_support"].get(n, "–"),
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="FILE", help="also write the facts to FILE")
    ap.add_argument(
        "--markdown", nargs="+", metavar="JSON", help="print the tables of these facts files"
    )
    args = ap.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(p).read_text()) for p in args.markdown), end="")
        return 0
    f = facts()
    if args.json:
        Path(args.json).write_text(json.dumps(f, indent=1) + "\n")
    print(text(f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
