/* probe.engine.accel._accel, the forward-launch and graph-replay wrappers. Included once by probe/engine/accel/_accel.c (one
 * translation unit, split by room like CPython's stringlib): not a public header. */
#ifndef PROBE_ACCEL_FWD_H
#define PROBE_ACCEL_FWD_H

/* ---------------------------------------------------------------------------------- */
/* Forward and Replay: probe/engine/hooks/step.py ``forward`` and probe/engine/hooks/replay.py in C   */
/*                                                                                    */
/* The open target forward launch is the Core's ``fwd`` (hot fields ``fwd_*``, shared   */
/* with the Python hooks, so a compiled forward around a Python replay hook, or the     */
/* reverse, counts the same). BOOTTIME is taken first and last around the original;     */
/* the FORWARD, SPAN and REPLAY records are staged straight into the ring. Every call   */
/* off the common path goes to the whole Python hook (``hook``, before the original    */
/* runs) or to its ``record`` (``impl``, after), which then writes the same record or   */
/* counts the same fault as the Python hook would.                                     */
/* ---------------------------------------------------------------------------------- */

static PyObject *S_desc, *S_fctx, *S_rt_mode, *S_runtime_mode, *S_value, *S_bdesc, *S_entries,
    *S_cudagraph, *S_use_bcg;

static int fwd_intern(void) {
#define FWD_INTERN(var, text)                                                                  \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return -1;
    FWD_INTERN(S_desc, "desc");
    FWD_INTERN(S_fctx, "_forward_context");
    FWD_INTERN(S_rt_mode, "cudagraph_runtime_mode");
    FWD_INTERN(S_runtime_mode, "runtime_mode");
    FWD_INTERN(S_value, "value");
    FWD_INTERN(S_bdesc, "batch_descriptor");
    FWD_INTERN(S_entries, "concrete_cudagraph_entries");
    FWD_INTERN(S_cudagraph, "cudagraph");
    FWD_INTERN(S_use_bcg, "use_breakable_cg");
#undef FWD_INTERN
    return 0;
}

typedef struct {
    WrapObject w;   /* orig, impl (the Python hook's record: what C does not stage), core */
    PyObject *hook; /* the whole Python hook: the calls C does not take */
    PyObject *fcm;  /* Replay which=2: the module vllm.forward_context */
    PyObject *fwd_record; /* Replay which=0: the forward launch's record (hooks.step.
                             forward_record), for the launch C cannot stage; or None */
    /* which=2, per call of every piece: the last mode seen and its value (an enum member's
       value never changes; ``.value`` is a Python property), the last batch descriptor
       and its hash (a frozen dataclass: a Python __hash__). Strong references. */
    PyObject *last_mode, *last_desc;
    long long last_mv;
    Py_hash_t last_hash;
} FwdObject;

static PyTypeObject ForwardType;
static PyTypeObject ReplayType;

/* One replay into the open scope: hooks.step.scope_replay. */
static inline void scope_count(CoreObject *c, long long mode, int captured, long long n,
                               int64_t t0, int64_t t1) {
    if (!captured)
        c->fwd.captures++;
    else if (mode == MODE_FULL)
        c->fwd.full++;
    else if (mode == MODE_PIECEWISE)
        c->fwd.pieces++;
    c->fwd.mode = mode;
    c->fwd.tokens = n;
    if (!c->fwd.t0) c->fwd.t0 = t0;
    c->fwd.t1 = t1;
}

static inline int outside_flags(CoreObject *c) {
    return (c->in_step > 0 ? 0 : FLAG_OUTSIDE_STEP) | (c->drafter > 0 ? FLAG_DRAFTER : 0);
}

/* fn(*fmt values) with vLLM's exception (if any) kept as it was; its own faults are the
   Python hook's (hook.fail), never raised here. ``fn``: the hook's own record (w.impl), or
   the forward launch's (Replay which=0: ``fwd_record``). */
static void record_slow(PyObject *fn, const char *fmt, ...) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    va_list va;
    va_start(va, fmt);
    PyObject *a = Py_VaBuildValue(fmt, va);
    va_end(va);
    if (a != NULL) {
        PyObject *r = PyObject_Call(fn, a, NULL);
        Py_XDECREF(r);
        Py_DECREF(a);
    }
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

/* The open launch's FORWARD record (the range checks are the packer's: outside them the
   Python record writes it, which counts the fault) */
static inline int stage_forward(CoreObject *c, RingObject *r, int f, int64_t t0, int64_t t1) {
    long long m = c->fwd.mode, full = c->fwd.full, caps = c->fwd.captures;
    if (r == NULL || m < 0 || m > 255 || full < INT32_MIN || full > INT32_MAX ||
        caps < INT32_MIN || caps > INT32_MAX)
        return -1;
    STAGE_FORWARD(r, .step = c->step, .mode = m, .flags = f, .t0 = t0, .t1 = t1,
                  .full_replays = full, .pieces = c->fwd.pieces, .captures = caps,
                  .passes = c->fwd.passes, .num_tokens = c->fwd.tokens, .replay_t0 = c->fwd.t0,
                  .replay_t1 = c->fwd.t1);
    return 0;
}

/* ---- Forward ------------------------------------------------------------------------ */

static PyObject *forward_call(FwdObject *self, PyObject *const *args, size_t nargsf,
                              PyObject *kwnames) {
    CoreObject *c = self->w.core;
    if (!c->enabled) return PyObject_Vectorcall(self->w.orig, args, nargsf, kwnames);
    int outer = c->fwd.open;
    int opened = c->in_step > 0 && c->drafter <= 0 && !outer;
    int timed = opened && c->gpu_timing && (c->timer_every <= 0 || c->step % c->timer_every == 0);
    PyObject *tick = timed ? timer_tick_of(c) : NULL;
    if (direct_ring(c) == NULL || (timed && tick == NULL)) {
        Py_XDECREF(tick);
        return PyObject_Vectorcall(self->hook, args, nargsf, kwnames);
    }
    if (tick != NULL) {
        Py_INCREF(tick); /* one reference for each point */
        timer_tick(tick, TICK_FORWARD_START);
    }
    if (opened) {
        memset(&c->fwd, 0, sizeof(c->fwd));
        c->fwd.open = 1;
    }
    int64_t t0 = now_ns(c);
    PyObject *res = PyObject_Vectorcall(self->w.orig, args, nargsf, kwnames);
    int64_t t1 = now_ns(c);
    if (opened) c->fwd.open = 0;
    if (tick != NULL) timer_tick(tick, TICK_FORWARD_END);
    RingObject *r = direct_ring(c);
    int f = outside_flags(c);
    if (opened) {
        if (stage_forward(c, r, f, t0, t1) < 0) /* counted by the Python record */
            record_slow(self->w.impl, "(LLii)", (long long)t0, (long long)t1, opened, outer);
    } else if (!outer) {
        if (r != NULL)
            STAGE_SPAN(r, .step = c->step, .phase = PHASE_FORWARD_LAUNCH, .flags = f, .t0 = t0,
                       .t1 = t1);
        else
            record_slow(self->w.impl, "(LLii)", (long long)t0, (long long)t1, opened, outer);
    }
    return res;
}

/* ---- Replay ------------------------------------------------------------------------- */

/* MRV2: the replay is the drafter's unless the manager is the target model's. */
static inline int mrv2_drafter(CoreObject *c, PyObject *me) {
    return c->drafter > 0 || strcmp(_PyType_Name(Py_TYPE(me)), "ModelCudaGraphManager") != 0;
}

/* desc.num_tokens of run_fullgraph(self, desc) into *n: 0, or -1 with the error cleared */
static int replay_tokens(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                         long long *n) {
    PyObject *desc = nargs > 1 ? args[1] : kwarg(args, nargs, kwnames, S_desc);
    if (desc == NULL) return -1;
    PyObject *nt = PyObject_GetAttr(desc, S_num_tokens);
    if (nt == NULL) {
        PyErr_Clear();
        return -1;
    }
    int ok = PyLong_Check(nt);
    *n = ok ? PyLong_AsLongLong(nt) : 0;
    Py_DECREF(nt);
    if (!ok || (*n == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

/* A launch that is a replay hook's call (MRV2's target run_fullgraph, V1's FULL wrapper):
   the GPU timer's FORWARD_START on its steps and the scope opened, as forward_call's opened
   case. *tick: the timer's, for launch_end (NULL on an untimed step). -1 on a timed step
   whose tick cannot be had: the caller hands the call to the whole Python hook. */
static int launch_begin(CoreObject *c, PyObject **tick) {
    int timed = c->gpu_timing && (c->timer_every <= 0 || c->step % c->timer_every == 0);
    *tick = timed ? timer_tick_of(c) : NULL;
    if (timed && *tick == NULL) return -1;
    if (*tick != NULL) {
        Py_INCREF(*tick); /* one reference for each point */
        timer_tick(*tick, TICK_FORWARD_START);
    }
    memset(&c->fwd, 0, sizeof(c->fwd));
    c->fwd.open = 1;
    return 0;
}

/* The scope closed, FORWARD_END ticked, and the launch's FORWARD record staged (or handed
   to the launch's Python record). */
static void launch_end(FwdObject *self, CoreObject *c, PyObject *tick, int64_t t0, int64_t t1) {
    c->fwd.open = 0;
    if (tick != NULL) timer_tick(tick, TICK_FORWARD_END);
    if (stage_forward(c, direct_ring(c), outside_flags(c), t0, t1) < 0)
        record_slow(self->fwd_record, "(LLii)", (long long)t0, (long long)t1, 1, 0);
}

/* The target's run_fullgraph in a step with no forward open: the FULL forward launch
   itself (ModelCudaGraphManager.run_fullgraph is this call and a slice of the hidden
   states), as forward_call's opened case with its own replay counted into the scope. */
static PyObject *replay_launch(FwdObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    CoreObject *c = self->w.core;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *tick;
    if (direct_ring(c) == NULL || self->fwd_record == Py_None || launch_begin(c, &tick) < 0)
        return PyObject_Vectorcall(self->hook, args, nargsf, kwnames);
    int64_t t0 = now_ns(c);
    PyObject *res = PyObject_Vectorcall(self->w.orig, args, nargsf, kwnames);
    int64_t t1 = now_ns(c);
    if (res != NULL) {
        long long n;
        if (replay_tokens(args, nargs, kwnames, &n) == 0)
            scope_count(c, MODE_FULL, 1, n, t0, t1);
        else /* the Python record, in the open scope: it faults like the Python hook */
            res = dispatch_record_slow(&self->w, res, t0, t1, args, nargs, kwnames);
    }
    launch_end(self, c, tick, t0, t1);
    return res;
}

static PyObject *replay_mrv2(FwdObject *self, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames) {
    CoreObject *c = self->w.core;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->w.which == 0 && nargs >= 1 && c->in_step > 0 && !c->fwd.open &&
        !mrv2_drafter(c, args[0]))
        return replay_launch(self, args, nargsf, kwnames);
    int64_t t0 = now_ns(c);
    PyObject *res = PyObject_Vectorcall(self->w.orig, args, nargsf, kwnames);
    int64_t t1 = now_ns(c);
    if (res == NULL) return NULL;
    RingObject *r = direct_ring(c);
    if (r == NULL || nargs < 1) goto slow;
    PyObject *me = args[0];
    int drafter = mrv2_drafter(c, me);
    int f = FLAG_MRV2 | (c->in_step > 0 ? 0 : FLAG_OUTSIDE_STEP) | (drafter ? FLAG_DRAFTER : 0);
    if (self->w.which == 0) { /* run_fullgraph(self, desc) */
        long long n;
        if (replay_tokens(args, nargs, kwnames, &n) < 0) goto slow;
        if (c->fwd.open && !drafter)
            scope_count(c, MODE_FULL, 1, n, t0, t1);
        else
            STAGE_REPLAY(r, .step = c->step, .mode = MODE_FULL, .kind = RK_REPLAY, .flags = f,
                         .t0 = t0, .t1 = t1, .num_tokens = n);
        return res;
    }
    /* run_pw_graph(self, model, inputs) */
    if (c->fwd.open && !drafter) {
        c->fwd.passes++; /* confirmation comes from the pieces */
        return res;
    }
    PyObject *b = PyObject_GetAttr(me, S_use_bcg);
    if (b == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) goto slow_clear;
        PyErr_Clear();
    } else {
        int t = PyObject_IsTrue(b);
        Py_DECREF(b);
        if (t < 0) goto slow_clear;
        if (t) f |= FLAG_BREAKABLE;
    }
    STAGE_REPLAY(r, .step = c->step, .mode = MODE_PIECEWISE, .kind = RK_PASSTHROUGH, .flags = f,
                 .t0 = t0, .t1 = t1);
    return res;
slow_clear:
    PyErr_Clear();
slow:
    return dispatch_record_slow(&self->w, res, t0, t1, args, nargs, kwnames); /* w.impl */
}

/* getattr(o, name) into *out (new reference); 0, or -1 with the error cleared */
static inline int get_or_clear(PyObject *o, PyObject *name, PyObject **out) {
    *out = PyObject_GetAttr(o, name);
    if (*out == NULL) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

/* A batch descriptor's num_tokens into *n, as the Python record reads it
   (``getattr(desc, "num_tokens", 0)``): 1, or 0 when C cannot (not an int, too big, an
   error other than a missing attribute), with no error left set */
static int desc_tokens(PyObject *desc, long long *n) {
    *n = 0;
    PyObject *nt = PyObject_GetAttr(desc, S_num_tokens);
    if (nt == NULL) {
        int missing = PyErr_ExceptionMatches(PyExc_AttributeError);
        PyErr_Clear();
        return missing;
    }
    int ok = PyLong_Check(nt);
    *n = ok ? PyLong_AsLongLong(nt) : 0;
    Py_DECREF(nt);
    if (*n == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return ok;
}

/* V1's target FULL wrapper as the forward launch (replay_wrapper decided it): as
   forward_call's opened case, with the wrapper's own replay (mv >= 0; -1: a pass-through,
   whose pieces count themselves) counted into the scope. Steals ``desc`` (NULL when the
   call passes through). */
static PyObject *wrapper_launch(FwdObject *self, PyObject *const *args, size_t nargsf,
                                PyObject *kwnames, long long mv, int captured, PyObject *desc) {
    CoreObject *c = self->w.core;
    PyObject *tick;
    if (launch_begin(c, &tick) < 0) {
        Py_XDECREF(desc);
        return PyObject_Vectorcall(self->hook, args, nargsf, kwnames);
    }
    int64_t t0 = now_ns(c);
    PyObject *res = PyObject_Vectorcall(self->w.orig, args, nargsf, kwnames);
    int64_t t1 = now_ns(c);
    if (res != NULL && mv >= 0) {
        long long n = 0;
        if (desc_tokens(desc, &n) && mv <= 255)
            scope_count(c, mv, captured, n, t0, t1);
        else /* the Python record, in the open scope: it counts (or faults) as the hook would */
            record_slow(self->w.impl, "(LLLOO)", (long long)t0, (long long)t1, mv,
                        captured ? Py_True : Py_False, desc);
    }
    launch_end(self, c, tick, t0, t1);
    Py_XDECREF(desc);
    return res;
}

/* CUDAGraphWrapper.__call__ (V1 FULL around the model; PIECEWISE pieces in either runner) */
static PyObject *replay_wrapper(FwdObject *self, PyObject *const *args, size_t nargsf,
                                PyObject *kwnames) {
    CoreObject *c = self->w.core;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *ctx = NULL, *mode = NULL, *want = NULL, *val = NULL, *desc = NULL, *ents = NULL,
             *cg = NULL;
    int captured = 0;
    if (nargs < 1 || direct_ring(c) == NULL || get_or_clear(self->fcm, S_fctx, &ctx) < 0) goto impl;
    if (ctx == Py_None) goto orig;
    PyObject *me = args[0];
    if (get_or_clear(ctx, S_rt_mode, &mode) < 0 || get_or_clear(me, S_runtime_mode, &want) < 0)
        goto impl;
    long long mv;
    if (mode == self->last_mode) {
        mv = self->last_mv;
    } else {
        if (get_or_clear(mode, S_value, &val) < 0 || !PyLong_CheckExact(val)) goto impl;
        mv = PyLong_AsLongLong(val);
        if (mv == -1 && PyErr_Occurred()) goto impl_clear;
        Py_INCREF(mode);
        Py_XSETREF(self->last_mode, mode);
        self->last_mv = mv;
    }
    /* V1's target FULL wrapper (around the whole model) in a step with no forward open:
       the forward launch itself (``_model_forward`` is left unhooked then), its own replay
       counted into it; a pass-through (a PIECEWISE or eager step) is the launch too */
    int launch = self->fwd_record != Py_None && self->w.full != NULL && want == self->w.full &&
                 c->in_step > 0 && c->drafter <= 0 && !c->fwd.open;
    int replays = mv != 0;
    if (replays && want != Py_None) {
        int ne = PyObject_RichCompareBool(mode, want, Py_NE);
        if (ne < 0) goto impl_clear;
        if (ne) replays = 0;
    }
    if (!replays && !launch) goto orig;
    if (replays && (get_or_clear(ctx, S_bdesc, &desc) < 0 ||
                    get_or_clear(me, S_entries, &ents) < 0 || !PyDict_CheckExact(ents)))
        goto impl;
    if (replays && desc != self->last_desc) {
        Py_hash_t h = PyObject_Hash(desc);
        if (h == -1) goto impl_clear;
        Py_INCREF(desc);
        Py_XSETREF(self->last_desc, desc);
        self->last_hash = h;
    }
    PyObject *entry = NULL; /* borrowed */
#if PY_VERSION_HEX < 0x030D0000
    if (replays) entry = _PyDict_GetItem_KnownHash(ents, desc, self->last_hash);
#else
    if (replays) entry = PyDict_GetItemWithError(ents, desc);
#endif
    if (entry == NULL && PyErr_Occurred()) goto impl_clear;
    if (entry != NULL && entry != Py_None) {
        Py_INCREF(entry); /* the original may replace it */
        int bad = get_or_clear(entry, S_cudagraph, &cg);
        Py_DECREF(entry);
        if (bad < 0) goto impl;
        captured = cg != Py_None;
    }
    Py_CLEAR(ctx);
    Py_CLEAR(mode);
    Py_CLEAR(want);
    Py_CLEAR(val);
    Py_CLEAR(ents);
    Py_CLEAR(cg);
    if (launch) /* steals desc */
        return wrapper_launch(self, args, nargsf, kwnames, replays ? mv : -1, captured, desc);
    int64_t t0 = now_ns(c);
    PyObject *res = PyObject_Vectorcall(self->w.orig, args, nargsf, kwnames);
    int64_t t1 = now_ns(c);
    if (res == NULL) {
        Py_DECREF(desc);
        return NULL;
    }
    long long n = 0;
    int ok = desc_tokens(desc, &n);
    RingObject *r = direct_ring(c);
    if (ok && c->fwd.open && c->drafter <= 0) {
        scope_count(c, mv, captured, n, t0, t1);
    } else if (ok && r != NULL && mv <= 255 && mv >= 0) {
        int f = outside_flags(c);
        STAGE_REPLAY(r, .step = c->step, .mode = mv, .kind = captured ? RK_REPLAY : RK_CAPTURE,
                     .flags = f, .t0 = t0, .t1 = t1, .num_tokens = n);
    } else {
        record_slow(self->w.impl, "(LLLOO)", (long long)t0, (long long)t1, mv,
                        captured ? Py_True : Py_False, desc);
    }
    Py_DECREF(desc);
    return res;
impl_clear:
    PyErr_Clear();
impl:
    Py_XDECREF(ctx);
    Py_XDECREF(mode);
    Py_XDECREF(want);
    Py_XDECREF(val);
    Py_XDECREF(desc);
    Py_XDECREF(ents);
    Py_XDECREF(cg);
    return PyObject_Vectorcall(self->hook, args, nargsf, kwnames);
orig:
    Py_XDECREF(ctx);
    Py_XDECREF(mode);
    Py_XDECREF(want);
    Py_XDECREF(val);
    return PyObject_Vectorcall(self->w.orig, args, nargsf, kwnames);
}

static PyObject *replay_call(FwdObject *self, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames) {
    if (!self->w.core->enabled) return PyObject_Vectorcall(self->w.orig, args, nargsf, kwnames);
    if (self->w.which == 2) return replay_wrapper(self, args, nargsf, kwnames);
    return replay_mrv2(self, args, nargsf, kwnames);
}

/* ---- types -------------------------------------------------------------------------- */

static PyObject *fwd_make(PyTypeObject *type, PyObject *args, PyObject *kw) {
    FwdObject *self = (FwdObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    PyObject *orig, *impl, *record, *core, *fcm = Py_None, *fwd_rec = Py_None, *full = Py_None;
    int which = 0;
    if (type == &ForwardType) {
        static char *kwlist[] = {"orig", "impl", "record", "core", NULL};
        if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO!", kwlist, &orig, &impl, &record,
                                         &CoreType, &core))
            goto fail;
        self->w.vectorcall = (vectorcallfunc)forward_call;
    } else {
        static char *kwlist[] = {"orig", "impl", "record", "core", "which", "fcm", "fwd_record",
                                 "full", NULL};
        if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO!i|OOO", kwlist, &orig, &impl, &record,
                                         &CoreType, &core, &which, &fcm, &fwd_rec, &full))
            goto fail;
        if (fwd_rec != Py_None && !PyCallable_Check(fwd_rec)) {
            PyErr_SetString(PyExc_TypeError, "fwd_record must be callable or None");
            goto fail;
        }
        if (which < 0 || which > 2 || (which == 2 && fcm == Py_None)) {
            PyErr_SetString(PyExc_ValueError,
                            "which is 0 (run_fullgraph), 1 (run_pw_graph) or 2 (a wrapper, "
                            "with the forward-context module)");
            goto fail;
        }
        self->w.vectorcall = (vectorcallfunc)replay_call;
    }
    if (!PyCallable_Check(impl)) {
        PyErr_SetString(PyExc_TypeError, "the Python hook must be callable");
        goto fail;
    }
    if (wrap_own(&self->w, orig, record, core) < 0) goto fail;
    self->w.which = which;
    Py_INCREF(impl);
    self->hook = impl;
    Py_INCREF(fcm);
    self->fcm = fcm;
    Py_INCREF(fwd_rec);
    self->fwd_record = fwd_rec;
    if (which == 2 && full != Py_None) { /* vLLM's CUDAGraphMode.FULL: a wrapper of that mode
                                            may be the forward launch (with fwd_record) */
        Py_INCREF(full);
        self->w.full = full;
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static int fwd_traverse(FwdObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->last_mode);
    Py_VISIT(self->last_desc);
    Py_VISIT(self->hook);
    Py_VISIT(self->fcm);
    Py_VISIT(self->fwd_record);
    return wrap_traverse(&self->w, visit, arg);
}

static int fwd_clear(FwdObject *self) {
    Py_CLEAR(self->last_mode);
    Py_CLEAR(self->last_desc);
    Py_CLEAR(self->hook);
    Py_CLEAR(self->fcm);
    Py_CLEAR(self->fwd_record);
    return wrap_clear(&self->w);
}

static void fwd_dealloc(FwdObject *self) {
    PyObject_GC_UnTrack(self);
    if (self->w.weakrefs) PyObject_ClearWeakRefs((PyObject *)self);
    fwd_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define FWD_TYPE(NAME, DOC)                                                                    \
    {                                                                                          \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = "probe.engine.accel._accel." #NAME,                       \
        .tp_basicsize = sizeof(FwdObject),                                                     \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |     \
                    Py_TPFLAGS_METHOD_DESCRIPTOR,                                              \
        .tp_doc = DOC, .tp_new = fwd_make, .tp_dealloc = (destructor)fwd_dealloc,              \
        .tp_traverse = (traverseproc)fwd_traverse, .tp_clear = (inquiry)fwd_clear,             \
        .tp_call = PyVectorcall_Call,                                                          \
        .tp_vectorcall_offset = offsetof(FwdObject, w) + offsetof(WrapObject, vectorcall),     \
        .tp_descr_get = wrap_get,                                                              \
        .tp_dictoffset = offsetof(FwdObject, w) + offsetof(WrapObject, dict),                  \
        .tp_weaklistoffset = offsetof(FwdObject, w) + offsetof(WrapObject, weakrefs),          \
        .tp_members = wrap_members, .tp_getset = wrap_getset, .tp_methods = wrap_methods,      \
        .tp_repr = (reprfunc)wrap_repr, .tp_getattro = PyObject_GenericGetAttr,                \
        .tp_setattro = PyObject_GenericSetAttr,                                                \
    }

static PyTypeObject ForwardType = FWD_TYPE(
    Forward, "Forward(orig, impl, record, core): the forward launch and its scope in C.");
static PyTypeObject ReplayType = FWD_TYPE(
    Replay, "Replay(orig, impl, record, core, which, fcm=None, fwd_record=None, full=None): a "
            "graph replay hook in C (which=0 with fwd_record: the target's FULL launch too; "
            "which=2 with fwd_record and full: V1's FULL wrapper is the launch where none "
            "is open).");

#endif /* PROBE_ACCEL_FWD_H */
