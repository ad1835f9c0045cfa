"""GPU harness: named scenarios on a real vLLM engine, with the probe on, off or absent.

Needs only an installed vLLM with a GPU. Every experiment writes JSON results (and
recordings, traces) under ``--out``. Scenarios are JSON files in ``benchmarks/gpu/
scenarios/``; one describes an engine (runner, k, override, kv dtype, batch sizes) and a
workload (requests, prompt and output lengths).

    python benchmarks/gpu/harness.py ab --a stock_v1_k1 --b ustd_v1_k1 --reps 5 --out OUT
    python benchmarks/gpu/harness.py overhead --scenario stock_v1_k1 --reps 5 --out OUT
    python benchmarks/gpu/harness.py suite --plan plan.json --out OUT --deadline EPOCH

``ab`` runs two engines (one process each, started one after the other) and interleaves
repetitions A, B, A, B, ... so drift hits both arms alike. ``overhead`` cycles one engine
through probe attached / detached / absent (hooks uninstalled: originals restored) and the
torch profiler, interleaved, compares greedy tokens across the modes, and takes a ground
truth window: the torch profiler (Kineto, with Python stacks) and the probe on the same
steps. Engines run in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and load the probe as
vLLM's plugin loader would (``probe.engine.plugin.register``); a ``probe collect`` reader process
per engine drains the ring into a recording.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:  # benchmarks._proc (stdlib only), in both processes
    sys.path.insert(1, str(REPO))
SCEN_DIR = HERE / "scenarios"
TAG = "HARNESS "


def load_scenario(name: str) -> dict[str, Any]:
    p = Path(name)
    if not p.exists():
        p = SCEN_DIR / f"{name}.json"
    sc = json.loads(p.read_text())
    sc.setdefault("name", p.stem)
    return sc


def hooks_for(mode: str) -> str:
    """What a repetition of probe mode ``mode`` needs of the hooks: ``"absent"``
    (uninstalled, vLLM's originals back: ``absent``, and ``profiler``, the torch profiler
    alone), ``"off"`` (installed and dormant: ``detached``) or ``"on"`` (attached:
    ``attached``, ``attached_sN``, ``groundtruth``, the profiler and the probe together)."""
    if mode in ("absent", "profiler"):
        return "absent"
    if mode == "detached":
        return "off"
    if mode in ("attached", "groundtruth") or mode.startswith("attached_s"):
        return "on"
    raise ValueError(f"unknown probe mode {mode!r}")


def apply_mode(
    mode: str, installed: bool, reinstall: bool, hooks: Any, rt: Any, writer: Any
) -> bool:
    """Put the hooks in the state a repetition of ``mode`` needs (:func:`hooks_for`),
    whatever the repetition before left; returns whether they are installed now."""
    need = hooks_for(mode)
    if mode in ("groundtruth", "attached") and reinstall:
        hooks.uninstall()  # every family again (a stepwise variant may have left a few)
        installed = False
    if need == "absent" and installed:
        hooks.uninstall()
        installed = False
    elif need != "absent" and not installed:
        hooks.install(lazy=False)
        hooks.enable(writer, gpu_timing=True)
        installed = True
    # "attached_s8": attached, recording one engine step in 8 (--sample 8)
    every = int(mode.split("_s", 1)[1]) if mode.startswith("attached_s") else 1
    rt.sampling, rt.sample_every, rt.sample_n = every > 1, every, 0
    if need != "absent":
        rt.enabled = need == "on"
    return installed


def log(*a: Any) -> None:
    print(f"[harness {time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


# -- engine side (one process per engine) --------------------------------------------------


def engine_main(args: argparse.Namespace) -> None:
    sc = load_scenario(args.scenario)
    env = sc.get("env", {})
    os.environ.update({k: str(v) for k, v in env.items()})
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if sc.get("runner") == "mrv2" else "0"
    if sc.get("override"):
        os.environ["PROBE_CG_SUPPORT_OVERRIDE"] = sc["override"]
    os.environ["PROBE_ENABLE"] = "1"
    os.environ["PROBE_RUN_DIR"] = args.run_dir
    os.environ["PROBE_CONTROL"] = "0"
    from probe.engine import hooks, plugin
    from probe.engine.runtime import RT, boottime_ns

    plugin.register()  # what vLLM's plugin loader does in each process
    writer = RT.writer
    import torch
    from vllm import LLM, SamplingParams

    model = str(REPO / (sc.get("model") or "benchmarks/gpu/tinyv32"))
    cuda = torch.cuda.is_available()
    backend = sc.get("backend", "FLASHMLA_SPARSE")
    kw: dict[str, Any] = dict(
        model=model,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=sc.get("max_model_len", 4096),
        max_num_seqs=sc.get("max_num_seqs", 64),
        kv_cache_dtype=sc.get("kv", "fp8_ds_mla"),
        seed=0,
        generation_config="vllm",
    )
    if cuda:
        kw["gpu_memory_utilization"] = sc.get("gpu_mem", 0.3)
        kw["compilation_config"] = {"cudagraph_mode": sc.get("cg_mode", "FULL_AND_PIECEWISE")}
        if sc.get("capture_sizes"):  # the graph sizes, in tokens (vLLM's own setting)
            kw["compilation_config"]["cudagraph_capture_sizes"] = list(sc["capture_sizes"])
    if sc.get("max_num_batched_tokens"):
        kw["max_num_batched_tokens"] = sc["max_num_batched_tokens"]
    if "prefix_caching" in sc:
        kw["enable_prefix_caching"] = bool(sc["prefix_caching"])
    if backend:
        kw["attention_config"] = {"backend": backend}
    k = int(sc.get("k", 1))
    if k > 0:
        kw["speculative_config"] = {"method": "mtp", "num_speculative_tokens": k}
        if backend:
            kw["speculative_config"]["attention_backend"] = backend
    t0 = time.time()
    llm = LLM(**kw)
    init_s = time.time() - t0
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    wl = sc.get("workload", {})
    n_req, plen, olen = wl.get("requests", 64), wl.get("prompt_len", 256), wl.get("out_len", 128)

    # a mixed workload: each request's prompt and output length drawn from a range, and a
    # share of the requests opening with a prefix they share (what prefix caching serves)
    plen_range = wl.get("prompt_len_range")
    olen_range = wl.get("out_len_range")
    shared = float(wl.get("shared_prefix_share", 0.0))
    shared_len = int(wl.get("shared_prefix_len", 0))

    def prompts(seed: int, n: int = n_req, pl: int = plen) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        prefix = [rng.randrange(2, vocab) for _ in range(shared_len)]
        out = []
        for _ in range(n):
            length = rng.randint(*plen_range) if plen_range else pl
            head = prefix if shared and rng.random() < shared else []
            body = [rng.randrange(2, vocab) for _ in range(max(1, length - len(head)))]
            out.append({"prompt_token_ids": head + body})
        return out

    def sp(n: int = olen, seed: int = 0, count: int = n_req) -> Any:
        if not olen_range:
            return SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0, detokenize=False)
        rng = random.Random(seed + 1)
        return [
            SamplingParams(
                max_tokens=rng.randint(*olen_range),
                ignore_eos=True,
                temperature=0.0,
                detokenize=False,
            )
            for _ in range(count)
        ]

    warm = SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.0, detokenize=False)
    llm.generate(prompts(999), warm, use_tqdm=False)  # warm-up (JIT, allocator)
    installed = True
    pinned: dict[str, Any] | None = None
    if args.main_cpu is not None:  # after the engine started its threads (they stay off it)
        from benchmarks._proc import pin_main_thread

        try:
            pinned = pin_main_thread(int(args.main_cpu))
        except (ValueError, OSError) as exc:
            pinned = {"error": str(exc)}
    emit(
        {
            "op": "ready",
            "init_s": init_s,
            "scenario": sc,
            "pid": os.getpid(),
            "probe_path": str(Path(hooks.__file__).parents[2]),
            "snapshot": RT.static.get("snapshot"),
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if cuda else "cpu",
            "main_thread_pin": pinned,
        }
    )
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["op"] == "quit":
                break
            if cmd["op"] == "stepwise":
                installed = True
                emit({"op": "result", **stepwise(llm, cmd, prompts, sp, writer)})
                continue
            mode = cmd.get("probe", "attached")
            installed = apply_mode(mode, installed, bool(cmd.get("reinstall")), hooks, RT, writer)
            seed = int(cmd.get("seed", 0))
            ps = prompts(seed, cmd.get("requests", n_req), cmd.get("prompt_len", plen))
            prof = None
            if mode in ("profiler", "groundtruth"):
                from torch.profiler import ProfilerActivity, profile

                acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
                prof = profile(activities=acts, with_stack=(mode == "groundtruth"))
                prof.__enter__()
            b0 = boottime_ns()
            t0 = time.perf_counter()
            outs = llm.generate(ps, sp(cmd.get("out_len", olen), seed, len(ps)), use_tqdm=False)
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            b1 = boottime_ns()
            trace = None
            if prof is not None:
                prof.__exit__(None, None, None)
                if cmd.get("trace"):
                    trace = cmd["trace"]
                    prof.export_chrome_trace(trace)
            toks = [list(o.outputs[0].token_ids) for o in outs]
            ntok = sum(len(t) for t in toks)
            digest = hashlib.sha256(json.dumps(toks).encode()).hexdigest()[:16]
            emit(
                {
                    "op": "result",
                    "rep": cmd.get("rep"),
                    "probe": mode,
                    "tok_s": ntok / dt,
                    "elapsed_s": dt,
                    "out_tokens": ntok,
                    "tokens_sha": digest,
                    "boottime": [b0, b1],
                    "trace": trace,
                    "enabled": RT.enabled,
                    "dropped": getattr(writer, "dropped", None),
                    "tokens": toks if cmd.get("return_tokens") else None,
                }
            )
        except Exception:
            emit({"op": "error", "error": traceback.format_exc()[-3000:]})
    emit({"op": "bye"})


def token_digest(outs: Any) -> str | None:
    """A workload's greedy output tokens, request by request, as a short hash (None when
    ``generate`` gave nothing to read): the same workload must give the same tokens in
    every variant of a run, hooks on or off (crossover.py compares them)."""
    try:
        toks = [list(o.outputs[0].token_ids) for o in outs]
    except (TypeError, AttributeError, IndexError):
        return None
    return hashlib.sha256(json.dumps(toks).encode()).hexdigest()[:16]


def stepwise(llm: Any, cmd: dict[str, Any], prompts: Any, sp: Any, writer: Any) -> dict[str, Any]:
    """The probe's cost per engine step, measured inside one run: the hooks (``families``)
    are switched on and off in alternating blocks of ``block`` engine steps while
    ``generates`` workloads run, and every ``LLMEngine.step`` is timed from outside the
    probe. Blocks next to each other see the same machine state, so the drift that makes
    throughput ratios noisy (+-15% between repetitions) cancels in the per-block pairs."""
    from probe.engine import hooks
    from probe.engine.runtime import RT

    families = cmd.get("families")
    gpu_timing = cmd.get("gpu_timing", True)
    hooks.uninstall()
    st = None
    if cmd.get("selftime"):  # time the probe's own code, hook by hook (selftime.py)
        from selftime import SelfTime

        st = SelfTime()
        st.patch()
    from reshape import Reshape

    try:
        from probe.engine import accel
    except Exception:  # a probe tree from before the accelerator (a baseline)
        accel = None

    from pycalls import PythonCalls

    # every call a compiled hook hands to Python (a C path not taken), by hook
    pycalls = PythonCalls() if cmd.get("count_python_calls") else None
    if pycalls is not None:
        pycalls.patch()
    reshape = Reshape(cmd.get("exclude", ()), bool(cmd.get("wrap_only")))
    if reshape.active:  # leave-one-out, or every body replaced by a plain span
        reshape.patch()
    # "python": the pure-Python wrappers
    hot = cmd.get("hot_path") or (accel.active() if accel is not None else "python")
    # "clock": the compiled hooks' clock for this variant (PROBE_CLOCK: auto, tsc,
    # boottime), read at every attach of the variant; the one in use is kept in the result
    clock_env = os.environ.get("PROBE_CLOCK")
    if cmd.get("clock"):
        os.environ["PROBE_CLOCK"] = str(cmd["clock"])
    if cmd.get("null"):  # the control: no hook at all, RT.enabled still switched per block
        hot, families = "none", ["none"]
    else:
        with accel.use(hot) if accel is not None else contextlib.nullcontext():
            hooks.install(families, lazy=False)
        hooks.enable(writer, gpu_timing=gpu_timing)
    if st is not None:
        st.time_ring(cmd.get("ring_stand_in"))
    # "crossover": blocks counted from each workload's start, and the on/off order flipped
    # from one workload to the next, so every on block has an off block at the same place
    # in the next workload (same context length, same KV-block boundaries): effects tied to
    # the position in a workload cancel, which a fixed on/off parity over the whole run
    # does not do (a control with no per-step hooks read +160/+335 us that way).
    crossover = cmd.get("design") == "crossover"
    # "off": "absent" (crossover only): the off blocks run with the probe detached as
    # `probe attach` leaves a process (hooks.detach: every wrapper gone but the always-on
    # resolve hook), the on blocks attached afresh (hooks.attach: install, enable, late
    # targets and snapshot at their first step); the switch itself is timed apart
    absent_off = crossover and cmd.get("off") == "absent" and not cmd.get("null")
    if absent_off and cmd.get("bare_timer"):
        raise ValueError("off=absent re-installs the hooks per block: no bare timer under it")
    # "on": "dormant" (with off=absent): the on blocks attach but leave RT.enabled off, so
    # each pair is dormant hooks against no hooks (the bypass's cost inside the engine)
    dormant_on = absent_off and cmd.get("on") == "dormant"
    # "touch" (with the hooks left in place): at every on/off switch, set a dummy attribute
    # on each class that holds a hook, as an attach or detach modifies those classes (and
    # invalidates what the interpreter specialized on them), without changing the hooks
    touch = crossover and not absent_off and bool(cmd.get("touch"))
    # "off": "reattach": the off blocks keep the hooks in place, dormant, and each on block
    # detaches and attaches afresh at its start (new wrappers, the classes written, late
    # targets and snapshot again): an attach's effects without the off blocks' absence
    reattach = crossover and cmd.get("off") == "reattach" and not cmd.get("null")
    if cmd.get("on") not in (None, "enabled") and not dormant_on:
        raise ValueError('"on": "dormant" needs a crossover with "off": "absent"')
    attached = {"now": True}
    parked = [0]  # the most hooks a detach left in place (Python 3.13+, TAG_BUDGET)

    def detach() -> None:
        hooks.detach()
        parked[0] = max(parked[0], len(getattr(hooks, "PARKED", ())))

    switches: list[tuple[int, int, int]] = []  # (on, step index, ns) per attach/detach
    block = int(cmd.get("block", 16))
    state = {"i": 0, "g": 0, "g0": 0}
    cur = {"g": 0, "b": 0, "on": 0}
    bare: list[tuple[int, ...]] = []  # (scheduled tokens, launch ns[, t0, g, b, on])
    unbare = (
        bare_timer(bare, (lambda: (cur["g"], cur["b"], cur["on"])) if crossover else None)
        if cmd.get("bare_timer")
        else None
    )
    every = int(cmd.get("sample_every", 1))  # "on" blocks record one step in `every`
    eng = llm.llm_engine
    orig = eng.step
    rows: list[tuple[int, int, int]] = []  # (block index, on, ns)
    xrows: list[tuple[int, int, int, int]] = []  # crossover: (workload, block, on, ns)

    def timed_step() -> Any:
        i = state["i"]
        state["i"] = i + 1
        if crossover:
            g, b = state["g"], (i - state["g0"]) // block
            on = (b + g) % 2 == 0
            cur["g"], cur["b"], cur["on"] = g, b, int(on)
            if st is not None and i == 2 * block:
                st.reset()
            if touch and on != attached["now"]:
                from probe.engine.hooks import INSTALLER

                for owner in {id(h.owner): h.owner for h in INSTALLER.hooks.values()}.values():
                    if isinstance(owner, type):
                        type.__setattr__(owner, "_probe_touch", i)
                attached["now"] = on
            if reattach and on and not attached["now"]:
                s0 = time.perf_counter_ns()
                detach()
                hooks.attach(writer, families=families, gpu_timing=gpu_timing)
                switches.append((1, i, time.perf_counter_ns() - s0))
            if reattach:
                attached["now"] = on
            if absent_off and on != attached["now"]:
                s0 = time.perf_counter_ns()
                if on:
                    hooks.attach(writer, families=families, gpu_timing=gpu_timing)
                else:
                    detach()
                switches.append((int(on), i, time.perf_counter_ns() - s0))
                attached["now"] = on
            RT.sampling, RT.sample_every = on and every > 1 and not dormant_on, every
            RT.enabled = on and not dormant_on
            t0 = time.perf_counter_ns()
            out = orig()
            xrows.append((g, b, int(on), time.perf_counter_ns() - t0))
            return out
        b = i // block
        on = b % 2 == 0
        if st is not None and i == 2 * block:  # leave out the first step's one-off work
            st.reset()
        RT.sampling, RT.sample_every = on and every > 1, every
        RT.enabled = on
        t0 = time.perf_counter_ns()
        out = orig()
        rows.append((b, int(on), time.perf_counter_ns() - t0))
        return out

    eng.step = timed_step
    starts: list[int] = []  # engine step index at which each workload began (its prefill)
    digests: list[str | None] = []  # each workload's greedy tokens (token_digest)
    b0 = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    try:
        for g in range(int(cmd.get("generates", 10))):
            starts.append(state["i"])
            state["g"], state["g0"] = g, state["i"]
            n = int(cmd.get("requests", 0)) or None  # default: the scenario's
            work = prompts(500 + g) if n is None else prompts(500 + g, n)
            outs = llm.generate(work, sp(cmd.get("out_len", 256)), use_tqdm=False)
            digests.append(token_digest(outs))
        # the clock the variant's attaches read (the finally may attach again afresh, on
        # the process's own setting: older runs labelled absent/tsc variants boottime)
        ran_clock = getattr(RT, "clock", "boottime")
    finally:
        del eng.step  # back to the class's method
        RT.enabled = RT.sampling = False
        if cmd.get("clock"):  # the next variant's attach reads the process's own setting
            if clock_env is None:
                os.environ.pop("PROBE_CLOCK", None)
            else:
                os.environ["PROBE_CLOCK"] = clock_env
        if absent_off and not attached["now"]:  # as the other designs leave it: installed
            hooks.attach(writer, families=families, gpu_timing=gpu_timing)
            RT.enabled = False
        if unbare is not None:
            unbare()
        if st is not None:
            st.unpatch()  # the next install builds plain wrappers again
        reshape.unpatch()
        if pycalls is not None:
            pycalls.unpatch()
    b1 = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    if crossover:
        from crossover import pair_costs

        xd = pair_costs(xrows, block)
        return {
            "design": "crossover",
            "off": "absent" if absent_off else "reattach" if reattach else "dormant",
            "on": "dormant" if dormant_on else "enabled",
            "touch": touch,
            "switches": switches if absent_off or reattach else None,
            # > 0: some off blocks meant to be absent had hooks dormant in place instead
            "parked_hooks": parked[0],
            "families": families or "all",
            "hot_path": hot,
            "clock": ran_clock,
            "window_boottime": [b0, b1],
            "gpu_timing": cmd.get("gpu_timing", True),
            "block": block,
            "steps": len(xrows),
            "generates": len(starts),
            "block_pairs": len(xd),
            "median_pair_diff_ns": statistics.median(xd) if xd else None,
            "mean_pair_diff_ns": statistics.fmean(xd) if xd else None,
            "median_on_ns": statistics.median(r[3] for r in xrows if r[2]) if xrows else None,
            "median_off_ns": statistics.median(r[3] for r in xrows if not r[2]) if xrows else None,
            "step_rows": xrows,
            "bare_rows": bare if unbare is not None else None,
            "dropped": getattr(writer, "dropped", None),
            "selftime": st.result(sum(r[2] for r in xrows) // max(1, every))
            if st is not None
            else None,
            "reshape": reshape.summary() if reshape.active else None,
            "python_calls": pycalls.result(sum(r[2] for r in xrows)) if pycalls else None,
            "workload": {"requests": cmd.get("requests"), "out_len": cmd.get("out_len", 256)},
            "token_digests": digests,
        }
    skip = prefill_blocks(starts, block, int(cmd.get("prefill_steps", PREFILL_STEPS)))
    diffs = block_costs(rows, block, exclude=skip)
    selftime = None
    if st is not None:
        on_after = sum(1 for b, o, _ns in rows if o and b >= 2)
        selftime = st.result(on_after // max(1, every))
    on_ns = [ns for _b, o, ns in rows if o]
    off_ns = [ns for _b, o, ns in rows if not o]
    return {
        "families": families or "all",
        "hot_path": hot,
        "clock": ran_clock,
        "window_boottime": [b0, b1],
        "sample_every": every,
        "requests": cmd.get("requests"),
        "gpu_timing": cmd.get("gpu_timing", True),
        "block": block,
        "steps": len(rows),
        "median_on_ns": statistics.median(on_ns) if on_ns else None,
        "median_off_ns": statistics.median(off_ns) if off_ns else None,
        "block_pairs": len(diffs),
        "median_pair_diff_ns": statistics.median(diffs) if diffs else None,
        "pair_diffs_ns": diffs,
        "pair_diffs_mean_ns": block_costs(rows, block, statistics.fmean, exclude=skip),
        "generate_starts": starts,
        "excluded_blocks": sorted(skip),
        "dropped": getattr(writer, "dropped", None),
        "selftime": selftime,
        "bare_launch": bare_summary(bare) if unbare is not None else None,
        "python_calls": pycalls.result(len(on_ns)) if pycalls is not None else None,
        "workload": {"requests": cmd.get("requests"), "out_len": cmd.get("out_len", 256)},
        "token_digests": digests,
    }


def bare_timer(rows: list[tuple[int, ...]], tag: Any = None) -> Any:
    """The CPU launch overhead of the probe's definition (step start to the end of the
    target's forward launch) measured by one plain timer pair, in the steps where the probe
    is off: the reference the probe's own recorded figure (its "on" steps) is held against.
    Wraps whatever is installed (the probe's dormant hooks); returns the undo.
    ``tag``: time every step, the probe's included, and append ``(t0, *tag())`` to each
    row (the crossover design compares both arms by position)."""
    import importlib

    from probe.engine.runtime import RT

    clock = time.clock_gettime_ns
    boot = time.CLOCK_BOOTTIME
    state = {"t0": 0, "n": 0, "open": False}
    placed: list[tuple[Any, str, Any]] = []
    exec_targets = [
        ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "execute_model"),
        ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "execute_model"),
    ]
    # MRV2's FULL launch ends where the probe's does: the replay the target's
    # ModelCudaGraphManager.run_fullgraph makes through super() (before its slicing)
    fwd_targets = [
        ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_model_forward"),
        ("vllm.v1.worker.gpu.cudagraph_utils", "CudaGraphManager", "run_fullgraph"),
    ]

    def place(cls: Any, name: str, wrapper: Any) -> None:
        placed.append((cls, name, vars(cls)[name]))
        setattr(cls, name, wrapper)

    def exec_wrap(inner: Any) -> Any:
        def execute_model(self: Any, so: Any, *a: Any, **k: Any) -> Any:
            if (RT.enabled and tag is None) or k.get("dummy_run") or k.get("is_profile"):
                return inner(self, so, *a, **k)
            state["t0"], state["n"], state["open"] = (
                clock(boot),
                so.total_num_scheduled_tokens,
                True,
            )
            try:
                return inner(self, so, *a, **k)
            finally:
                state["open"] = False

        return execute_model

    def fwd_wrap(inner: Any) -> Any:
        def forward(*a: Any, **k: Any) -> Any:
            if not state["open"] or (RT.enabled and tag is None):
                return inner(*a, **k)
            name = type(a[0]).__name__ if a else ""
            if name.endswith("CudaGraphManager") and name != "ModelCudaGraphManager":
                return inner(*a, **k)  # a speculator's replay, not the target's launch
            out = inner(*a, **k)
            if state["open"]:
                t0 = int(state["t0"])
                n = int(state["n"])
                rows.append(
                    (n, clock(boot) - t0) if tag is None else (n, clock(boot) - t0, t0, *tag())
                )
                state["open"] = False  # the first target launch of the step
            return out

        return forward

    for mod, cls_name, name in exec_targets:
        try:
            cls = getattr(importlib.import_module(mod), cls_name)
        except Exception:
            continue
        if name in vars(cls):
            place(cls, name, exec_wrap(vars(cls)[name]))
    for mod, cls_name, name in fwd_targets:
        try:
            cls = getattr(importlib.import_module(mod), cls_name)
        except Exception:
            continue
        if name in vars(cls):
            place(cls, name, fwd_wrap(vars(cls)[name]))

    def undo() -> None:
        for cls, name, orig in reversed(placed):
            setattr(cls, name, orig)

    return undo


def bare_summary(rows: list[tuple[int, int]]) -> dict[str, Any]:
    """Medians per scheduled-token count (decode steps share one), most common first."""
    by: dict[int, list[int]] = {}
    for n, ns in rows:
        by.setdefault(n, []).append(ns)
    out = []
    for n, v in sorted(by.items(), key=lambda kv: -len(kv[1]))[:4]:
        out.append({"num_tokens": n, "steps": len(v), "median_ns": statistics.median(v)})
    return {"steps": len(rows), "by_tokens": out}


PREFILL_STEPS = 8  # steps after a workload starts that may hold its prefill


def prefill_blocks(starts: list[int], block: int, steps: int = PREFILL_STEPS) -> set[int]:
    """Blocks holding the first ``steps`` steps of a workload. Each ``generate`` starts with
    prefill steps milliseconds longer than decode; with a fixed workload they fall on the
    same block parity every time (257 steps per generate: always an "on" block), which
    biases the comparison, by block means most of all. Pairs touching them are left out."""
    return {(s + i) // block for s in starts for i in range(steps)}


def block_costs(
    rows: list[tuple[int, int, int]],
    block: int,
    stat: Any = statistics.median,
    exclude: set[int] | frozenset[int] = frozenset(),
) -> list[float]:
    """Per "on" block (even index): its median step time minus the mean of the medians of
    the "off" blocks on both sides of it, so a trend within the run (longer contexts, a
    drifting clock) cancels. Only whole blocks count, and no pair with a block in
    ``exclude`` (:func:`prefill_blocks`). ``stat=statistics.fmean`` compares block means
    instead: what throughput sees when only some steps in a block pay (one step in N
    recorded), where the median reads the unrecorded majority."""
    med = {b: stat(v) for b, v in by_block_of(rows).items() if len(v) == block}
    return [
        med[b] - (med[b - 1] + med[b + 1]) / 2
        for b in sorted(med)
        if b % 2 == 0
        and b - 1 in med
        and b + 1 in med
        and not exclude.intersection((b - 1, b, b + 1))
    ]


def by_block_of(rows: list[tuple[int, int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for b, _on, ns in rows:
        out.setdefault(b, []).append(ns)
    return out


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(TAG + json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


# -- coordinator side ----------------------------------------------------------------------


def parse_cpus(spec: str | None) -> set[int] | None:
    """``"0-7,16"`` -> {0..7, 16}; None or "" -> None (no pinning)."""
    if not spec:
        return None
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def pin(cpus: set[int] | None) -> Any:
    """A ``preexec_fn`` that pins the child (and the threads it starts) to ``cpus``."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def reader_alive(label: str, reader: subprocess.Popen[Any]) -> None:
    """Raise if the engine's reader (``probe collect``) has already exited: its rings
    would fill and drop unread, so every variant would run without a reader and its
    recording would stay empty (a ``--out`` left from an earlier run of the same name
    once did exactly that, unnoticed until the recordings came back)."""
    rc = reader.poll()
    if rc is not None:
        raise RuntimeError(f"{label}: the reader (probe collect) exited with rc={rc}; see its log")


class Engine:
    """One engine process plus its ``probe collect`` reader process."""

    def __init__(
        self,
        scenario: str,
        out: Path,
        label: str,
        cpus: set[int] | None = None,
        reader_cpus: set[int] | None = None,
        main_cpu: int | None = None,
    ) -> None:
        self.label = label
        self.run_dir = out / f"rings-{label}"
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.run_dir, 0o700)
        self.log = open(out / f"engine-{label}.log", "w")  # noqa: SIM115
        env = dict(os.environ)
        # HARNESS_PROBE_PATH: another copy of the probe (e.g. an older commit, for a
        # before/after on the same machine at the same time) ahead of this tree's
        first = [p for p in (os.environ.get("HARNESS_PROBE_PATH"), str(REPO)) if p]
        env["PYTHONPATH"] = ":".join([*first, env.get("PYTHONPATH", "")])
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "engine",
                "--scenario",
                scenario,
                "--run-dir",
                str(self.run_dir),
                *([] if main_cpu is None else ["--main-cpu", str(main_cpu)]),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
            preexec_fn=pin(cpus),
        )
        self.recording = out / f"{label}.probe.db"
        self.reader = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "probe",
                "collect",
                "--run-dir",
                str(self.run_dir),
                "--out",
                str(self.recording),
            ],
            env=env,
            stderr=self.log,
            preexec_fn=pin(reader_cpus),
        )
        self.ready = self.expect("ready")
        reader_alive(self.label, self.reader)

    def expect(self, op: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.startswith(TAG):
                continue
            msg = json.loads(line[len(TAG) :])
            if msg["op"] == "error":
                raise RuntimeError(f"{self.label}: {msg['error']}")
            if msg["op"] == op:
                return dict(msg)
        raise RuntimeError(f"{self.label}: engine exited (rc={self.proc.wait()}); see its log")

    def run(self, **cmd: Any) -> dict[str, Any]:
        """One repetition. ``probe="attached_paused"``: attached, with the reader process
        stopped (SIGSTOP) for the repetition, so the reader's own CPU time cannot compete
        with the engine; the ring holds the records until it resumes."""
        paused = cmd.get("probe") == "attached_paused"
        if paused:
            cmd["probe"] = "attached"
        res = self.request("run", cmd, pause_reader=paused)
        if paused:
            res["probe"] = "attached_paused"
        return res

    def request(self, op: str, cmd: dict[str, Any], pause_reader: bool = False) -> dict[str, Any]:
        """Send one command and wait for its result; ``pause_reader``: the reader process
        stopped (SIGSTOP) meanwhile, so its CPU cannot compete with the engine (the ring
        holds the records until it resumes)."""
        from benchmarks._proc import Tracer, placement, steal, steal_between

        assert self.proc.stdin is not None
        if pause_reader:
            self.reader.send_signal(signal.SIGSTOP)
        # where the engine's main thread (vLLM's step loop, in-process) ran meanwhile, and
        # what the host took from those CPUs (a virtual machine's steal time)
        tracer = Tracer(self.proc.pid, every=0.01)
        stolen = steal()
        try:
            self.proc.stdin.write(json.dumps({"op": op, **cmd}) + "\n")
            self.proc.stdin.flush()
            res = self.expect("result")
            row = placement(tracer.stop())
            seen = [int(c) for c in row.get("cpus", {})]  # type: ignore[union-attr]
            row["steal_s"] = steal_between(stolen, steal(), seen)
            res["main_thread"] = row
            return res
        finally:
            tracer.stop()
            if pause_reader:
                self.reader.send_signal(signal.SIGCONT)

    def close(self) -> None:
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
        except Exception:
            self.proc.kill()
        try:
            self.reader.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.reader.terminate()
        self.log.close()


def spread(xs: list[float]) -> dict[str, Any]:
    return {
        "n": len(xs),
        "median": statistics.median(xs) if xs else None,
        "min": min(xs) if xs else None,
        "max": max(xs) if xs else None,
        "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "values": xs,
    }


def out_of_time(deadline: float, started: float, done: int) -> bool:
    """True when another repetition (as long as the mean one so far) would pass the deadline."""
    if done == 0:
        return False
    return time.time() + (time.time() - started) / done + 20 > deadline


def run_ab(a: Engine, b: Engine, reps: int, deadline: float = float("inf")) -> dict[str, Any]:
    """Both arms' engines up at once, their repetitions interleaved (A B, B A, ...)."""
    results: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    started = time.time()
    for i in range(reps):
        if out_of_time(deadline, started, i):
            log(f"ab: stopping after {i} repetitions (deadline)")
            break
        order = (("A", a), ("B", b)) if i % 2 == 0 else (("B", b), ("A", a))
        for arm, eng in order:
            r = eng.run(rep=i, probe="attached", seed=100 + i)
            results[arm].append(r)
            log(f"ab rep {i} {arm} {eng.label}: {r['tok_s']:.0f} tok/s")
    return ab_result(a, b, results)


def run_ab_sequential(
    start: Any, names: tuple[str, str], reps: int, deadline: float = float("inf")
) -> dict[str, Any]:
    """One arm's engine at a time (A's repetitions, then B's), for a model whose two
    engines do not fit the GPU together. ``start(name)`` starts an engine; each is closed
    after its repetitions, its recording complete."""
    results: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    engines = []
    for arm, name in zip(("A", "B"), names, strict=True):
        eng = start(name)
        started = time.time()
        for i in range(reps):
            if out_of_time(deadline, started, i):
                log(f"ab: {arm} stopping after {i} repetitions (deadline)")
                break
            r = eng.run(rep=i, probe="attached", seed=100 + i)
            results[arm].append(r)
            log(f"ab rep {i} {arm} {eng.label}: {r['tok_s']:.0f} tok/s")
        eng.close()
        engines.append(eng)
    return ab_result(engines[0], engines[1], results)


def ab_result(a: Engine, b: Engine, results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    ta = [r["tok_s"] for r in results["A"]]
    tb = [r["tok_s"] for r in results["B"]]
    arms = {}
    for arm, eng in (("A", a), ("B", b)):
        rs = results[arm]
        arms[arm] = {
            "scenario": eng.ready["scenario"],
            "tok_s": spread([r["tok_s"] for r in rs]),
            "init_s": eng.ready["init_s"],
            "recording": eng.recording.name,
            # each repetition's window on CLOCK_BOOTTIME, its wall time and output tokens:
            # split_reps.py cuts the recording into one recording a repetition by these
            "windows": [r["boottime"] for r in rs],
            "elapsed_s": [r["elapsed_s"] for r in rs],
            "out_tokens": [r["out_tokens"] for r in rs],
            "tokens_sha": [r["tokens_sha"] for r in rs],
        }
    return {
        **arms,
        "ratio_B_over_A": statistics.median(tb) / statistics.median(ta) if ta and tb else None,
        "snapshots": {"A": a.ready.get("snapshot"), "B": b.ready.get("snapshot")},
        "paired_ratios": [y / x for x, y in zip(ta, tb, strict=False)],
    }


def williams_order(modes: list[str], i: int) -> list[str]:
    """Repetition ``i``'s order of ``modes``: a Williams square (0, 1, n-1, 2, n-2, ...
    shifted by ``i``), so that over n repetitions (2n for odd n) each mode follows every
    other equally often. A plain rotation keeps one neighbour for good (with four modes,
    attached always ran right after the profiler), so a mode's after-effects land on one
    mode."""
    n = len(modes)
    first = [0]
    lo, hi = 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    row = [(k + i) % n for k in first]
    if n % 2 and (i // n) % 2:
        row.reverse()
    return [modes[k] for k in row]


def run_overhead(
    eng: Engine,
    reps: int,
    out: Path,
    modes: list[str] | None = None,
    deadline: float = float("inf"),
) -> dict[str, Any]:
    modes = modes or ["attached", "detached", "absent", "profiler"]
    res: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    started = time.time()
    for i in range(reps):
        if out_of_time(deadline, started, i):
            log(f"overhead: stopping after {i} repetitions (deadline)")
            break
        for m in williams_order(modes, i):
            r = eng.run(rep=i, probe=m, seed=200 + i)
            res[m].append(r)
            log(f"overhead rep {i} {m}: {r['tok_s']:.0f} tok/s sha {r['tokens_sha']}")
    base = statistics.median(x["tok_s"] for x in res["absent"])
    shas = {m: sorted({x["tokens_sha"] for x in rs}) for m, rs in res.items()}
    by_seed: dict[int, set[str]] = {}
    for rs in res.values():
        for x in rs:
            by_seed.setdefault(int(x["rep"]), set()).add(x["tokens_sha"])
    return {
        "modes": {
            m: {
                "tok_s": spread([x["tok_s"] for x in rs]),
                "ratio_to_absent": statistics.median(x["tok_s"] for x in rs) / base,
                "paired_ratio_to_absent": [
                    x["tok_s"] / y["tok_s"] for x, y in zip(rs, res["absent"], strict=False)
                ],
                "windows": [x.get("boottime") for x in rs],  # for benchmarks/gpu/regimes.py
                # the engine's main thread per repetition: how often it changed CPU
                "main_thread_migrations": [
                    (x.get("main_thread") or {}).get("migrations") for x in rs
                ],
                # and its wall, CPU, run-queue wait and the steal time of its CPUs (s)
                "main_thread_times": [
                    {
                        k: (x.get("main_thread") or {}).get(k)
                        for k in ("wall_s", "cpu_s", "runq_s", "steal_s")
                    }
                    for x in rs
                ],
            }
            for m, rs in res.items()
        },
        "token_identity": all(len(v) == 1 for v in by_seed.values()),
        "tokens_sha_by_mode": shas,
        "dropped": res["attached"][-1].get("dropped"),
    }


def run_groundtruth(eng: Engine, out: Path) -> dict[str, Any]:
    trace = out / "groundtruth.trace.json"
    r = eng.run(
        rep="gt",
        probe="groundtruth",
        seed=300,
        requests=16,
        out_len=24,
        prompt_len=256,
        trace=str(trace),
        reinstall=True,
    )
    return {"window_boottime": r["boottime"], "trace": trace.name, "tok_s": r["tok_s"]}


EXPERIMENT_KEYS = {
    "overhead": {"reps", "modes", "groundtruth", "budget_s"},
    "stepwise": {"variants", "variant_s", "budget_s"},
    "groundtruth": {"budget_s"},
    "record": {"reps", "run", "budget_s"},
    "ab": {"a", "b", "reps", "budget_s", "sequential"},
}
VARIANT_KEYS = {
    "design", "block", "bare_timer", "generates", "null", "gpu_timing", "exclude",
    "wrap_only", "pause_reader", "families", "hot_path", "prefill_steps", "sample_every",
    "selftime", "ring_stand_in", "return_tokens", "out_len", "requests", "off", "on",
    "touch", "count_python_calls", "clock",
}  # fmt: skip
MODES = {"attached", "detached", "absent", "profiler", "groundtruth", "attached_paused"}


def check_plan(plan: Any) -> list[str]:
    """What is wrong with a plan, before any device time is spent on it: unknown kinds,
    keys (a typo would silently run the default), scenarios and probe modes."""
    if not isinstance(plan, dict) or not isinstance(plan.get("experiments"), list):
        return ['a plan is {"experiments": [...]}']
    problems = []
    scenarios = {p.stem for p in (HERE / "scenarios").glob("*.json")}
    for i, exp in enumerate(plan["experiments"]):
        where = f"experiment {i}"
        kind = exp.get("kind") if isinstance(exp, dict) else None
        if kind not in EXPERIMENT_KEYS:
            problems.append(f"{where}: unknown kind {kind!r}")
            continue
        extra = set(exp) - EXPERIMENT_KEYS[kind] - {"kind", "scenario", "close_after"}
        problems += [f"{where} ({kind}): unknown key {k!r}" for k in sorted(extra)]
        names = [exp.get("scenario"), exp.get("a"), exp.get("b"), *exp.get("close_after", [])]
        for name in names:
            if name is not None and name not in scenarios:
                problems.append(f"{where}: no scenario {name!r} in benchmarks/gpu/scenarios")
        if kind != "ab" and "scenario" not in exp:
            problems.append(f"{where} ({kind}): no scenario")
        for m in exp.get("modes") or []:
            if m not in MODES and not str(m).startswith("attached_s"):
                problems.append(f"{where}: unknown probe mode {m!r}")
        for j, v in enumerate(exp.get("variants") or []):
            bad = sorted(set(v) - VARIANT_KEYS) if isinstance(v, dict) else ["(not an object)"]
            problems += [f"{where} variant {j}: unknown key {k!r}" for k in bad]
    return problems


def suite(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = json.loads(Path(args.plan).read_text()) if args.plan else {}
    problems = check_plan(plan) if args.plan else []
    if problems:
        raise SystemExit(f"harness: {args.plan}: " + "; ".join(problems))
    deadline = float(args.deadline) if args.deadline else time.time() + 1e9
    from benchmarks._proc import siblings

    summary: dict[str, Any] = {
        "started": time.time(),
        "machine": {
            "cpu_siblings": {str(c): v for c, v in siblings().items()},
            "cpus": args.cpus,
            "reader_cpus": args.reader_cpus,
            "main_cpu": args.main_cpu,
        },
        "experiments": [],
    }
    sfile = out / "results.json"

    def save() -> None:
        sfile.write_text(json.dumps(summary, indent=1, default=str))

    engines: dict[str, Engine] = {}

    def engine(name: str) -> Engine:
        if name not in engines:
            log(f"starting engine {name}")
            engines[name] = Engine(
                name,
                out,
                name,
                parse_cpus(args.cpus),
                parse_cpus(args.reader_cpus),
                None if args.main_cpu is None else int(args.main_cpu),
            )
            r = engines[name].ready
            log(f"engine {name} ready in {r['init_s']:.0f}s (probe from {r.get('probe_path')})")
            if r.get("main_thread_pin") is not None:
                summary["machine"].setdefault("main_thread_pin", {})[name] = r["main_thread_pin"]
                log(f"engine {name} main thread: {r['main_thread_pin']}")
        return engines[name]

    for exp in plan.get("experiments", []):
        if time.time() + exp.get("budget_s", 120) > deadline:
            summary["experiments"].append({**exp, "skipped": "deadline"})
            save()
            continue
        try:
            if exp["kind"] == "overhead":
                e = engine(exp["scenario"])
                res = run_overhead(e, exp.get("reps", 5), out, exp.get("modes"), deadline)
                if exp.get("groundtruth"):
                    res["groundtruth"] = run_groundtruth(e, out)
                res["snapshot"] = e.ready.get("snapshot")
            elif exp["kind"] == "stepwise":
                e = engine(exp["scenario"])
                res = {"runs": [], "probe_path": e.ready.get("probe_path")}
                for variant in exp.get("variants", [{}]):
                    if time.time() + exp.get("variant_s", 30) > deadline:
                        break
                    paused = bool(variant.get("pause_reader"))
                    r = e.request("stepwise", variant, pause_reader=paused)
                    r["pause_reader"] = paused
                    res["runs"].append(r)
                    log(
                        f"stepwise {r['families']} {r['hot_path']} paused={paused} "
                        f"exclude={variant.get('exclude', [])} "
                        f"wrap_only={bool(variant.get('wrap_only'))} "
                        f"gpu_timing={r['gpu_timing']}: "
                        f"{r['steps']} steps, median on-off per block pair "
                        f"{(r['median_pair_diff_ns'] or 0) / 1e3:.1f} us, "
                        f"step median {(r['median_off_ns'] or 0) / 1e3:.0f} us"
                    )
                    save()
            elif exp["kind"] == "groundtruth":  # one profiled window (Kineto + stacks)
                e = engine(exp["scenario"])
                res = {"groundtruth": run_groundtruth(e, out), "recording": e.recording.name}
                res["snapshot"] = e.ready.get("snapshot")
            elif exp["kind"] == "record":  # attached repetitions: a recording to read back
                e = engine(exp["scenario"])
                runs = [
                    e.run(
                        rep=i,
                        probe="attached",
                        seed=700 + i,
                        reinstall=i == 0,
                        **exp.get("run", {}),
                    )
                    for i in range(int(exp.get("reps", 1)))
                ]
                res = {"runs": runs, "recording": e.recording.name}
            elif exp["kind"] == "ab" and exp.get("sequential"):
                res = run_ab_sequential(
                    lambda name: (engine(name), engines.pop(name))[1],
                    (exp["a"], exp["b"]),
                    exp.get("reps", 5),
                    deadline,
                )
            elif exp["kind"] == "ab":
                res = run_ab(engine(exp["a"]), engine(exp["b"]), exp.get("reps", 5), deadline)
            else:
                raise ValueError(f"unknown experiment kind {exp['kind']}")
            summary["experiments"].append({**exp, "result": res})
        except Exception:
            summary["experiments"].append({**exp, "error": traceback.format_exc()[-3000:]})
            log("experiment failed:", traceback.format_exc()[-1500:])
        save()
        for name in exp.get("close_after", []):
            if name in engines:
                engines.pop(name).close()
    for e in engines.values():
        e.close()
    summary["ended"] = time.time()
    save()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("engine")
    e.add_argument("--scenario", required=True)
    e.add_argument("--run-dir", required=True)
    e.add_argument("--main-cpu", type=int)
    s = sub.add_parser("suite")
    s.add_argument("--plan", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--deadline")
    s.add_argument("--cpus", help="pin the engine processes to these CPUs, e.g. 0-7")
    s.add_argument("--reader-cpus", help="pin the probe's reader processes, e.g. 8-9")
    s.add_argument(
        "--main-cpu",
        type=int,
        help="after start-up, the engine's main thread alone on this CPU and its other "
        "threads off this CPU's core (benchmarks._proc.pin_main_thread)",
    )
    args = ap.parse_args()
    if args.cmd == "engine":
        engine_main(args)
    else:
        suite(args)


if __name__ == "__main__":
    main()
