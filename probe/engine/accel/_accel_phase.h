/* probe.engine.accel._accel, the reorder hooks and the dispatch-phase wrappers. Included once by
 * probe/engine/accel/_accel.c (one translation unit, split by room like CPython's stringlib): not a
 * public header. */
#ifndef PROBE_ACCEL_PHASE_H
#define PROBE_ACCEL_PHASE_H

/* ---------------------------------------------------------------------------------- */
/* Reorder and Phase: probe/engine/hooks/reorder.py and the runner side of dispatch.py in C    */
/*                                                                                    */
/* Each takes two Python functions of its hook: ``impl``, the whole Python wrapper, for  */
/* a call the C path cannot even start (an argument or a batch it cannot read), and     */
/* ``record``, the Python recording of what follows the call, for a result it cannot    */
/* read (anything that is not an exact dict, list, str or int, an overflow, an error).  */
/* Both write the same records as this code, and the Python ones count their faults.    */
/*                                                                                    */
/*   Reorder(orig, record, impl, core, which)                                          */
/*     which 0: V1 ``GPUModelRunner._may_reorder_batch``; record(before, t0, t1, *args,  */
/*              **kwargs) with ``before`` the request ids before the call                 */
/*     which 1: MRV2 ``sort_batch_req_ids``; record(result, t0, t1, *args, **kwargs)      */
/*   Phase(orig, record, impl, core, which, positions)                                 */
/*     which 0: V1 ``_determine_batch_execution_and_padding`` (positions: num_reqs and    */
/*              max_num_scheduled_tokens in args, self included; -1 absent)             */
/*     which 1: MRV2 ``dispatch_cg_and_sync_dp`` in the runner, 2: in a speculator's      */
/*              module (the drafter's decision, a DISPATCH record without Flag.SPAN, and   */
/*              nothing when none was made); record(result, t0, t1, *args, **kwargs)       */
/*              (result None when vLLM raised); positions: num_reqs, num_tokens,           */
/*              uniform_token_count and max_query_len in args (the manager is args[0]);  */
/*              full: vLLM's CUDAGraphMode.FULL. With no decision handed in by a hooked    */
/*              manager (it is hooked only under DP > 1), a FULL hit is read from the      */
/*              descriptor the call returns, a miss's reason by the Python record.         */
/*                                                                                    */
/* The phase hands its state to the dispatcher hooks through the Core's hot fields      */
/* (phase_open, the V1 runner's num_reqs/max_q, the decision ``dec_*``), never a dict.   */
/* ---------------------------------------------------------------------------------- */

static PyObject *S_input_batch, *S_req_ids, *S_sched_out, *S_mnst, *S_need_eager;

typedef struct {
    WrapObject w;     /* orig, impl (the whole Python hook), core, which, pos */
    PyObject *record; /* the Python recording of what follows the call */
    PyObject **snap;  /* Reorder V1: the request ids before the call (strong while busy) */
    Py_ssize_t cap;   /* slots in snap */
    int busy;         /* Reorder V1: snap in use (a nested call takes the Python hook) */
} PhaseObject;

static PyTypeObject ReorderType;
static PyTypeObject PhaseType;

static int phase_init(void) {
#define PINTERN(var, text)                                                                     \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return -1;
    PINTERN(S_input_batch, "input_batch");
    PINTERN(S_req_ids, "req_ids");
    PINTERN(S_sched_out, "scheduler_output");
    PINTERN(S_mnst, ARG_MAX_NUM_SCHEDULED_TOKENS);
    PINTERN(S_need_eager, ARG_NEED_EAGER);
#undef PINTERN
    return 0;
}

/* record(first, t0, t1, *args, **kwargs) (``first`` NULL: left out), keeping the
   exception in flight, if any, as it was; the record function counts its own faults. */
static void call_record(PyObject *record, PyObject *first, int64_t t0, int64_t t1,
                        PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    Py_ssize_t lead = first ? 3 : 2, total = lead + nargs + nk;
    PyObject *small[16];
    PyObject **buf = total <= 16 ? small : PyMem_Malloc((size_t)total * sizeof(PyObject *));
    PyObject *a0 = PyLong_FromLongLong(t0), *a1 = PyLong_FromLongLong(t1);
    if (buf != NULL && a0 != NULL && a1 != NULL) {
        Py_ssize_t i = 0;
        if (first) buf[i++] = first;
        buf[i++] = a0;
        buf[i++] = a1;
        for (Py_ssize_t j = 0; j < nargs + nk; j++) buf[lead + j] = args[j];
        PyObject *r = PyObject_Vectorcall(record, buf, (size_t)(lead + nargs), kwnames);
        Py_XDECREF(r);
    }
    Py_XDECREF(a0);
    Py_XDECREF(a1);
    if (buf != small) PyMem_Free(buf);
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

/* Whether two request ids differ (``x != y``): 1 / 0, or -1 when either is neither a
   str nor None (the Python record compares those). No Python code runs. */
static inline int ids_differ(PyObject *x, PyObject *y) {
    if (x == y) return 0;
    int sx = PyUnicode_CheckExact(x), sy = PyUnicode_CheckExact(y);
    if (sx && sy) return PyUnicode_Compare(x, y) != 0;
    if ((sx || x == Py_None) && (sy || y == Py_None)) return 1; /* None against a str */
    return -1;
}

/* An exact int as a long long: 0 ok, -1 not one or too big (no error left set). */
static inline int exact_ll(PyObject *v, long long *out) {
    if (!PyLong_CheckExact(v)) return -1;
    int of;
    *out = PyLong_AsLongLongAndOverflow(v, &of);
    return of ? -1 : 0;
}

/* ---------------------------------------------------------------------------------- */
/* Reorder                                                                            */
/* ---------------------------------------------------------------------------------- */

static PyObject *reorder_mrv2(PhaseObject *self, PyObject *const *args, size_t nargsf,
                              PyObject *kwnames) {
    WrapObject *w = &self->w;
    CoreObject *c = w->core;
    if (!c->enabled) return PyObject_Vectorcall(w->orig, args, nargsf, kwnames);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    int64_t t0 = now_ns(c);
    PyObject *res = PyObject_Vectorcall(w->orig, args, nargsf, kwnames);
    int64_t t1 = now_ns(c);
    if (res == NULL) return NULL;
    RingObject *r = direct_ring(c);
    if (r == NULL || nargs < 1 || !PyDict_CheckExact(args[0]) || !PyList_CheckExact(res))
        goto slow;
    PyObject *num = args[0];
    PyObject *dv = kwarg(args, nargs, kwnames, S_dql);
    if (dv == NULL && nargs >= 2) dv = args[nargs - 1];
    long long dql = 1;
    if (dv != NULL && (exact_ll(dv, &dql) < 0 || dql < INT32_MIN || dql > INT32_MAX)) goto slow;
    Py_ssize_t pos = 0, i = 0, n_after = PyList_GET_SIZE(res);
    PyObject *k, *v;
    long long moved = 0, nd = 0;
    while (PyDict_Next(num, &pos, &k, &v)) {
        if (!PyLong_CheckExact(v)) goto slow;
        int of;
        long long x = PyLong_AsLongLongAndOverflow(v, &of);
        if (!of && x == dql) nd++; /* an int too big for 64 bits is not dql */
        if (i < n_after) {
            int d = ids_differ(k, PyList_GET_ITEM(res, i));
            if (d < 0) goto slow;
            moved += d;
        }
        i++;
    }
    int f = FLAG_MRV2 | (c->in_step ? 0 : FLAG_OUTSIDE_STEP);
    STAGE_REORDER(r, .step = c->step, .changed = moved > 0, .spec_as_decode = dql > 1, .flags = f,
                  .t0 = t0, .t1 = t1, .threshold = dql, .num_reqs = i, .num_decodes = nd,
                  .num_decode_tokens = nd * dql, .moved = moved);
    return res;
slow:
    call_record(self->record, res, t0, t1, args, nargs, kwnames);
    return res;
}

/* The V1 record from the snapshot: 0 staged, -1 the Python record must write it. */
static int reorder_v1_fast(PhaseObject *self, CoreObject *c, PyObject *me, PyObject *so,
                           Py_ssize_t n, int64_t t0, int64_t t1) {
    RingObject *r = direct_ring(c);
    if (r == NULL) return -1;
    PyObject *ib = PyObject_GetAttr(me, S_input_batch);
    if (ib == NULL) return -1;
    PyObject *after = PyObject_GetAttr(ib, S_req_ids);
    Py_DECREF(ib);
    if (after == NULL) return -1;
    int ok = -1;
    long long thr = -1, uq = 1, moved = 0, nd = 0, ndt = 0;
    PyObject *tv = PyObject_GetAttr(me, S_rbt), *uv = NULL, *counts = NULL;
    if (tv == NULL || !PyList_CheckExact(after)) goto done;
    int has_thr = tv != Py_None;
    if (has_thr && exact_ll(tv, &thr) < 0) goto done;
    uv = PyObject_GetAttr(me, S_udql);
    if (uv == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) goto done;
        PyErr_Clear(); /* getattr(self, "uniform_decode_query_len", 1) */
    } else if (exact_ll(uv, &uq) < 0) {
        goto done;
    }
    counts = PyObject_GetAttr(so, S_num_sched);
    if (counts == NULL || !PyDict_CheckExact(counts)) goto done;
    if (has_thr) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(counts, &pos, &k, &v)) {
            long long x;
            if (exact_ll(v, &x) < 0) goto done;
            if (x <= thr) {
                nd++;
                if (__builtin_add_overflow(ndt, x, &ndt)) goto done;
            }
        }
    }
    Py_ssize_t m = PyList_GET_SIZE(after);
    for (Py_ssize_t i = 0; i < n && i < m; i++) {
        int d = ids_differ(self->snap[i], PyList_GET_ITEM(after, i));
        if (d < 0) goto done;
        moved += d;
    }
    int f = c->in_step ? 0 : FLAG_OUTSIDE_STEP;
    int spec = has_thr && uq > 1 && thr >= uq;
    STAGE_REORDER(r, .step = c->step, .changed = moved > 0, .spec_as_decode = spec, .flags = f,
                  .t0 = t0, .t1 = t1, .threshold = has_thr ? thr : -1, .num_reqs = n,
                  .num_decodes = nd, .num_decode_tokens = ndt, .moved = moved);
    ok = 0;
done:
    Py_XDECREF(tv);
    Py_XDECREF(uv);
    Py_XDECREF(counts);
    Py_DECREF(after);
    PyErr_Clear();
    return ok;
}

static PyObject *reorder_v1(PhaseObject *self, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames) {
    WrapObject *w = &self->w;
    CoreObject *c = w->core;
    if (!c->enabled) return PyObject_Vectorcall(w->orig, args, nargsf, kwnames);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->busy || nargs < 1) goto impl;
    PyObject *so = nargs > 1 ? args[1] : kwarg(args, nargs, kwnames, S_sched_out);
    if (so == NULL) goto impl;
    PyObject *ib = PyObject_GetAttr(args[0], S_input_batch);
    if (ib == NULL) goto impl_clear;
    PyObject *ids = PyObject_GetAttr(ib, S_req_ids);
    Py_DECREF(ib);
    if (ids == NULL) goto impl_clear;
    Py_ssize_t n = PyList_CheckExact(ids) ? PyList_GET_SIZE(ids) : -1;
    if (n > self->cap) { /* grows once to the largest batch seen, then reused */
        Py_ssize_t cap = n < 64 ? 64 : n;
        PyObject **snap = PyMem_Realloc(self->snap, (size_t)cap * sizeof(PyObject *));
        if (snap == NULL) n = -1;
        else {
            self->snap = snap;
            self->cap = cap;
        }
    }
    if (n < 0) {
        Py_DECREF(ids);
        goto impl;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyList_GET_ITEM(ids, i);
        Py_INCREF(x);
        self->snap[i] = x;
    }
    Py_DECREF(ids);
    self->busy = 1;
    int64_t t0 = now_ns(c);
    PyObject *res = PyObject_Vectorcall(w->orig, args, nargsf, kwnames);
    int64_t t1 = now_ns(c);
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb); /* the record is written when vLLM raised, too */
    if (reorder_v1_fast(self, c, args[0], so, n, t0, t1) < 0) {
        PyObject *before = PyList_New(n);
        if (before != NULL) {
            for (Py_ssize_t i = 0; i < n; i++) {
                Py_INCREF(self->snap[i]);
                PyList_SET_ITEM(before, i, self->snap[i]);
            }
            call_record(self->record, before, t0, t1, args, nargs, kwnames);
            Py_DECREF(before);
        }
        PyErr_Clear();
    }
    for (Py_ssize_t i = 0; i < n; i++) Py_DECREF(self->snap[i]);
    self->busy = 0;
    PyErr_Restore(et, ev, tb);
    return res;
impl_clear:
    PyErr_Clear();
impl:
    return PyObject_Vectorcall(w->impl, args, nargsf, kwnames);
}

/* ---------------------------------------------------------------------------------- */
/* Phase: the runner's dispatch phase                                                 */
/* ---------------------------------------------------------------------------------- */

/* The int argument at ``pos`` (or keyword ``name``); absent -> 0, None -> 0 when
   ``none_ok`` (``v or 0``); -1 when it is not an exact int that fits. */
static inline int arg_ll(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, int pos,
                         PyObject *name, int none_ok, long long *out) {
    PyObject *v = (pos >= 0 && pos < nargs) ? args[pos] : kwarg(args, nargs, kwnames, name);
    *out = 0;
    if (v == NULL || (none_ok && v == Py_None)) return 0;
    return exact_ll(v, out);
}

static inline void phase_reset(CoreObject *c) {
    c->phase_open = 0;
    c->decided = 0;
    c->phase_num_reqs = 0;
    c->phase_max_q = 0;
}

/* End of the phase: its decision and span in one DISPATCH record, or a plain span.
   0 written; -1 the Python record must do it (the fields are left as they were). */
static int phase_close(PhaseObject *self, CoreObject *c, PyObject *res, int64_t t0,
                       int64_t t1, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    RingObject *r = direct_ring(c);
    if (r == NULL) return -1;
    int mrv2 = self->w.which >= 1, draft = self->w.which == 2;
    if (mrv2) { /* need_eager skips the manager: the step runs eager (FORCED_EAGER) */
        PyObject *ne = kwarg(args, nargs, kwnames, S_need_eager);
        int t = ne == NULL ? 0 : PyObject_IsTrue(ne);
        if (t < 0) {
            PyErr_Clear();
            return -1;
        }
        if (t && c->in_step) {
            long long nr, nt;
            if (arg_ll(args, nargs, kwnames, self->w.pos[0], S_num_reqs, 0, &nr) < 0 ||
                arg_ll(args, nargs, kwnames, self->w.pos[1], S_num_tokens, 0, &nt) < 0)
                return -1;
            c->dec_mode = 0;
            c->dec_reason = REASON_FORCED_EAGER;
            c->dec_flags = FLAG_MRV2 | (c->drafter || draft ? FLAG_DRAFTER : 0);
            c->dec_num_tokens = c->dec_padded_tokens = nt;
            c->dec_num_reqs = c->dec_padded_reqs = nr;
            c->dec_max_q = c->dec_uq = 0;
            c->decided = 1;
        } else if (!t && !c->decided && res != NULL) { /* the manager's decision, returned */
            if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) < 1 || nargs < 1) return -1;
            PyObject *v[4];
            mrv2_inputs(self->w.pos, args, nargs, args, nargs, kwnames, v);
            Mrv2Hit h;
            int k = mrv2_hit(self->w.full, args[0], PyTuple_GET_ITEM(res, 0), v, &h);
            if (k != 0) { /* a miss (its reason), or a count only Python reads */
                PyErr_Clear();
                return -1;
            }
            int f = h.f | (c->in_step ? 0 : FLAG_OUTSIDE_STEP) |
                    (c->drafter || draft ? FLAG_DRAFTER : 0);
            core_decide(c, 2, REASON_HIT, f, h.num_tokens, h.padded, h.num_reqs, h.padded_reqs,
                        h.max_q, h.uq);
        }
    }
    if (c->decided) {
        long long fl = c->dec_flags | (draft ? 0 : FLAG_SPAN);
        if (c->dec_mode < 0 || c->dec_mode > 255 || c->dec_reason < 0 || c->dec_reason > 255 ||
            fl < 0 || fl > 255 || c->dec_max_q < INT32_MIN || c->dec_max_q > INT32_MAX)
            return -1; /* set by a Python record: its packer says what is wrong */
        STAGE_DISPATCH(r, .step = c->step, .mode = c->dec_mode, .reason = c->dec_reason,
                       .flags = fl, .t0 = t0, .t1 = t1, .num_tokens = c->dec_num_tokens,
                       .padded_tokens = c->dec_padded_tokens, .num_reqs = c->dec_num_reqs,
                       .padded_reqs = c->dec_padded_reqs, .max_query_len = c->dec_max_q,
                       .uniform_decode_query_len = c->dec_uq);
    } else if (!draft) {
        int f = (mrv2 ? FLAG_MRV2 : 0) | (c->in_step ? 0 : FLAG_OUTSIDE_STEP) |
                (c->drafter ? FLAG_DRAFTER : 0);
        STAGE_SPAN(r, .step = c->step, .phase = PHASE_DISPATCH, .flags = f, .t0 = t0, .t1 = t1);
    }
    phase_reset(c);
    return 0;
}

static PyObject *phase_call(PhaseObject *self, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames) {
    WrapObject *w = &self->w;
    CoreObject *c = w->core;
    if (!c->enabled) return PyObject_Vectorcall(w->orig, args, nargsf, kwnames);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (w->which == 0) {
        long long nr, mq;
        if (arg_ll(args, nargs, kwnames, w->pos[0], S_num_reqs, 1, &nr) < 0 ||
            arg_ll(args, nargs, kwnames, w->pos[1], S_mnst, 1, &mq) < 0)
            return PyObject_Vectorcall(w->impl, args, nargsf, kwnames);
        c->phase_num_reqs = nr;
        c->phase_max_q = mq;
    }
    c->decided = 0;
    c->phase_open = 1;
    int64_t t0 = now_ns(c);
    PyObject *res = PyObject_Vectorcall(w->orig, args, nargsf, kwnames);
    int64_t t1 = now_ns(c);
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb); /* the phase closes when vLLM raised, too */
    if (phase_close(self, c, res, t0, t1, args, nargs, kwnames) < 0)
        call_record(self->record, w->which ? (res ? res : Py_None) : NULL, t0, t1, args, nargs,
                    kwnames);
    PyErr_Restore(et, ev, tb);
    return res;
}

/* ---------------------------------------------------------------------------------- */
/* types                                                                              */
/* ---------------------------------------------------------------------------------- */

static PyObject *phase_make(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PhaseObject *self = (PhaseObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    PyObject *orig, *record, *impl, *core, *pos = NULL, *full = Py_None;
    int which = 0;
    self->w.pos[0] = self->w.pos[1] = self->w.pos[2] = self->w.pos[3] = -1;
    static char *kwlist[] = {"orig", "record", "impl", "core", "which", "positions", "full",
                             NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO!i|OO", kwlist, &orig, &record, &impl,
                                     &CoreType, &core, &which, &pos, &full))
        goto fail;
    int most = type == &ReorderType ? 1 : 2;
    if (which < 0 || which > most) {
        PyErr_Format(PyExc_ValueError, "which must be 0 (V1) to %d (MRV2), got %d", most, which);
        goto fail;
    }
    if (pos != NULL && pos != Py_None &&
        !(which == 0 ? PyArg_ParseTuple(pos, "ii", &self->w.pos[0], &self->w.pos[1])
                     : PyArg_ParseTuple(pos, "iiii", &self->w.pos[0], &self->w.pos[1],
                                        &self->w.pos[2], &self->w.pos[3])))
        goto fail;
    Py_INCREF(full);
    self->w.full = full;
    if (!PyCallable_Check(record)) {
        PyErr_SetString(PyExc_TypeError, "record must be callable");
        goto fail;
    }
    if (wrap_own(&self->w, orig, impl, core) < 0) goto fail;
    Py_INCREF(record);
    self->record = record;
    self->w.which = which;
    if (type == &ReorderType)
        self->w.vectorcall = (vectorcallfunc)(which ? reorder_mrv2 : reorder_v1);
    else
        self->w.vectorcall = (vectorcallfunc)phase_call;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static int phase_traverse(PhaseObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->record);
    return wrap_traverse(&self->w, visit, arg);
}

static int phase_clear(PhaseObject *self) {
    Py_CLEAR(self->record);
    return wrap_clear(&self->w);
}

static void phase_dealloc(PhaseObject *self) {
    PyObject_GC_UnTrack(self);
    if (self->w.weakrefs) PyObject_ClearWeakRefs((PyObject *)self);
    phase_clear(self);
    PyMem_Free(self->snap); /* never busy here: a call in flight holds a reference */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define PHASE_TYPE(NAME, DOC)                                                                  \
    {                                                                                          \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = "probe.engine.accel._accel." #NAME,                       \
        .tp_basicsize = sizeof(PhaseObject),                                                   \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |     \
                    Py_TPFLAGS_METHOD_DESCRIPTOR,                                              \
        .tp_doc = DOC, .tp_new = phase_make, .tp_dealloc = (destructor)phase_dealloc,          \
        .tp_traverse = (traverseproc)phase_traverse, .tp_clear = (inquiry)phase_clear,         \
        .tp_call = PyVectorcall_Call, .tp_vectorcall_offset = offsetof(WrapObject, vectorcall), \
        .tp_descr_get = wrap_get, .tp_dictoffset = offsetof(WrapObject, dict),                 \
        .tp_weaklistoffset = offsetof(WrapObject, weakrefs), .tp_members = wrap_members,       \
        .tp_getset = wrap_getset, .tp_methods = wrap_methods, .tp_repr = (reprfunc)wrap_repr,  \
        .tp_getattro = PyObject_GenericGetAttr, .tp_setattro = PyObject_GenericSetAttr,        \
    }

static PyTypeObject ReorderType = PHASE_TYPE(
    Reorder, "Reorder(orig, record, impl, core, which): a batch-reorder decision in C.");
static PyTypeObject PhaseType = PHASE_TYPE(
    Phase, "Phase(orig, record, impl, core, which, positions=None): the dispatch phase in C.");

#endif /* PROBE_ACCEL_PHASE_H */
