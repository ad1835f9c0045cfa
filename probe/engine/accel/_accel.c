/*
 * probe.engine.accel._accel: the compiled hot path of vllm-graph-probe.
 *
 * Everything here runs inside vLLM, on the thread whose host time the probe measures, and
 * always with the GIL held (so no lock is needed: a call is atomic with respect to the
 * other Python threads of the process). It does the per-call work and nothing else:
 *
 *   Core      base type of probe.engine.runtime.Runtime: the hot state (enabled, step, in_step,
 *             drafter, ...) as C fields, read by the wrappers below without a lookup.
 *   Ring      the writer side of one shared-memory ring (layout in probe/ring.py): commits
 *             records with one release store of the write index per batch, counts drops,
 *             and holds the step buffer (records staged while inside an engine step go to
 *             the ring in one copy when the step's outermost hook returns).
 *   Packer    one record kind's positional packer (layout handed in by probe.records from
 *             the declaration), staging into a Ring.
 *   Span      a whole phase-span hook: bypass when off, CLOCK_BOOTTIME first and last thing
 *             around the original, one SPAN record staged. Vectorcall; a method descriptor.
 *   Gate      the dormant path of a Python hook: when the probe is off, calls the original
 *             directly; when on, calls the Python hook.
 *
 * The rooms are in _accel_ring.h (Ring, Packer), _accel_wrap.h (Span, Gate, Step,
 * Dispatch), _accel_build.h (Build), _accel_phase.h (Reorder, Phase) and _accel_fwd.h
 * (Forward, Replay), included below into this one translation unit.
 *
 * A wrapper never swallows or changes vLLM's result or exception; no function here raises
 * on the hot path except for arguments that cannot be packed (the calling Python hook
 * catches that and disables itself). Pure-Python equivalents: probe/engine/accel/__init__.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "_accel_gen.h" /* generated from probe/records.py: python -m probe.engine.gen_header */

#define STAGE_N 256

static inline int64_t kernel_boottime(void) {
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The hooks' clock. "boottime": clock_gettime(CLOCK_BOOTTIME) every time (the vDSO: its
   code page and its data page, both cold after a stretch of vLLM's code). "tsc" (x86-64,
   where the kernel's own clocksource is the TSC): the time stamp counter, carried to
   BOOTTIME ns from an anchor pair (the kernel's clock read beside two counter reads) with
   a rate measured over the whole time since the first anchor; an anchor older than
   CLK_STALE ticks is taken again (one kernel read), so the carried time is never further
   from the kernel's than the rate's error over that window (well under a microsecond), and
   a reading never goes back (a span never ends before it starts). One cache line of
   state, which the hooks touch anyway. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <x86intrin.h>
#define CLK_HAVE_TSC 1
#else
#define CLK_HAVE_TSC 0
#endif

static struct {
    int use_tsc;
    uint64_t tsc0, stale; /* the anchor; its age limit, ticks */
    int64_t ns0, last;    /* BOOTTIME at the anchor; the latest reading returned */
    uint64_t mult;        /* ns per tick << 32 */
    uint64_t first_tsc;   /* the first anchor: the rate's baseline */
    int64_t first_ns;
    uint64_t anchors;
} __attribute__((aligned(64))) clk;

#if CLK_HAVE_TSC
/* An anchor: the kernel's BOOTTIME between two counter reads, the pair with the narrowest
   bracket of three. */
static void clk_anchor(void) {
    uint64_t best = UINT64_MAX, tsc = 0;
    int64_t ns = 0;
    for (int i = 0; i < 3; i++) {
        uint64_t a = __rdtsc();
        int64_t k = kernel_boottime();
        uint64_t b = __rdtsc();
        if (b - a < best) {
            best = b - a;
            tsc = a + (b - a) / 2;
            ns = k;
        }
    }
    if (clk.anchors && tsc > clk.first_tsc + (clk.stale << 2) && ns > clk.first_ns)
        clk.mult = (uint64_t)((((unsigned __int128)(uint64_t)(ns - clk.first_ns)) << 32) /
                              (tsc - clk.first_tsc));
    clk.tsc0 = tsc;
    clk.ns0 = ns;
    clk.anchors++;
}
#endif

#if CLK_HAVE_TSC
static inline int64_t tsc_boottime(void) {
    uint64_t d = __rdtsc() - clk.tsc0;
    if (__builtin_expect(d > clk.stale, 0)) {
        clk_anchor();
        d = __rdtsc() - clk.tsc0;
    }
    int64_t t = clk.ns0 + (int64_t)(((unsigned __int128)d * clk.mult) >> 32);
    if (t < clk.last) t = clk.last;
    clk.last = t;
    return t;
}
#endif

/* The module's boottime_ns(): the clock set_clock chose. */
static inline int64_t boottime(void) {
#if CLK_HAVE_TSC
    if (clk.use_tsc) return tsc_boottime();
#endif
    return kernel_boottime();
}

/* ---------------------------------------------------------------------------------- */
/* Core                                                                               */
/* ---------------------------------------------------------------------------------- */

struct RingObject;

typedef struct {
    PyObject_HEAD
    int enabled;
    int in_step;
    int clock_tsc; /* the hooks read the TSC clock (set at attach where set_clock took it) */
    int drafter;
    int in_build;
    int sampling;
    int gpu_timing;
    long long step;
    long long sample_every;
    long long sample_n;
    long long timer_every; /* >0: the GPU timer samples 1 step in N (RT.timer_tick) */
    /* the runner's dispatch phase and the decision made inside it (_accel_phase.h) */
    int phase_open, decided;
    long long phase_num_reqs, phase_max_q, dec_mode, dec_reason, dec_flags, dec_num_tokens,
        dec_padded_tokens, dec_num_reqs, dec_padded_reqs, dec_max_q, dec_uq;
    struct RingObject *ring; /* strong; the ring the packers and spans stage into */
    int tee; /* probe.engine.markers tees RT.put: hooks of teed kinds write through it (direct_ring) */
    struct { /* the open target forward launch (_accel_fwd.h) */
        int open;
        long long mode, tokens, full, pieces, captures, passes, t0, t1;
    } fwd;
} CoreObject;

/* A hook's timestamp: switched on the Core, whose first line the hook has read already
   (``enabled``), so the default clock costs no memory beyond clock_gettime's own. */
static inline int64_t now_ns(CoreObject *c) {
#if CLK_HAVE_TSC
    if (c->clock_tsc) return tsc_boottime();
#endif
    (void)c;
    return kernel_boottime();
}

static PyTypeObject CoreType;

static PyMemberDef core_members[] = {
    {"enabled", T_INT, offsetof(CoreObject, enabled), 0, "records are written"},
    {"in_step", T_INT, offsetof(CoreObject, in_step), 0, ">0 inside execute_model/sample_tokens"},
    {"clock_tsc", T_INT, offsetof(CoreObject, clock_tsc), 0, "the hooks read the TSC clock"},
    {"drafter", T_INT, offsetof(CoreObject, drafter), 0, ">0 inside the MTP drafter"},
    {"in_build", T_INT, offsetof(CoreObject, in_build), 0, "inside a metadata build"},
    {"sampling", T_INT, offsetof(CoreObject, sampling), 0, "attached with sample_every > 1"},
    {"gpu_timing", T_INT, offsetof(CoreObject, gpu_timing), 0, "device events on"},
    {"step", T_LONGLONG, offsetof(CoreObject, step), 0, "the current step number"},
    {"sample_every", T_LONGLONG, offsetof(CoreObject, sample_every), 0, "record 1 step in N"},
    {"sample_n", T_LONGLONG, offsetof(CoreObject, sample_n), 0, "steps seen while sampling"},
    {"timer_every", T_LONGLONG, offsetof(CoreObject, timer_every), 0,
     "GPU timer period in steps (0: no timer)"},
#define PHASE_LL(name, doc) {#name, T_LONGLONG, offsetof(CoreObject, name), 0, doc}
    {"phase_open", T_INT, offsetof(CoreObject, phase_open), 0, "inside the runner's dispatch phase"},
    {"decided", T_INT, offsetof(CoreObject, decided), 0, "a dispatch decision waits for it"},
    PHASE_LL(phase_num_reqs, "V1 runner: real requests"),
    PHASE_LL(phase_max_q, "V1 runner: the longest query"),
    PHASE_LL(dec_mode, "decision: mode"), PHASE_LL(dec_reason, "decision: reason"),
    PHASE_LL(dec_flags, "decision: flags"), PHASE_LL(dec_num_tokens, "decision: tokens"),
    PHASE_LL(dec_padded_tokens, "decision: padded tokens"),
    PHASE_LL(dec_num_reqs, "decision: requests"),
    PHASE_LL(dec_padded_reqs, "decision: padded requests"),
    PHASE_LL(dec_max_q, "decision: max_query_len"),
    PHASE_LL(dec_uq, "decision: uniform_decode_query_len"),
#undef PHASE_LL
    {"tee", T_INT, offsetof(CoreObject, tee), 0, "probe.engine.markers tees RT.put"},
#define FWD_MEMBER(name, type, field, doc) {name, type, offsetof(CoreObject, fwd.field), 0, doc},
    FWD_MEMBER("fwd_open", T_INT, open, ">0 while a target forward launch is open")
    FWD_MEMBER("fwd_mode", T_LONGLONG, mode, "its last replay's mode")
    FWD_MEMBER("fwd_tokens", T_LONGLONG, tokens, "its last replay's num_tokens")
    FWD_MEMBER("fwd_full", T_LONGLONG, full, "its FULL replays")
    FWD_MEMBER("fwd_pieces", T_LONGLONG, pieces, "its PIECEWISE piece replays")
    FWD_MEMBER("fwd_captures", T_LONGLONG, captures, "its captures")
    FWD_MEMBER("fwd_passes", T_LONGLONG, passes, "its calls into run_pw_graph")
    FWD_MEMBER("fwd_t0", T_LONGLONG, t0, "its first replay's start (0: none)")
    FWD_MEMBER("fwd_t1", T_LONGLONG, t1, "its last replay's end")
#undef FWD_MEMBER
    {NULL}};

#include "_accel_ring.h"  /* Ring, Packer */
#include "_accel_wrap.h"  /* Span, Gate, Step, Dispatch */
#include "_accel_build.h" /* Build */
#include "_accel_phase.h" /* Reorder, Phase */
#include "_accel_fwd.h"   /* Forward, Replay */

/* ---------------------------------------------------------------------------------- */
/* Core type                                                                          */
/* ---------------------------------------------------------------------------------- */

static void core_dealloc(CoreObject *self) {
    if (self->ring != NULL) {
        RingObject *r = self->ring;
        self->ring = NULL;
        r->core = NULL;
        Py_DECREF(r);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *core_ring(CoreObject *self, void *Py_UNUSED(x)) {
    if (self->ring == NULL) Py_RETURN_NONE;
    Py_INCREF(self->ring);
    return (PyObject *)self->ring;
}

static PyGetSetDef core_getset[] = {
    {"bound_ring", (getter)core_ring, NULL, "the compiled Ring staging this Core's records",
     NULL},
    {NULL}};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "probe.engine.accel._accel.Core",
    .tp_basicsize = sizeof(CoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The probe's hot state in C (base of probe.engine.runtime.Runtime).",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_members = core_members,
    .tp_getset = core_getset,
};

/* ---------------------------------------------------------------------------------- */
/* module                                                                             */
/* ---------------------------------------------------------------------------------- */

static PyObject *m_boottime_ns(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(x)) {
    return PyLong_FromLongLong(boottime());
}

/* set_clock("tsc" | "boottime") -> the clock now in use. "tsc" is taken only on x86-64;
   the caller checks that the kernel's clocksource is the TSC (probe/engine/accel/__init__.py). */
static PyObject *m_set_clock(PyObject *Py_UNUSED(m), PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL) return NULL;
    if (strcmp(name, "boottime") == 0) {
        clk.use_tsc = 0;
    } else if (strcmp(name, "tsc") == 0) {
#if CLK_HAVE_TSC
        if (!clk.use_tsc && clk.mult != 0) {
            /* measured before in this process: a fresh anchor, the rate kept */
            clk_anchor();
            clk.use_tsc = 1;
        } else if (!clk.use_tsc) {
            /* the first rate: over 2 ms of the kernel's clock */
            clk.anchors = 0;
            clk_anchor();
            uint64_t t0 = clk.tsc0;
            int64_t n0 = clk.ns0;
            while (kernel_boottime() - n0 < 2000000) {
            }
            clk_anchor();
            clk.first_tsc = t0;
            clk.first_ns = n0;
            clk.mult = (uint64_t)((((unsigned __int128)(uint64_t)(clk.ns0 - n0)) << 32) /
                                  (clk.tsc0 - t0));
            /* 10 ms of ticks: at most 1 µs of drift even at a rate 100 ppm off */
            clk.stale = (uint64_t)((((unsigned __int128)10000000) << 32) / clk.mult);
            clk.last = 0;
            clk.use_tsc = 1;
        }
#endif
    } else {
        PyErr_Format(PyExc_ValueError, "unknown clock %R (tsc, boottime)", arg);
        return NULL;
    }
    return PyUnicode_FromString(clk.use_tsc ? "tsc" : "boottime");
}

/* The raw time stamp counter (0 where there is none): a timer for benchmarks that touches
   no memory, so it warms neither the vDSO nor the hooks' clock state before what it times. */
static PyObject *m_ticks(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(x)) {
#if CLK_HAVE_TSC
    return PyLong_FromUnsignedLongLong(__rdtsc());
#else
    return PyLong_FromLong(0);
#endif
}

static PyObject *m_clock_is_tsc(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(x)) {
    return PyBool_FromLong(clk.use_tsc);
}

static PyMethodDef module_methods[] = {
    {"clock_is_tsc", m_clock_is_tsc, METH_NOARGS, "whether the hooks' clock is the TSC"},
    {"ticks", m_ticks, METH_NOARGS, "the raw time stamp counter (0 where there is none)"},
    {"boottime_ns", m_boottime_ns, METH_NOARGS, "CLOCK_BOOTTIME in ns (the hooks' clock)"},
    {"set_clock", m_set_clock, METH_O, "set_clock('tsc' | 'boottime') -> the clock in use"},
    {NULL}};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "probe.engine.accel._accel",
    "The compiled hot path of vllm-graph-probe (see probe/engine/accel/__init__.py).", -1, module_methods};

PyMODINIT_FUNC PyInit__accel(void) {
#define INTERN(var, text)                                                                      \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL;
    INTERN(S_total, "total_num_scheduled_tokens");
    INTERN(S_num_sched, "num_scheduled_tokens");
    INTERN(S_new_reqs, "scheduled_new_reqs");
    INTERN(S_on_first_step, "on_first_step");
    INTERN(S_num_reqs, ARG_NUM_REQS);
    INTERN(S_num_tokens, ARG_NUM_TOKENS);
    INTERN(S_cg_mode, "cg_mode");
    INTERN(S_uniform_decode, ARG_UNIFORM_DECODE);
    INTERN(S_udql, "uniform_decode_query_len");
    INTERN(S_dql, "decode_query_len");
    INTERN(S_uniform_token_count, ARG_UNIFORM_TOKEN_COUNT);
    INTERN(S_max_query_len, ARG_MAX_QUERY_LEN);
    INTERN(S_dummy_run, "dummy_run");
    INTERN(S_is_profile, "is_profile");
    INTERN(S_timer_tick, "timer_tick");
    INTERN(S_graph_ctx, "graph_ctx");
    INTERN(S_keys_init, "keys_initialized");
    INTERN(S_cudagraph_mode, "cudagraph_mode");
    INTERN(S_cam, "common_attn_metadata");
    INTERN(S_nat, "num_actual_tokens");
    INTERN(S_rbt, "reorder_batch_threshold");
    INTERN(S_dth, "decode_threshold");
    INTERN(S_nd, "num_decodes");
    INTERN(S_np, "num_prefills");
    INTERN(S_ndt, "num_decode_tokens");
    INTERN(S_npt, "num_prefill_tokens");
    INTERN(S_put, "put");
    INTERN(S_build, "build");
    INTERN(S_intern, "intern");
    INTERN(S_name, "__name__");
    if (phase_init() < 0) return NULL;
    if (fwd_intern() < 0) return NULL;
    PyTypeObject *types[] = {&CoreType,    &RingType,  &PackerType,  &SpanType,   &GateType,
                             &StepType,    &DispatchType, &BuildType, &ReorderType, &PhaseType,
                             &ForwardType, &ReplayType};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (PyType_Ready(types[i]) < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (m == NULL) return NULL;
    const char *names[] = {"Core", "Ring",     "Packer", "Span",    "Gate",
                           "Step", "Dispatch", "Build",  "Reorder", "Phase", "Forward", "Replay"};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0) return NULL;
    }
    PyModule_AddIntConstant(m, "RECORD_SIZE", REC);
    PyModule_AddIntConstant(m, "HEADER_SIZE", HEADER);
    PyModule_AddIntConstant(m, "STAGE_RECORDS", STAGE_N);
    PyModule_AddStringConstant(m, "DECLARATION", DECLARATION);
    return m;
}
