/* probe.engine.accel._accel, the Span, Gate, Step and Dispatch wrappers. Included once by probe/engine/accel/_accel.c (one translation unit,
 * split by room like CPython's stringlib): not a public header. */
#ifndef PROBE_ACCEL_WRAP_H
#define PROBE_ACCEL_WRAP_H

/* ---------------------------------------------------------------------------------- */
/* Span and Gate: wrappers that bind like functions                                     */
/* ---------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *weakrefs;
    PyObject *orig;
    PyObject *impl; /* Gate: the Python hook; Span: unused (NULL) */
    CoreObject *core;
    int phase;     /* Span */
    int drafter;   /* Span: marks the drafter scope */
    int flags;     /* Span: set on each span it writes (Flag.FROM_DISPATCH) */
    int sampling;  /* Gate: call the hook while sampling even when off */
    PyObject *full; /* Dispatch: vLLM's CUDAGraphMode.FULL */
    int which;      /* Step: 0 execute_model, 1 sample_tokens; Dispatch: 0 V1, 1 MRV2 */
    int mrv2;       /* Step: Flag.MRV2 on its spans */
    int pos[4];     /* Dispatch MRV2: num_reqs, num_tokens, uniform_token_count,
                       max_query_len positions after self (-1: absent) */
    PyObject *packer;        /* Build: the bound ring's BUILD packer (strong, a cache) */
    PyObject *last_type;     /* Build: the builder class last interned (strong) */
    long long last_ident;    /* Build: its string id */
    PyObject *miss_key;      /* Dispatch V1: the inputs of the last miss the Python record
                                handed back (miss_store), or NULL */
    int miss_m, miss_reason; /* ... and its mode and reason */
} WrapObject;

static PyTypeObject SpanType;
static PyTypeObject GateType;

/* No compiled ring bound (a Python writer is attached): write through ``core.put.span``
   like the Python hook would, keeping vLLM's exception (if any) as it was. */
#if SPAN_FIELDS != 8
#error "span_fallback passes 8 values to RT.put.span: update it with the SPAN declaration"
#endif
static void span_fallback(CoreObject *c, int phase, int flags, long long step, int64_t t0,
                          int64_t t1) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *put = PyObject_GetAttrString((PyObject *)c, "put");
    if (put != NULL) {
        PyObject *fn = PyObject_GetAttrString(put, "span");
        Py_DECREF(put);
        if (fn != NULL) {
            /* RT.put.span(step, phase, t0, t1, flags, v0, v1, v2): SPAN_FIELDS values */
            PyObject *r = PyObject_CallFunction(fn, "LiLLiiii", step, phase, (long long)t0,
                                                (long long)t1, flags, 0, 0, 0);
            Py_XDECREF(r);
            Py_DECREF(fn);
        }
    }
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

static PyObject *span_call(WrapObject *self, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames) {
    CoreObject *c = self->core;
    if (!c->enabled) return PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    if (self->drafter) c->drafter++;
    int64_t t0 = now_ns(c);
    PyObject *res = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    int64_t t1 = now_ns(c);
    if (self->drafter) c->drafter--;
    RingObject *r = c->ring;
    int f = self->flags | (c->in_step > 0 ? 0 : FLAG_OUTSIDE_STEP) |
            (c->drafter > 0 ? FLAG_DRAFTER : 0);
    if (r != NULL)
        STAGE_SPAN(r, .step = c->step, .phase = self->phase, .flags = f, .t0 = t0, .t1 = t1);
    else
        span_fallback(c, self->phase, f, c->step, t0, t1);
    return res;
}

static PyObject *gate_call(WrapObject *self, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames) {
    CoreObject *c = self->core;
    if (c->enabled || (self->sampling && c->sampling))
        return PyObject_Vectorcall(self->impl, args, nargsf, kwnames);
    return PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
}

static PyObject *wrap_make(PyTypeObject *type, PyObject *args, PyObject *kw) {
    WrapObject *self = (WrapObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    PyObject *orig, *core, *impl = NULL;
    int a = 0, b = 0, fl = 0;
    if (type == &SpanType) {
        static char *kwlist[] = {"orig", "core", "phase", "drafter", "flags", NULL};
        if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!i|pi", kwlist, &orig, &CoreType, &core,
                                         &a, &b, &fl))
            goto fail;
        if (fl < 0 || fl > 255) {
            PyErr_SetString(PyExc_ValueError, "flags is a byte (0-255)");
            goto fail;
        }
        self->vectorcall = (vectorcallfunc)span_call;
        self->phase = a;
        self->drafter = b;
        self->flags = fl;
    } else {
        static char *kwlist[] = {"orig", "impl", "core", "sampling", NULL};
        if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO!|p", kwlist, &orig, &impl, &CoreType,
                                         &core, &a))
            goto fail;
        self->vectorcall = (vectorcallfunc)gate_call;
        self->sampling = a;
        Py_INCREF(impl);
        self->impl = impl;
    }
    if (!PyCallable_Check(orig)) {
        PyErr_SetString(PyExc_TypeError, "orig must be callable");
        goto fail;
    }
    Py_INCREF(orig);
    self->orig = orig;
    Py_INCREF(core);
    self->core = (CoreObject *)core;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static int wrap_traverse(WrapObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->dict);
    Py_VISIT(self->orig);
    Py_VISIT(self->impl);
    Py_VISIT((PyObject *)self->core);
    Py_VISIT(self->full);
    Py_VISIT(self->packer);
    Py_VISIT(self->last_type);
    Py_VISIT(self->miss_key);
    return 0;
}

static int wrap_clear(WrapObject *self) {
    Py_CLEAR(self->dict);
    Py_CLEAR(self->orig);
    Py_CLEAR(self->impl);
    Py_CLEAR(self->core);
    Py_CLEAR(self->full);
    Py_CLEAR(self->packer);
    Py_CLEAR(self->last_type);
    Py_CLEAR(self->miss_key);
    return 0;
}

static void wrap_dealloc(WrapObject *self) {
    PyObject_GC_UnTrack(self);
    if (self->weakrefs) PyObject_ClearWeakRefs((PyObject *)self);
    wrap_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *wrap_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyObject *wrap_reduce(PyObject *self, PyObject *Py_UNUSED(x)) {
    PyErr_Format(PyExc_TypeError, "cannot pickle a probe hook (%R)", self);
    return NULL;
}

static PyObject *wrap_repr(WrapObject *self) {
    return PyUnicode_FromFormat("<probe %s around %R>", Py_TYPE(self)->tp_name, self->orig);
}

static PyMemberDef wrap_members[] = {
    {"orig", T_OBJECT, offsetof(WrapObject, orig), READONLY, "the wrapped original"},
    {"impl", T_OBJECT, offsetof(WrapObject, impl), READONLY,
     "Gate, Step, Dispatch: the Python hook it hands off to"},
    {"phase", T_INT, offsetof(WrapObject, phase), READONLY, "Span: the phase id"},
    {NULL}};

static PyGetSetDef wrap_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL}, {NULL}};

static PyMethodDef wrap_methods[] = {{"__reduce__", wrap_reduce, METH_NOARGS, NULL}, {NULL}};

#define WRAP_TYPE(NAME, NEW, DOC)                                                              \
    {                                                                                          \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = "probe.engine.accel._accel." #NAME,                       \
        .tp_basicsize = sizeof(WrapObject),                                                    \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |     \
                    Py_TPFLAGS_METHOD_DESCRIPTOR,                                              \
        .tp_doc = DOC, .tp_new = NEW, .tp_dealloc = (destructor)wrap_dealloc,                  \
        .tp_traverse = (traverseproc)wrap_traverse, .tp_clear = (inquiry)wrap_clear,           \
        .tp_call = PyVectorcall_Call, .tp_vectorcall_offset = offsetof(WrapObject, vectorcall), \
        .tp_descr_get = wrap_get, .tp_dictoffset = offsetof(WrapObject, dict),                 \
        .tp_weaklistoffset = offsetof(WrapObject, weakrefs), .tp_members = wrap_members,       \
        .tp_getset = wrap_getset, .tp_methods = wrap_methods, .tp_repr = (reprfunc)wrap_repr,  \
        .tp_getattro = PyObject_GenericGetAttr, .tp_setattro = PyObject_GenericSetAttr,        \
    }

static PyTypeObject SpanType =
    WRAP_TYPE(Span, wrap_make, "Span(orig, core, phase, drafter=False, flags=0): a compiled phase-span hook.");
static PyTypeObject GateType =
    WRAP_TYPE(Gate, wrap_make, "Gate(orig, impl, core, sampling=False): the dormant path in C.");


/* ---------------------------------------------------------------------------------- */
/* Step and Dispatch: the common path of two Python hooks, in C                         */
/*                                                                                    */
/* Each takes the Python hook (``impl``) too and hands it every call off the common    */
/* path (sampling, the first step, the GPU timer's steps, a dispatch miss, anything it  */
/* cannot read), so both write the same records.                                       */
/* ---------------------------------------------------------------------------------- */

static PyObject *S_total, *S_num_sched, *S_new_reqs, *S_on_first_step, *S_num_reqs, *S_num_tokens,
    *S_cg_mode, *S_uniform_decode, *S_udql, *S_dql, *S_uniform_token_count, *S_max_query_len,
    *S_dummy_run, *S_is_profile, *S_timer_tick, *S_graph_ctx, *S_keys_init, *S_cudagraph_mode;



static PyTypeObject StepType;
static PyTypeObject DispatchType;

/* the keyword ``name`` of a vectorcall, borrowed, or NULL */
static PyObject *kwarg(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                       PyObject *name) {
    if (kwnames == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        if (k == name || PyUnicode_Compare(k, name) == 0) return args[nargs + i];
    }
    return NULL;
}

/* The GPU timer (probe.engine.hooks.step.GpuTimer): the compiled hooks stay on their fast path on
   its steps and hand it each point through ``RT.timer_tick(point)``, its ``tick`` (which
   never raises). The points are TICK_* of probe/engine/hooks/step.py, in the generated header. */

/* the timer's tick, a new reference, or NULL when there is none (the timer off, or a
   Python hot path without one: the Python hook then takes the step) */
static PyObject *timer_tick_of(CoreObject *c) {
    if (!c->gpu_timing) return NULL;
    PyObject *t = PyObject_GetAttr((PyObject *)c, S_timer_tick);
    if (t == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (t == Py_None) {
        Py_DECREF(t);
        return NULL;
    }
    return t;
}

/* tick(point), keeping any error vLLM's call left set; steals ``t`` */
static void timer_tick(PyObject *t, int point) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *p = PyLong_FromLong(point);
    PyObject *r = p != NULL ? PyObject_CallOneArg(t, p) : NULL;
    Py_XDECREF(p);
    Py_XDECREF(r);
    Py_DECREF(t);
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

static int has_first_step(CoreObject *c) {
    PyObject *cbs = PyObject_GetAttr((PyObject *)c, S_on_first_step);
    if (cbs == NULL) {
        PyErr_Clear();
        return 0;
    }
    int t = PyObject_IsTrue(cbs);
    Py_DECREF(cbs);
    if (t < 0) PyErr_Clear();
    return t != 0;
}

/* The step bracket's original, inside the step and timed first and last thing, and its
   SPAN record (v0, v1, v2: execute_model's tokens, requests and requests carried over) */
static PyObject *in_step_call(WrapObject *self, PyObject *const *args, size_t nargsf,
                              PyObject *kwnames, int phase, long long v0, long long v1,
                              long long v2) {
    CoreObject *c = self->core;
    c->in_step++;
    int64_t t0 = now_ns(c);
    PyObject *res = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    int64_t t1 = now_ns(c);
    c->in_step--;
    if (c->ring != NULL)
        STAGE_SPAN(c->ring, .step = c->step, .phase = phase, .flags = self->mrv2 ? FLAG_MRV2 : 0,
                   .t0 = t0, .t1 = t1, .v0 = v0, .v1 = v1, .v2 = v2);
    return res;
}

static PyObject *step_call(WrapObject *self, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames) {
    CoreObject *c = self->core;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (!c->enabled && !c->sampling) return PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    RingObject *r = c->ring;
    long long every = c->gpu_timing ? c->timer_every : 0;
    if (c->sampling || r == NULL) goto slow;
    if (self->which == 0) {
        int timed = every > 0 && (c->step + 1) % every == 0;
        if (nargs < 2 || has_first_step(c)) goto slow;
        if (self->mrv2) {
            PyObject *d = kwarg(args, nargs, kwnames, S_dummy_run);
            PyObject *p = kwarg(args, nargs, kwnames, S_is_profile);
            if ((d && PyObject_IsTrue(d)) || (p && PyObject_IsTrue(p))) goto slow;
        }
        PyObject *so = args[1];
        PyObject *tot = PyObject_GetAttr(so, S_total);
        if (tot == NULL) goto slow_clear;
        long long ntok = PyLong_AsLongLong(tot);
        Py_DECREF(tot);
        if (ntok == -1 && PyErr_Occurred()) goto slow_clear;
        PyObject *sched = PyObject_GetAttr(so, S_num_sched);
        if (sched == NULL) goto slow_clear;
        Py_ssize_t nreq = PyObject_Size(sched);
        Py_DECREF(sched);
        if (nreq < 0) goto slow_clear;
        /* carried over: scheduled before, not new this step (-1: unknown) */
        long long carried = -1;
        PyObject *fresh = PyObject_GetAttr(so, S_new_reqs);
        if (fresh == NULL) {
            PyErr_Clear();
        } else {
            Py_ssize_t nnew = fresh == Py_None ? -1 : PyObject_Size(fresh);
            Py_DECREF(fresh);
            if (nnew < 0)
                PyErr_Clear();
            else
                carried = (long long)nreq - (long long)nnew;
        }
        PyObject *tick = timed ? timer_tick_of(c) : NULL;
        if (timed && tick == NULL) goto slow;
        c->step++;
        if (tick != NULL) timer_tick(tick, TICK_STEP_START);
        return in_step_call(self, args, nargsf, kwnames, PHASE_EXECUTE, ntok, nreq, carried);
    }
    if (!c->enabled) goto slow;
    int end = every > 0 && c->step % every == 0, before = every > 0 && (c->step + 1) % every == 0;
    PyObject *tick = end || before ? timer_tick_of(c) : NULL;
    if ((end || before) && tick == NULL) goto slow;
    PyObject *res = in_step_call(self, args, nargsf, kwnames, PHASE_SAMPLE_TOKENS, 0, 0, 0);
    if (tick != NULL) {
        if (end && before) Py_INCREF(tick); /* every == 1: both points, one reference each */
        if (end) timer_tick(tick, TICK_STEP_END);
        if (before) timer_tick(tick, TICK_PREV_END);
    }
    return res;
slow_clear:
    PyErr_Clear();
slow:
    return PyObject_Vectorcall(self->impl, args, nargsf, kwnames);
}

/* getattr(o, name) as a long long; -1 and an error set when it is not an int; None -> 0 */
static long long attr_ll(PyObject *o, PyObject *name, int *bad) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) {
        *bad = 1;
        return 0;
    }
    long long x = 0;
    if (v != Py_None) {
        x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred()) *bad = 1;
    }
    Py_DECREF(v);
    return x;
}

static long long obj_ll(PyObject *v, int *bad) { /* None/NULL -> 0, truthiness as vLLM's "or 0" */
    if (v == NULL || v == Py_None) return 0;
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) *bad = 1;
    return x;
}

/* ---- V1 misses: the last one's reason, kept while the same inputs repeat ----------------- */
/* A miss reason is a function of the call's arguments, the dispatcher's state (its
   keys_initialized and cudagraph_mode) and RT.graph_ctx (probe.engine.hooks.dispatch._ReasonMemo,
   whose memo the Python record consults). When the record hands back (mode, reason) for a
   miss its memo holds, these inputs are kept here: the next call with the same ones (the
   eager drafter's every step, a PIECEWISE engine's steady state) is recorded in C. Kept:
   a weak reference to the dispatcher (a freed one's address never matches), the context,
   the mode member and the descriptor returned, the two state attributes, the keyword
   names and every argument after self (sets as frozensets, compared by equality). */
#define MISS_FIXED 7 /* ref, ctx, mode, desc, keys_initialized, cudagraph_mode, kwnames */

static PyObject *attr_or_none(PyObject *o, PyObject *name) { /* new reference; never NULL
                                                                 unless out of memory */
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) {
        PyErr_Clear();
        Py_INCREF(Py_None);
        v = Py_None;
    }
    return v;
}

static int weak_is(PyObject *ref, PyObject *obj) { /* the referent of ``ref`` is ``obj`` */
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *o = NULL;
    if (PyWeakref_GetRef(ref, &o) < 0) {
        PyErr_Clear();
        return 0;
    }
    Py_XDECREF(o);
    return o == obj;
#else
    return PyWeakref_GetObject(ref) == obj;
#endif
}

/* An argument the memo may keep: its equality is the builtin one (no Python code, no
   device): int, bool, float, str, None, and sets of such (vLLM's mode sets) */
static int plain_arg(PyObject *a) {
    if (a == Py_None || PyLong_CheckExact(a) || PyBool_Check(a) || PyFloat_CheckExact(a) ||
        PyUnicode_CheckExact(a))
        return 1;
    return PyAnySet_CheckExact(a);
}

static int same(PyObject *a, PyObject *b) { /* 1 equal, 0 not, -1 error */
    if (a == b) return 1;
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

static int miss_match(WrapObject *self, PyObject *me, PyObject *mode, PyObject *desc,
                      PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *key = self->miss_key;
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    Py_ssize_t n = nargs - 1 + nk;
    if (key == NULL || PyTuple_GET_SIZE(key) != MISS_FIXED + n) return 0;
    if (!weak_is(PyTuple_GET_ITEM(key, 0), me) || PyTuple_GET_ITEM(key, 2) != mode) return 0;
    PyObject *kn = kwnames ? kwnames : Py_None;
    int ok = same(PyTuple_GET_ITEM(key, 6), kn);
    if (ok <= 0) return ok;
    ok = same(PyTuple_GET_ITEM(key, 3), desc);
    if (ok <= 0) return ok;
    for (Py_ssize_t i = 0; i < n; i++) {
        ok = same(PyTuple_GET_ITEM(key, MISS_FIXED + i), args[1 + i]);
        if (ok <= 0) return ok;
    }
    PyObject *st[3] = {PyObject_GetAttr((PyObject *)self->core, S_graph_ctx),
                       attr_or_none(me, S_keys_init), attr_or_none(me, S_cudagraph_mode)};
    if (st[0] == NULL) PyErr_Clear();
    ok = st[0] != NULL && st[1] != NULL && st[2] != NULL;
    static const int at[3] = {1, 4, 5}; /* ctx, keys_initialized, cudagraph_mode */
    for (int i = 0; ok && i < 3; i++) ok = PyTuple_GET_ITEM(key, at[i]) == st[i];
    for (int i = 0; i < 3; i++) Py_XDECREF(st[i]);
    return ok;
}

static void miss_store(WrapObject *self, PyObject *me, PyObject *mode, PyObject *desc,
                       PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                       PyObject *learned) {
    /* learned: the record's answer, (mode, reason) or None; anything else is ignored */
    long long m, reason;
    if (learned == NULL || !PyTuple_CheckExact(learned) || PyTuple_GET_SIZE(learned) != 2)
        return;
    m = PyLong_AsLongLong(PyTuple_GET_ITEM(learned, 0));
    reason = PyLong_AsLongLong(PyTuple_GET_ITEM(learned, 1));
    if (PyErr_Occurred() || m < 0 || m > 255 || reason < 0 || reason > 255) {
        PyErr_Clear();
        return;
    }
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    Py_ssize_t n = nargs - 1 + nk;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!plain_arg(args[1 + i])) return; /* compared by equality later: never a tensor's
                                                (Python code, a device sync) */
    PyObject *key = PyTuple_New(MISS_FIXED + n);
    PyObject *ref = key ? PyWeakref_NewRef(me, NULL) : NULL;
    if (ref == NULL) { /* not weakly referenceable: no memo for it */
        Py_XDECREF(key);
        PyErr_Clear();
        return;
    }
    PyObject *ctx = PyObject_GetAttr((PyObject *)self->core, S_graph_ctx);
    if (ctx == NULL) {
        PyErr_Clear();
        Py_DECREF(ref);
        Py_DECREF(key);
        return;
    }
    PyTuple_SET_ITEM(key, 0, ref);
    PyTuple_SET_ITEM(key, 1, ctx);
    Py_INCREF(mode);
    PyTuple_SET_ITEM(key, 2, mode);
    Py_INCREF(desc);
    PyTuple_SET_ITEM(key, 3, desc);
    PyTuple_SET_ITEM(key, 4, attr_or_none(me, S_keys_init));
    PyTuple_SET_ITEM(key, 5, attr_or_none(me, S_cudagraph_mode));
    PyObject *kn = kwnames ? kwnames : Py_None;
    Py_INCREF(kn);
    PyTuple_SET_ITEM(key, 6, kn);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = args[1 + i];
        PyObject *v = PyAnySet_CheckExact(a) ? PyFrozenSet_New(a) : (Py_INCREF(a), a);
        if (v == NULL) {
            PyErr_Clear();
            Py_DECREF(key); /* the items set so far go with it; the rest are NULL */
            return;
        }
        PyTuple_SET_ITEM(key, MISS_FIXED + i, v);
    }
    Py_XSETREF(self->miss_key, key);
    self->miss_m = (int)m;
    self->miss_reason = (int)reason;
}

/* The decision handed to the open dispatch phase (the Core's hot fields), which writes
   it with its span; the last one made inside the phase wins. */
static inline void core_decide(CoreObject *c, long long m, long long reason, long long f,
                               long long num_tokens, long long padded, long long num_reqs,
                               long long padded_reqs, long long max_q, long long uq) {
    c->dec_mode = m;
    c->dec_reason = reason;
    c->dec_flags = f;
    c->dec_num_tokens = num_tokens;
    c->dec_padded_tokens = padded;
    c->dec_num_reqs = num_reqs;
    c->dec_padded_reqs = padded_reqs;
    c->dec_max_q = max_q;
    c->dec_uq = uq;
    c->decided = 1;
}

/* An MRV2 graph manager's FULL hit (``CudaGraphManager.dispatch``): the decision fields
   from the manager ``me``, the ``BatchExecutionDescriptor`` it returned and the dispatch's
   inputs ``v`` (num_reqs, num_tokens, uniform_token_count, max_query_len; NULL when not
   passed). Used by the manager's own hook and by the dispatch phase, which reads the
   descriptor ``dispatch_cg_and_sync_dp`` returns (so that the manager needs no hook).
   0: done; 1: not a hit, or a count only the Python record reads (the caller's
   max_query_len); -1: an error is set. */
typedef struct {
    long long num_tokens, padded, num_reqs, padded_reqs, max_q, uq;
    int f;
} Mrv2Hit;

/* An MRV2 dispatch's inputs (num_reqs, num_tokens, uniform_token_count, max_query_len)
   into v: each at its position ``pos[i]`` among the ``n`` positional arguments ``from``
   (-1 absent), else by keyword, else NULL. */
static void mrv2_inputs(const int *pos, PyObject *const *from, Py_ssize_t n,
                        PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                        PyObject **v) {
    PyObject *names[4] = {S_num_reqs, S_num_tokens, S_uniform_token_count, S_max_query_len};
    for (int i = 0; i < 4; i++)
        v[i] = (pos[i] >= 0 && pos[i] < n) ? from[pos[i]] : kwarg(args, nargs, kwnames, names[i]);
}

static int mrv2_hit(PyObject *full, PyObject *me, PyObject *desc, PyObject *const *v,
                    Mrv2Hit *h) {
    PyObject *mode = PyObject_GetAttr(desc, S_cg_mode);
    if (mode == NULL) return -1;
    Py_DECREF(mode); /* the member lives as long as the enum */
    if (mode != full) return 1;
    int bad = 0;
    h->num_reqs = obj_ll(v[0], &bad);
    h->num_tokens = obj_ll(v[1], &bad);
    long long utc = obj_ll(v[2], &bad), mq = obj_ll(v[3], &bad);
    if (bad) return -1;
    h->max_q = mq ? mq : utc;
    if (h->max_q == 0) return 1; /* the Python record asks vLLM's caller for it */
    h->uq = attr_ll(me, S_dql, &bad);
    h->padded = attr_ll(desc, S_num_tokens, &bad);
    h->padded_reqs = attr_ll(desc, S_num_reqs, &bad);
    if (bad || PyErr_Occurred()) return -1;
    if (h->max_q < 0 || h->max_q > INT32_MAX || h->uq < 0 || h->uq > UINT32_MAX) return 1;
    h->f = FLAG_MRV2;
    if (strcmp(_PyType_Name(Py_TYPE(me)), "ModelCudaGraphManager") != 0) h->f |= FLAG_DRAFTER;
    if (v[2] != NULL && v[2] != Py_None && utc == h->uq) h->f |= FLAG_UNIFORM;
    return 0;
}

/* record(result, t0, t1, *args, **kwargs), the Python hook's own recording: what it
   returned (a new reference), or NULL; no error left set (it counts its own faults) */
static PyObject *record_result(WrapObject *self, PyObject *res, int64_t t0, int64_t t1,
                               PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *r = NULL;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject **buf = PyMem_Malloc((size_t)(3 + nargs + nk) * sizeof(PyObject *));
    if (buf == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *a0 = PyLong_FromLongLong(t0), *a1 = PyLong_FromLongLong(t1);
    if (a0 && a1) {
        buf[0] = res;
        buf[1] = a0;
        buf[2] = a1;
        for (Py_ssize_t i = 0; i < nargs + nk; i++) buf[3 + i] = args[i];
        r = PyObject_Vectorcall(self->impl, buf, (size_t)(3 + nargs), kwnames);
    }
    Py_XDECREF(a0);
    Py_XDECREF(a1);
    PyMem_Free(buf);
    PyErr_Clear();
    return r;
}

/* The Python hook's recording of a call C does not write (dispatch, replay); vLLM's
   result back unchanged */
static PyObject *dispatch_record_slow(WrapObject *self, PyObject *res, int64_t t0, int64_t t1,
                                      PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames) {
    Py_XDECREF(record_result(self, res, t0, t1, args, nargs, kwnames));
    return res;
}

static PyObject *dispatch_call(WrapObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    CoreObject *c = self->core;
    if (!c->enabled) return PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    int64_t t0 = now_ns(c);
    PyObject *res = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    int64_t t1 = now_ns(c);
    if (res == NULL) return NULL;
    RingObject *r = direct_ring(c);
    if (r == NULL || nargs < 1) return dispatch_record_slow(self, res, t0, t1, args, nargs, kwnames);
    PyObject *me = args[0];
    PyObject *desc, *mode;
    int bad = 0;
    long long num_tokens, num_reqs = 0, max_q = 0, uq, padded, padded_reqs;
    int m = 2, reason = REASON_HIT;
    int f = (c->in_step > 0 ? 0 : FLAG_OUTSIDE_STEP) | (c->drafter > 0 ? FLAG_DRAFTER : 0);
    if (self->which == 0) { /* V1: (mode, BatchDescriptor) */
        if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) < 2) goto slow;
        mode = PyTuple_GET_ITEM(res, 0);
        desc = PyTuple_GET_ITEM(res, 1);
        if (mode != self->full) { /* a miss: in C when its inputs are the kept ones */
            int hit = miss_match(self, me, mode, desc, args, nargs, kwnames);
            if (hit < 0) goto slow_clear;
            if (hit == 0) goto slow;
            m = self->miss_m;
            reason = self->miss_reason;
        }
        PyObject *nt = nargs > 1 + V1_DISPATCH_AT_NUM_TOKENS ? args[1 + V1_DISPATCH_AT_NUM_TOKENS]
                                                            : kwarg(args, nargs, kwnames, S_num_tokens);
        if (nt == NULL) goto slow;
        num_tokens = obj_ll(nt, &bad);
        PyObject *un = nargs > 1 + V1_DISPATCH_AT_UNIFORM_DECODE
                           ? args[1 + V1_DISPATCH_AT_UNIFORM_DECODE]
                           : kwarg(args, nargs, kwnames, S_uniform_decode);
        if (un != NULL) {
            int t = PyObject_IsTrue(un);
            if (t < 0) goto slow_clear;
            if (t) f |= FLAG_UNIFORM;
        }
        num_reqs = c->phase_num_reqs; /* the runner's phase (0 outside one) */
        max_q = c->phase_max_q;
        uq = attr_ll(me, S_udql, &bad);
        padded = attr_ll(desc, S_num_tokens, &bad);
        padded_reqs = attr_ll(desc, S_num_reqs, &bad);
        if (bad || PyErr_Occurred()) goto slow_clear;
        if (max_q < 0 || max_q > INT32_MAX || uq < 0 || uq > UINT32_MAX) goto slow;
    } else { /* MRV2: BatchExecutionDescriptor */
        PyObject *v[4]; /* positions after self */
        mrv2_inputs(self->pos, args + 1, nargs - 1, args, nargs, kwnames, v);
        Mrv2Hit h;
        int k = mrv2_hit(self->full, me, res, v, &h);
        if (k < 0) goto slow_clear;
        if (k > 0) goto slow;
        num_tokens = h.num_tokens;
        padded = h.padded;
        num_reqs = h.num_reqs;
        padded_reqs = h.padded_reqs;
        max_q = h.max_q;
        uq = h.uq;
        f |= h.f;
    }
    if (c->phase_open) { /* the phase writes it with its span; the last re-dispatch wins */
        core_decide(c, m, reason, f, num_tokens, padded, num_reqs, padded_reqs, max_q, uq);
    } else {
        STAGE_DISPATCH(r, .step = c->step, .mode = m, .reason = reason, .flags = f, .t0 = t0,
                       .t1 = t1, .num_tokens = num_tokens, .padded_tokens = padded,
                       .num_reqs = num_reqs, .padded_reqs = padded_reqs, .max_query_len = max_q,
                       .uniform_decode_query_len = uq);
    }
    return res;
slow_clear:
    PyErr_Clear();
slow: {
    /* the Python record; a V1 miss's (mode, reason) it hands back is kept (miss_store) */
    PyObject *learned = record_result(self, res, t0, t1, args, nargs, kwnames);
    if (learned != NULL && learned != Py_None && self->which == 0 && PyTuple_Check(res) &&
        PyTuple_GET_SIZE(res) >= 2 && PyTuple_GET_ITEM(res, 0) != self->full)
        miss_store(self, args[0], PyTuple_GET_ITEM(res, 0), PyTuple_GET_ITEM(res, 1), args,
                   nargs, kwnames, learned);
    Py_XDECREF(learned);
    return res;
}
}

/* Take the wrapped original, the Python hook it hands off to, and the Core (Step,
   Dispatch, Build); -1 with a TypeError when either callable is not one. */
static int wrap_own(WrapObject *self, PyObject *orig, PyObject *impl, PyObject *core) {
    if (!PyCallable_Check(orig) || !PyCallable_Check(impl)) {
        PyErr_SetString(PyExc_TypeError, "orig and the Python hook must be callable");
        return -1;
    }
    Py_INCREF(orig);
    self->orig = orig;
    Py_INCREF(impl);
    self->impl = impl;
    Py_INCREF(core);
    self->core = (CoreObject *)core;
    return 0;
}

static PyObject *fast_make(PyTypeObject *type, PyObject *args, PyObject *kw) {
    WrapObject *self = (WrapObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    PyObject *orig, *impl, *core, *full = Py_None;
    int which = 0, mrv2 = 0;
    self->pos[0] = self->pos[1] = self->pos[2] = self->pos[3] = -1;
    if (type == &StepType) {
        static char *kwlist[] = {"orig", "impl", "core", "which", "mrv2", NULL};
        if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO!i|p", kwlist, &orig, &impl, &CoreType,
                                         &core, &which, &mrv2))
            goto fail;
        self->vectorcall = (vectorcallfunc)step_call;
    } else {
        static char *kwlist[] = {"orig", "record", "core", "full", "which", "positions", NULL};
        PyObject *pos = NULL;
        if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO!Oi|O", kwlist, &orig, &impl, &CoreType,
                                         &core, &full, &which, &pos))
            goto fail;
        if (pos != NULL && pos != Py_None && !PyArg_ParseTuple(pos, "iiii", &self->pos[0], &self->pos[1],
                                             &self->pos[2], &self->pos[3]))
            goto fail;
        self->vectorcall = (vectorcallfunc)dispatch_call;
    }
    if (wrap_own(self, orig, impl, core) < 0) goto fail;
    self->which = which;
    self->mrv2 = mrv2;
    Py_INCREF(full);
    self->full = full;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static PyTypeObject StepType = WRAP_TYPE(
    Step, fast_make, "Step(orig, impl, core, which, mrv2=False): execute_model/sample_tokens in C.");
static PyTypeObject DispatchType = WRAP_TYPE(
    Dispatch, fast_make,
    "Dispatch(orig, record, core, full, which, positions=None): a FULL hit in C.");



#endif /* PROBE_ACCEL_WRAP_H */
