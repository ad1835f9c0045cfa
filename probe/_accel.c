/*
 * probe._accel: the compiled hot path of vllm-graph-probe.
 *
 * Everything here runs inside vLLM, on the thread whose host time the probe measures, and
 * always with the GIL held (so no lock is needed: a call is atomic with respect to the
 * other Python threads of the process). It does the per-call work and nothing else:
 *
 *   Core      base type of probe.runtime.Runtime: the hot state (enabled, step, in_step,
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
 * A wrapper never swallows or changes vLLM's result or exception; no function here raises
 * on the hot path except for arguments that cannot be packed (the calling Python hook
 * catches that and disables itself). Pure-Python equivalents: probe/accel.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define REC 64
#define HEADER 128
#define W_WRITE 4
#define W_DROPPED 5
#define W_READ 8
#define STAGE_N 256

#define KIND_SPAN 1
#define FLAG_DRAFTER 1
#define FLAG_OUTSIDE 2

static inline int64_t boottime(void) {
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---------------------------------------------------------------------------------- */
/* Core                                                                               */
/* ---------------------------------------------------------------------------------- */

struct RingObject;

typedef struct {
    PyObject_HEAD
    int enabled;
    int in_step;
    int drafter;
    int in_build;
    int sampling;
    int gpu_timing;
    long long step;
    long long sample_every;
    long long sample_n;
    long long timer_every; /* >0: the GPU timer samples 1 step in N (Python handles those) */
    struct RingObject *ring; /* strong; the ring the packers and spans stage into */
} CoreObject;

static PyTypeObject CoreType;

static PyMemberDef core_members[] = {
    {"enabled", T_INT, offsetof(CoreObject, enabled), 0, "records are written"},
    {"in_step", T_INT, offsetof(CoreObject, in_step), 0, ">0 inside execute_model/sample_tokens"},
    {"drafter", T_INT, offsetof(CoreObject, drafter), 0, ">0 inside the MTP drafter"},
    {"in_build", T_INT, offsetof(CoreObject, in_build), 0, "inside a metadata build"},
    {"sampling", T_INT, offsetof(CoreObject, sampling), 0, "attached with sample_every > 1"},
    {"gpu_timing", T_INT, offsetof(CoreObject, gpu_timing), 0, "device events on"},
    {"step", T_LONGLONG, offsetof(CoreObject, step), 0, "the current step number"},
    {"sample_every", T_LONGLONG, offsetof(CoreObject, sample_every), 0, "record 1 step in N"},
    {"sample_n", T_LONGLONG, offsetof(CoreObject, sample_n), 0, "steps seen while sampling"},
    {"timer_every", T_LONGLONG, offsetof(CoreObject, timer_every), 0,
     "GPU timer period in steps (0: no timer)"},
    {NULL}};

/* ---------------------------------------------------------------------------------- */
/* Ring                                                                               */
/* ---------------------------------------------------------------------------------- */

typedef struct RingObject {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
    uint8_t *base;
    volatile uint64_t *hdr;
    uint64_t capacity, mask, w, r, drops;
    CoreObject *core; /* borrowed; set by bind(), cleared by unbind() */
    Py_ssize_t nstage;
    uint8_t stage[STAGE_N * REC];
} RingObject;

static PyTypeObject RingType;

static void ring_publish_dropped(RingObject *r) {
    if (r->has_view) __atomic_store_n(&r->hdr[W_DROPPED], r->drops, __ATOMIC_RELAXED);
}

/* Copy n records into the ring under one publish; returns how many fit. */
static Py_ssize_t ring_commit(RingObject *r, const uint8_t *recs, Py_ssize_t n) {
    if (!r->has_view) {
        r->drops += (uint64_t)n;
        return 0;
    }
    uint64_t w = r->w;
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        if (w - r->r >= r->capacity) {
            r->r = __atomic_load_n(&r->hdr[W_READ], __ATOMIC_ACQUIRE);
            if (w - r->r >= r->capacity) {
                r->drops += (uint64_t)(n - i);
                ring_publish_dropped(r);
                break;
            }
        }
        memcpy(r->base + HEADER + (w & r->mask) * REC, recs + i * REC, REC);
        w++;
    }
    if (w != r->w) {
        r->w = w;
        __atomic_store_n(&r->hdr[W_WRITE], w, __ATOMIC_RELEASE); /* after the slots */
    }
    return i;
}

static inline void ring_flush(RingObject *r) {
    if (r->nstage) {
        Py_ssize_t n = r->nstage;
        r->nstage = 0;
        ring_commit(r, r->stage, n);
    }
}

/* A free staging slot (flushing first when the buffer is full). */
static inline uint8_t *ring_slot(RingObject *r) {
    if (r->nstage == STAGE_N) ring_flush(r);
    return r->stage + (r->nstage++) * REC;
}

/* After staging: outside a step, the record goes to the ring at once. */
static inline void ring_staged(RingObject *r) {
    if (r->core == NULL || r->core->in_step <= 0) ring_flush(r);
}

static inline void put_u64(uint8_t *p, int64_t v) { memcpy(p, &v, 8); }

static void ring_stage_span(RingObject *r, int phase, int flags, long long step, int64_t t0,
                            int64_t t1) {
    uint8_t *p = ring_slot(r);
    memset(p, 0, REC);
    p[0] = KIND_SPAN;
    p[1] = (uint8_t)phase;
    p[3] = (uint8_t)flags;
    uint32_t s = (uint32_t)step;
    memcpy(p + 4, &s, 4);
    put_u64(p + 8, t0);
    put_u64(p + 16, t1);
    ring_staged(r);
}

static void ring_stage_wire(RingObject *r, int kind, int a, int b, int c, long long step,
                            int64_t t0, int64_t t1, int64_t v0, int64_t v1, int64_t v2,
                            int64_t v3, int64_t v4) {
    uint8_t *p = ring_slot(r);
    p[0] = (uint8_t)kind;
    p[1] = (uint8_t)a;
    p[2] = (uint8_t)b;
    p[3] = (uint8_t)c;
    uint32_t s = (uint32_t)step;
    memcpy(p + 4, &s, 4);
    int64_t v[7] = {t0, t1, v0, v1, v2, v3, v4};
    memcpy(p + 8, v, 56);
    ring_staged(r);
}

static int ring_init(RingObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer", "capacity", NULL};
    PyObject *buf;
    unsigned long long cap;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OK", kwlist, &buf, &cap)) return -1;
    if (cap == 0 || (cap & (cap - 1))) {
        PyErr_Format(PyExc_ValueError, "capacity must be a power of two, got %llu", cap);
        return -1;
    }
    if (self->has_view) {
        PyErr_SetString(PyExc_RuntimeError, "Ring already initialised");
        return -1;
    }
    if (PyObject_GetBuffer(buf, &self->view, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0) return -1;
    if ((unsigned long long)self->view.len < HEADER + cap * REC) {
        PyBuffer_Release(&self->view);
        PyErr_Format(PyExc_ValueError, "buffer of %zd bytes is too small for %llu records",
                     self->view.len, cap);
        return -1;
    }
    self->has_view = 1;
    self->base = (uint8_t *)self->view.buf;
    self->hdr = (volatile uint64_t *)self->view.buf;
    self->capacity = cap;
    self->mask = cap - 1;
    self->w = __atomic_load_n(&self->hdr[W_WRITE], __ATOMIC_RELAXED);
    self->r = __atomic_load_n(&self->hdr[W_READ], __ATOMIC_ACQUIRE);
    self->drops = __atomic_load_n(&self->hdr[W_DROPPED], __ATOMIC_RELAXED);
    self->nstage = 0;
    self->core = NULL;
    return 0;
}

static void ring_unbind_core(RingObject *self) {
    CoreObject *c = self->core;
    if (c != NULL) {
        self->core = NULL;
        if (c->ring == self) {
            c->ring = NULL;
            Py_DECREF(self);
        }
    }
}

static void ring_dealloc(RingObject *self) {
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Parse 12 wire values into one 64-byte record. */
static int pack_wire(uint8_t *p, PyObject *const *args) {
    long long v[12];
    for (int i = 0; i < 12; i++) {
        v[i] = PyLong_AsLongLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred()) return -1;
    }
    for (int i = 0; i < 4; i++) {
        if (v[i] < 0 || v[i] > 255) {
            PyErr_Format(PyExc_ValueError, "wire field %d = %lld is not in 0..255", i, v[i]);
            return -1;
        }
        p[i] = (uint8_t)v[i];
    }
    uint32_t s = (uint32_t)v[4];
    memcpy(p + 4, &s, 4);
    for (int i = 5; i < 12; i++) put_u64(p + 8 + (i - 5) * 8, v[i]);
    return 0;
}

/* The 12 wire values of a write/stage call into one record; -1 with an error set. */
static int pack_call(uint8_t *rec, PyObject *const *args, Py_ssize_t nargs, const char *what) {
    if (nargs != 12) {
        PyErr_Format(PyExc_TypeError, "%s takes 12 wire values, got %zd", what, nargs);
        return -1;
    }
    return pack_wire(rec, args);
}

static PyObject *ring_write(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint8_t rec[REC];
    if (pack_call(rec, args, nargs, "write") < 0) return NULL;
    ring_flush(self);
    return PyBool_FromLong(ring_commit(self, rec, 1));
}

static PyObject *ring_stage(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint8_t rec[REC];
    if (pack_call(rec, args, nargs, "stage") < 0) return NULL;
    memcpy(ring_slot(self), rec, REC);
    ring_staged(self);
    Py_RETURN_TRUE;
}

static PyObject *ring_write_raw(RingObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    if (b.len != REC) {
        PyBuffer_Release(&b);
        PyErr_Format(PyExc_ValueError, "a raw record must be %d bytes, got %zd", REC, b.len);
        return NULL;
    }
    uint8_t rec[REC];
    memcpy(rec, b.buf, REC);
    PyBuffer_Release(&b);
    ring_flush(self);
    return PyBool_FromLong(ring_commit(self, rec, 1));
}

static PyObject *ring_write_many(RingObject *self, PyObject *seq) {
    PyObject *fast = PySequence_Fast(seq, "write_many takes a sequence of records");
    if (fast == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    uint8_t *buf = PyMem_Malloc(n ? n * REC : 1);
    if (buf == NULL) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PySequence_Fast(PySequence_Fast_GET_ITEM(fast, i), "a record is a tuple");
        if (t == NULL || PySequence_Fast_GET_SIZE(t) != 12) {
            if (t != NULL) {
                PyErr_SetString(PyExc_TypeError, "a record is 12 wire values");
                Py_DECREF(t);
            }
            PyMem_Free(buf);
            Py_DECREF(fast);
            return NULL;
        }
        int bad = pack_wire(buf + i * REC, PySequence_Fast_ITEMS(t));
        Py_DECREF(t);
        if (bad) {
            PyMem_Free(buf);
            Py_DECREF(fast);
            return NULL;
        }
    }
    ring_flush(self);
    Py_ssize_t done = ring_commit(self, buf, n);
    PyMem_Free(buf);
    Py_DECREF(fast);
    return PyLong_FromSsize_t(done);
}

static PyObject *ring_flush_m(RingObject *self, PyObject *Py_UNUSED(x)) {
    ring_flush(self);
    Py_RETURN_NONE;
}

static PyObject *ring_total_dropped(RingObject *self, PyObject *Py_UNUSED(x)) {
    return PyLong_FromUnsignedLongLong(self->drops);
}

static PyObject *ring_written(RingObject *self, PyObject *Py_UNUSED(x)) {
    return PyLong_FromUnsignedLongLong(self->w);
}

static PyObject *ring_publish_dropped_m(RingObject *self, PyObject *Py_UNUSED(x)) {
    ring_publish_dropped(self);
    Py_RETURN_NONE;
}

static PyObject *ring_bind(RingObject *self, PyObject *core) {
    if (!PyObject_TypeCheck(core, &CoreType)) {
        PyErr_SetString(PyExc_TypeError, "bind takes a Core");
        return NULL;
    }
    CoreObject *c = (CoreObject *)core;
    ring_unbind_core(self);
    if (c->ring != NULL) {
        RingObject *old = c->ring;
        ring_flush(old);
        old->core = NULL;
        c->ring = NULL;
        Py_DECREF(old);
    }
    Py_INCREF(self);
    c->ring = self;
    self->core = c;
    Py_RETURN_NONE;
}

static PyObject *ring_unbind(RingObject *self, PyObject *Py_UNUSED(x)) {
    ring_flush(self);
    ring_unbind_core(self);
    Py_RETURN_NONE;
}

static PyObject *ring_release(RingObject *self, PyObject *Py_UNUSED(x)) {
    /* Stop writing for good and give the mapping back (before mmap.close()). */
    ring_flush(self);
    ring_publish_dropped(self);
    ring_unbind_core(self);
    if (self->has_view) {
        self->has_view = 0;
        PyBuffer_Release(&self->view);
    }
    Py_RETURN_NONE;
}

static PyObject *ring_disown(RingObject *self, PyObject *Py_UNUSED(x)) {
    /* In a forked child: the mapping is the parent's ring. Drop what was staged and
       release it without writing anything. */
    self->nstage = 0;
    ring_unbind_core(self);
    if (self->has_view) {
        self->has_view = 0;
        PyBuffer_Release(&self->view);
    }
    Py_RETURN_NONE;
}

static PyObject *packer_new_for(RingObject *ring, PyObject *args);

static PyMethodDef ring_methods[] = {
    {"write", (PyCFunction)(void (*)(void))ring_write, METH_FASTCALL,
     "write(kind, a, b, c, step, t0, t1, v0..v4) -> bool: commit one record now"},
    {"stage", (PyCFunction)(void (*)(void))ring_stage, METH_FASTCALL,
     "stage(kind, a, ..., v4) -> True: into the step buffer (committed outside a step)"},
    {"write_raw", (PyCFunction)ring_write_raw, METH_O, "commit one pre-packed 64-byte record"},
    {"write_many", (PyCFunction)ring_write_many, METH_O,
     "commit a sequence of 12-value tuples under one publish; returns how many fit"},
    {"flush", (PyCFunction)ring_flush_m, METH_NOARGS, "commit the step buffer"},
    {"total_dropped", (PyCFunction)ring_total_dropped, METH_NOARGS, "records dropped so far"},
    {"written", (PyCFunction)ring_written, METH_NOARGS, "records committed so far"},
    {"publish_dropped", (PyCFunction)ring_publish_dropped_m, METH_NOARGS,
     "store the drop count in the header"},
    {"bind", (PyCFunction)ring_bind, METH_O, "stage spans and packers of this Core here"},
    {"unbind", (PyCFunction)ring_unbind, METH_NOARGS, "flush and forget the Core"},
    {"release", (PyCFunction)ring_release, METH_NOARGS,
     "flush, publish the drops and release the mapping; later writes are drops"},
    {"disown", (PyCFunction)ring_disown, METH_NOARGS,
     "forked child: drop the staged records and release the mapping without writing"},
    {"packer", (PyCFunction)packer_new_for, METH_VARARGS,
     "packer(kind, layout) -> Packer staging into this ring"},
    {NULL}};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "probe._accel.Ring",
    .tp_basicsize = sizeof(RingObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Ring(buffer, capacity): the compiled writer of one shared-memory ring.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ring_init,
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_methods = ring_methods,
};

/* ---------------------------------------------------------------------------------- */
/* Packer                                                                             */
/* ---------------------------------------------------------------------------------- */

#define MAXF 20

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    RingObject *ring;
    int kind;
    int nfields;
    signed char slot[MAXF]; /* 0..10: a b c step t0 t1 v0..v4 */
    signed char part[MAXF]; /* 0 whole, 1 hi, 2 lo */
    signed char bias[MAXF];
} PackerObject;

static PyTypeObject PackerType;

static PyObject *packer_call(PackerObject *self, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != self->nfields || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_Format(PyExc_TypeError, "packer of kind %d takes %d positional fields, got %zd",
                     self->kind, self->nfields, nargs);
        return NULL;
    }
    int64_t w[11] = {0};
    for (int i = 0; i < self->nfields; i++) {
        long long v = PyLong_AsLongLong(args[i]);
        if (v == -1 && PyErr_Occurred()) return NULL;
        v += self->bias[i];
        int s = self->slot[i];
        switch (self->part[i]) {
        case 1:
            if (v < INT32_MIN || v > INT32_MAX) {
                PyErr_Format(PyExc_OverflowError, "field %d = %lld does not fit 31 bits", i, v);
                return NULL;
            }
            w[s] |= (int64_t)((uint64_t)v << 32);
            break;
        case 2:
            w[s] |= (int64_t)(uint32_t)v;
            break;
        default:
            w[s] = v;
        }
    }
    for (int s = 0; s < 3; s++) {
        if (w[s] < 0 || w[s] > 255) {
            PyErr_Format(PyExc_ValueError, "slot %d = %lld is not in 0..255", s, (long long)w[s]);
            return NULL;
        }
    }
    RingObject *r = self->ring;
    uint8_t *p = ring_slot(r);
    p[0] = (uint8_t)self->kind;
    p[1] = (uint8_t)w[0];
    p[2] = (uint8_t)w[1];
    p[3] = (uint8_t)w[2];
    uint32_t st = (uint32_t)w[3];
    memcpy(p + 4, &st, 4);
    for (int s = 4; s < 11; s++) put_u64(p + 8 + (s - 4) * 8, w[s]);
    ring_staged(r);
    Py_RETURN_TRUE;
}

static PyObject *packer_new_for(RingObject *ring, PyObject *args) {
    int kind;
    PyObject *layout;
    if (!PyArg_ParseTuple(args, "iO", &kind, &layout)) return NULL;
    PyObject *fast = PySequence_Fast(layout, "layout is a sequence of (slot, part, bias)");
    if (fast == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > MAXF || kind < 0 || kind > 255) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "bad kind or too many fields");
        return NULL;
    }
    PackerObject *p = PyObject_New(PackerObject, &PackerType);
    if (p == NULL) {
        Py_DECREF(fast);
        return NULL;
    }
    p->vectorcall = (vectorcallfunc)packer_call;
    p->kind = kind;
    p->nfields = (int)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        int s, part, bias;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "iii", &s, &part, &bias) ||
            s < 0 || s > 10 || part < 0 || part > 2 || (part && s < 6)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad layout entry");
            Py_DECREF(fast);
            p->ring = NULL;
            Py_DECREF(p);
            return NULL;
        }
        p->slot[i] = (signed char)s;
        p->part[i] = (signed char)part;
        p->bias[i] = (signed char)bias;
    }
    Py_DECREF(fast);
    Py_INCREF(ring);
    p->ring = ring;
    return (PyObject *)p;
}

static void packer_dealloc(PackerObject *self) {
    Py_XDECREF(self->ring);
    PyObject_Free(self);
}

static PyTypeObject PackerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "probe._accel.Packer",
    .tp_basicsize = sizeof(PackerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A record kind's positional packer (Ring.packer).",
    .tp_dealloc = (destructor)packer_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(PackerObject, vectorcall),
};

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
    int sampling;  /* Gate: call the hook while sampling even when off */
    PyObject *full; /* Dispatch: vLLM's CUDAGraphMode.FULL */
    int which;      /* Step: 0 execute_model, 1 sample_tokens; Dispatch: 0 V1, 1 MRV2 */
    int mrv2;       /* Step: Flag.MRV2 on its spans */
    int pos[4];     /* Dispatch MRV2: num_reqs, num_tokens, uniform_token_count,
                       max_query_len positions after self (-1: absent) */
    PyObject *i32, *i64;   /* Build: torch.int32 and torch.int64 (None without torch) */
    PyObject *last_type;     /* Build: the builder class last interned (strong) */
    long long last_ident;    /* Build: its string id */
} WrapObject;

static PyTypeObject SpanType;
static PyTypeObject GateType;

/* No compiled ring bound (a Python writer is attached): write through ``core.put.span``
   like the Python hook would, keeping vLLM's exception (if any) as it was. */
static void span_fallback(CoreObject *c, int phase, int flags, long long step, int64_t t0,
                          int64_t t1) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *put = PyObject_GetAttrString((PyObject *)c, "put");
    if (put != NULL) {
        PyObject *fn = PyObject_GetAttrString(put, "span");
        Py_DECREF(put);
        if (fn != NULL) {
            PyObject *r = PyObject_CallFunction(fn, "LiLLiii", step, phase, (long long)t0,
                                                (long long)t1, flags, 0, 0);
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
    int64_t t0 = boottime();
    PyObject *res = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    int64_t t1 = boottime();
    if (self->drafter) c->drafter--;
    RingObject *r = c->ring;
    int f = (c->in_step > 0 ? 0 : FLAG_OUTSIDE) | (c->drafter > 0 ? FLAG_DRAFTER : 0);
    if (r != NULL)
        ring_stage_span(r, self->phase, f, c->step, t0, t1);
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
    int a = 0, b = 0;
    if (type == &SpanType) {
        static char *kwlist[] = {"orig", "core", "phase", "drafter", NULL};
        if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!i|p", kwlist, &orig, &CoreType, &core,
                                         &a, &b))
            goto fail;
        self->vectorcall = (vectorcallfunc)span_call;
        self->phase = a;
        self->drafter = b;
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
    Py_VISIT(self->i32);
    Py_VISIT(self->i64);
    Py_VISIT(self->last_type);
    return 0;
}

static int wrap_clear(WrapObject *self) {
    Py_CLEAR(self->dict);
    Py_CLEAR(self->orig);
    Py_CLEAR(self->impl);
    Py_CLEAR(self->core);
    Py_CLEAR(self->full);
    Py_CLEAR(self->i32);
    Py_CLEAR(self->i64);
    Py_CLEAR(self->last_type);
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
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = "probe._accel." #NAME,                       \
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
    WRAP_TYPE(Span, wrap_make, "Span(orig, core, phase, drafter=False): a compiled phase-span hook.");
static PyTypeObject GateType =
    WRAP_TYPE(Gate, wrap_make, "Gate(orig, impl, core, sampling=False): the dormant path in C.");


/* ---------------------------------------------------------------------------------- */
/* Step and Dispatch: the common path of two Python hooks, in C                         */
/*                                                                                    */
/* Each takes the Python hook (``impl``) too and hands it every call off the common    */
/* path (sampling, the first step, the GPU timer's steps, a dispatch miss, anything it  */
/* cannot read), so both write the same records.                                       */
/* ---------------------------------------------------------------------------------- */

#define KIND_DISPATCH 2
#define FLAG_UNIFORM 4
#define FLAG_MRV2 8
#define PHASE_EXECUTE 1
#define PHASE_SAMPLE_TOKENS 2
#define REASON_HIT 1

static PyObject *S_total, *S_num_sched, *S_on_first_step, *S_pending, *S_open, *S_decision,
    *S_num_reqs, *S_max_q, *S_num_tokens, *S_cg_mode, *S_uniform_decode, *S_udql, *S_dql,
    *S_uniform_token_count, *S_max_query_len, *S_dummy_run, *S_is_profile;



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

static PyObject *step_call(WrapObject *self, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames) {
    CoreObject *c = self->core;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (!c->enabled && !c->sampling) return PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    RingObject *r = c->ring;
    long long every = c->timer_every;
    if (c->sampling || r == NULL) goto slow;
    if (self->which == 0) {
        if (nargs < 2 || (every > 0 && (c->step + 1) % every == 0) || has_first_step(c)) goto slow;
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
        c->step++;
        c->in_step++;
        int64_t t0 = boottime();
        PyObject *res = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
        int64_t t1 = boottime();
        c->in_step--;
        if (c->ring != NULL)
            ring_stage_wire(c->ring, KIND_SPAN, PHASE_EXECUTE, 0, self->mrv2 ? FLAG_MRV2 : 0,
                            c->step, t0, t1, ntok, nreq, 0, 0, 0);
        return res;
    }
    if (!c->enabled) goto slow;
    if (every > 0 && (c->step % every == 0 || (c->step + 1) % every == 0)) goto slow;
    c->in_step++;
    int64_t t0 = boottime();
    PyObject *res = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    int64_t t1 = boottime();
    c->in_step--;
    if (c->ring != NULL)
        ring_stage_wire(c->ring, KIND_SPAN, PHASE_SAMPLE_TOKENS, 0, self->mrv2 ? FLAG_MRV2 : 0,
                        c->step, t0, t1, 0, 0, 0, 0, 0);
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

static PyObject *dispatch_record_slow(WrapObject *self, PyObject *res, int64_t t0, int64_t t1,
                                      PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames) {
    /* record(result, t0, t1, *args, **kwargs): the Python hook's own recording */
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject **buf = PyMem_Malloc((size_t)(3 + nargs + nk) * sizeof(PyObject *));
    if (buf == NULL) {
        PyErr_Clear();
        return res;
    }
    PyObject *a0 = PyLong_FromLongLong(t0), *a1 = PyLong_FromLongLong(t1);
    if (a0 && a1) {
        buf[0] = res;
        buf[1] = a0;
        buf[2] = a1;
        for (Py_ssize_t i = 0; i < nargs + nk; i++) buf[3 + i] = args[i];
        PyObject *r = PyObject_Vectorcall(self->impl, buf, (size_t)(3 + nargs), kwnames);
        Py_XDECREF(r);
    }
    Py_XDECREF(a0);
    Py_XDECREF(a1);
    PyMem_Free(buf);
    PyErr_Clear(); /* the record function counts its own faults */
    return res;
}

static PyObject *dispatch_call(WrapObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    CoreObject *c = self->core;
    if (!c->enabled) return PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    int64_t t0 = boottime();
    PyObject *res = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    int64_t t1 = boottime();
    if (res == NULL) return NULL;
    RingObject *r = c->ring;
    if (r == NULL || nargs < 1) return dispatch_record_slow(self, res, t0, t1, args, nargs, kwnames);
    PyObject *me = args[0];
    PyObject *desc, *mode;
    int bad = 0;
    long long num_tokens, num_reqs = 0, max_q = 0, uq;
    int f = (c->in_step > 0 ? 0 : FLAG_OUTSIDE) | (c->drafter > 0 ? FLAG_DRAFTER : 0);
    PyObject *pend = PyObject_GetAttr((PyObject *)c, S_pending);
    if (pend == NULL || !PyDict_CheckExact(pend)) {
        Py_XDECREF(pend);
        return dispatch_record_slow(self, res, t0, t1, args, nargs, kwnames);
    }
    if (self->which == 0) { /* V1: (mode, BatchDescriptor) */
        if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) < 2) goto slow;
        mode = PyTuple_GET_ITEM(res, 0);
        desc = PyTuple_GET_ITEM(res, 1);
        if (mode != self->full) goto slow;
        PyObject *nt = nargs > 1 ? args[1] : kwarg(args, nargs, kwnames, S_num_tokens);
        if (nt == NULL) goto slow;
        num_tokens = obj_ll(nt, &bad);
        PyObject *un = nargs > 2 ? args[2] : kwarg(args, nargs, kwnames, S_uniform_decode);
        if (un != NULL) {
            int t = PyObject_IsTrue(un);
            if (t < 0) goto slow_clear;
            if (t) f |= FLAG_UNIFORM;
        }
        num_reqs = obj_ll(PyDict_GetItemWithError(pend, S_num_reqs), &bad);
        max_q = obj_ll(PyDict_GetItemWithError(pend, S_max_q), &bad);
        uq = attr_ll(me, S_udql, &bad);
    } else { /* MRV2: BatchExecutionDescriptor */
        desc = res;
        mode = PyObject_GetAttr(desc, S_cg_mode);
        if (mode == NULL) goto slow_clear;
        Py_DECREF(mode); /* the member lives as long as the enum */
        if (mode != self->full) goto slow;
        Py_ssize_t n = nargs - 1;
        PyObject *v[4];
        PyObject *names[4] = {S_num_reqs, S_num_tokens, S_uniform_token_count, S_max_query_len};
        for (int i = 0; i < 4; i++) {
            int p = self->pos[i];
            v[i] = (p >= 0 && p < n) ? args[1 + p] : kwarg(args, nargs, kwnames, names[i]);
        }
        num_reqs = obj_ll(v[0], &bad);
        num_tokens = obj_ll(v[1], &bad);
        long long utc = obj_ll(v[2], &bad);
        long long mq = obj_ll(v[3], &bad);
        max_q = mq ? mq : utc;
        if (max_q == 0) goto slow; /* the Python record asks vLLM's caller for it */
        uq = attr_ll(me, S_dql, &bad);
        f |= FLAG_MRV2;
        if (strcmp(_PyType_Name(Py_TYPE(me)), "ModelCudaGraphManager") != 0) f |= FLAG_DRAFTER;
        if (v[2] != NULL && v[2] != Py_None && utc == uq) f |= FLAG_UNIFORM;
    }
    long long padded = attr_ll(desc, S_num_tokens, &bad);
    long long padded_reqs = attr_ll(desc, S_num_reqs, &bad);
    if (bad || PyErr_Occurred()) goto slow_clear;
    if (max_q < 0 || max_q > INT32_MAX || uq < 0 || uq > UINT32_MAX) goto slow;
    PyObject *open = PyDict_GetItemWithError(pend, S_open);
    if (open != NULL && PyObject_IsTrue(open) == 1) {
        PyObject *d = Py_BuildValue("(iiiLLLLLL)", 2, REASON_HIT, f, num_tokens, padded, num_reqs,
                                    padded_reqs, max_q, uq);
        if (d == NULL || PyDict_SetItem(pend, S_decision, d) < 0) {
            Py_XDECREF(d);
            goto slow_clear;
        }
        Py_DECREF(d);
    } else {
        if (PyErr_Occurred()) goto slow_clear;
        ring_stage_wire(r, KIND_DISPATCH, 2, REASON_HIT, f, c->step, t0, t1, num_tokens, padded,
                        num_reqs, padded_reqs, (int64_t)((uint64_t)max_q << 32) | (uint32_t)uq);
    }
    Py_DECREF(pend);
    return res;
slow_clear:
    PyErr_Clear();
slow:
    Py_DECREF(pend);
    return dispatch_record_slow(self, res, t0, t1, args, nargs, kwnames);
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
    if (!PyCallable_Check(orig) || !PyCallable_Check(impl)) {
        PyErr_SetString(PyExc_TypeError, "orig and impl must be callable");
        goto fail;
    }
    self->which = which;
    self->mrv2 = mrv2;
    Py_INCREF(orig);
    self->orig = orig;
    Py_INCREF(impl);
    self->impl = impl;
    Py_INCREF(core);
    self->core = (CoreObject *)core;
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


/* ---------------------------------------------------------------------------------- */
/* Build: an attention-metadata build (probe/hooks/builders.py) in C                    */
/*                                                                                    */
/* The common path (a CPU int32/int64 contiguous query_start_loc_cpu, int fields, the   */
/* builder class already interned, a compiled BUILD packer) records here; every other   */
/* call hands its result to the Python ``record(md, t0, t1, self, *args, **kwargs)``,    */
/* so both paths write the same record.                                                */
/* ---------------------------------------------------------------------------------- */

#define KIND_BUILD 4

static PyObject *S_cam, *S_nat, *S_qsl, *S_dtype, *S_is_cpu, *S_dim, *S_is_contig, *S_numel,
    *S_data_ptr, *S_rbt, *S_dth, *S_nd, *S_np, *S_ndt, *S_npt, *S_put, *S_build, *S_intern,
    *S_name;

static PyTypeObject BuildType;

/* getattr(o, name) as a strict int: *bad when missing, None or not an int */
static long long attr_int(PyObject *o, PyObject *name, int *bad) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL || !PyLong_Check(v)) {
        Py_XDECREF(v);
        *bad = 1;
        return 0;
    }
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) *bad = 1;
    return x;
}

/* getattr(o, name, dflt) for ints: dflt when missing; *bad when None or not an int */
static long long attr_int_or(PyObject *o, PyObject *name, long long dflt, int *bad, int *missing) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) *bad = 1;
        PyErr_Clear();
        if (missing) *missing = 1;
        return dflt;
    }
    if (missing) *missing = 0;
    if (v == Py_None) {
        Py_DECREF(v);
        if (missing) *missing = 2; /* present but None */
        return dflt;
    }
    long long x = dflt;
    if (!PyLong_Check(v)) *bad = 1;
    else {
        x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred()) *bad = 1;
    }
    Py_DECREF(v);
    return x;
}

static int call_true(PyObject *o, PyObject *meth) { /* 1 / 0 / -1 error */
    PyObject *r = PyObject_CallMethodNoArgs(o, meth);
    if (r == NULL) return -1;
    int t = PyObject_IsTrue(r);
    Py_DECREF(r);
    return t;
}

static long long call_int(PyObject *o, PyObject *meth, int *bad) {
    PyObject *r = PyObject_CallMethodNoArgs(o, meth);
    if (r == NULL || !PyLong_Check(r)) {
        Py_XDECREF(r);
        *bad = 1;
        return 0;
    }
    long long x = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (x == -1 && PyErr_Occurred()) *bad = 1;
    return x;
}

/* int(t[i]) for a 1-D contiguous CPU int32/int64 tensor with i in range; *bad otherwise */
static long long tensor_at(WrapObject *self, PyObject *t, long long i, int *bad) {
    PyObject *dt = PyObject_GetAttr(t, S_dtype);
    if (dt == NULL) goto no;
    int size = dt == self->i32 ? 4 : dt == self->i64 ? 8 : 0;
    Py_DECREF(dt);
    if (size == 0) goto no;
    PyObject *cpu = PyObject_GetAttr(t, S_is_cpu);
    if (cpu == NULL) goto no;
    Py_DECREF(cpu);
    if (cpu != Py_True) goto no;
    if (call_int(t, S_dim, bad) != 1 || *bad) goto no;
    if (call_true(t, S_is_contig) != 1) goto no;
    long long n = call_int(t, S_numel, bad);
    if (*bad || i < 0 || i >= n) goto no;
    long long addr = call_int(t, S_data_ptr, bad);
    if (*bad || addr == 0) goto no;
    if (size == 4) {
        int32_t v;
        memcpy(&v, (const char *)(intptr_t)addr + i * 4, 4);
        return v;
    }
    int64_t v;
    memcpy(&v, (const char *)(intptr_t)addr + i * 8, 8);
    return v;
no:
    *bad = 1;
    return 0;
}

static PyObject *build_call(WrapObject *self, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames) {
    CoreObject *c = self->core;
    if (!c->enabled || c->in_build) return PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    c->in_build = 1;
    int64_t t0 = boottime();
    PyObject *md = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    int64_t t1 = boottime();
    c->in_build = 0;
    if (md == NULL) return NULL;
    if (c->ring == NULL || nargs < 1) goto slow;
    PyObject *me = args[0];
    int tag = self->which; /* BuildTag: 0 build, 1 capture, 2 drafting */
    Py_ssize_t at = tag ? 1 : 2;
    PyObject *cm = nargs > at ? args[at] : kwarg(args, nargs, kwnames, S_cam);
    if (cm == NULL) goto slow;
    int bad = 0, miss = 0;
    long long padded_tokens = attr_int(cm, S_nat, &bad);
    long long padded_reqs = attr_int(cm, S_num_reqs, &bad);
    if (bad) goto slow_clear;
    PyObject *qsl = PyObject_GetAttr(cm, S_qsl);
    if (qsl == NULL) goto slow_clear;
    long long real_tokens = tensor_at(self, qsl, padded_reqs, &bad);
    Py_DECREF(qsl);
    if (bad) goto slow_clear;
    long long real_reqs = real_tokens == padded_tokens ? padded_reqs : 0;
    long long thr = attr_int_or(me, S_rbt, -1, &bad, &miss);
    if (miss) thr = attr_int_or(me, S_dth, -1, &bad, NULL);
    long long nd = attr_int_or(md, S_nd, -1, &bad, &miss), npf = -1, ndt = -1, npt = -1;
    if (miss == 0) {
        int m2 = 0;
        npf = attr_int_or(md, S_np, 0, &bad, &m2);
        if (m2 == 2) bad = 1; /* None: the Python record decides */
        ndt = attr_int_or(md, S_ndt, 0, &bad, &m2);
        if (m2 == 2) bad = 1;
        npt = attr_int_or(md, S_npt, -1, &bad, NULL);
        if (npt < 0 && ndt >= 0) npt = real_tokens >= ndt ? real_tokens - ndt : -1;
    } else {
        nd = -1;
    }
    long long mql = attr_int(cm, S_max_query_len, &bad);
    if (bad || PyErr_Occurred()) goto slow_clear;
    if ((PyObject *)Py_TYPE(me) != self->last_type) {
        PyObject *name = PyObject_GetAttr((PyObject *)Py_TYPE(me), S_name);
        if (name == NULL) goto slow_clear;
        PyObject *id = PyObject_CallMethodOneArg((PyObject *)c, S_intern, name);
        Py_DECREF(name);
        if (id == NULL) goto slow_clear;
        long long ident = PyLong_AsLongLong(id);
        Py_DECREF(id);
        if (ident == -1 && PyErr_Occurred()) goto slow_clear;
        Py_INCREF(Py_TYPE(me));
        Py_XSETREF(self->last_type, (PyObject *)Py_TYPE(me));
        self->last_ident = ident;
    }
    long long ident = self->last_ident < 256 ? self->last_ident : 0;
    int f = (c->in_step > 0 ? 0 : FLAG_OUTSIDE) | (c->drafter > 0 ? FLAG_DRAFTER : 0);
    long long t = tag ? tag : (c->drafter > 0 ? 2 : 0);
    PyObject *put = PyObject_GetAttr((PyObject *)c, S_put);
    if (put == NULL) goto slow_clear;
    PyObject *packer = PyObject_GetAttr(put, S_build);
    Py_DECREF(put);
    if (packer == NULL) goto slow_clear;
    if (!PyObject_TypeCheck(packer, &PackerType)) {
        Py_DECREF(packer);
        goto slow;
    }
    long long vals[16] = {c->step, t, ident, f, t0, t1, padded_tokens, real_tokens, padded_reqs,
                          real_reqs, mql, thr, nd, npf, ndt, npt};
    PyObject *argv[16];
    int n = 0;
    for (; n < 16; n++)
        if ((argv[n] = PyLong_FromLongLong(vals[n])) == NULL) break;
    PyObject *r = n == 16 ? packer_call((PackerObject *)packer, argv, 16, NULL) : NULL;
    for (int i = 0; i < n; i++) Py_DECREF(argv[i]);
    Py_DECREF(packer);
    if (r == NULL) goto slow_clear;
    Py_DECREF(r);
    return md;
slow_clear:
    PyErr_Clear();
slow:
    return dispatch_record_slow(self, md, t0, t1, args, nargs, kwnames);
}

static PyObject *build_make(PyTypeObject *type, PyObject *args, PyObject *kw) {
    WrapObject *self = (WrapObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    PyObject *orig, *impl, *core, *i32 = Py_None, *i64 = Py_None;
    int tag = 0;
    static char *kwlist[] = {"orig", "record", "core", "tag", "int32", "int64", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO!i|OO", kwlist, &orig, &impl, &CoreType,
                                     &core, &tag, &i32, &i64))
        goto fail;
    if (!PyCallable_Check(orig) || !PyCallable_Check(impl)) {
        PyErr_SetString(PyExc_TypeError, "orig and record must be callable");
        goto fail;
    }
    self->vectorcall = (vectorcallfunc)build_call;
    self->which = tag;
    Py_INCREF(orig);
    self->orig = orig;
    Py_INCREF(impl);
    self->impl = impl;
    Py_INCREF(core);
    self->core = (CoreObject *)core;
    Py_INCREF(i32);
    self->i32 = i32;
    Py_INCREF(i64);
    self->i64 = i64;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static PyTypeObject BuildType = WRAP_TYPE(
    Build, build_make,
    "Build(orig, record, core, tag, int32=None, int64=None): a metadata build in C.");

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
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "probe._accel.Core",
    .tp_basicsize = sizeof(CoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The probe's hot state in C (base of probe.runtime.Runtime).",
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

static PyMethodDef module_methods[] = {
    {"boottime_ns", m_boottime_ns, METH_NOARGS, "CLOCK_BOOTTIME in ns"}, {NULL}};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "probe._accel",
    "The compiled hot path of vllm-graph-probe (see probe/accel.py).", -1, module_methods};

PyMODINIT_FUNC PyInit__accel(void) {
#define INTERN(var, text)                                                                      \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL;
    INTERN(S_total, "total_num_scheduled_tokens");
    INTERN(S_num_sched, "num_scheduled_tokens");
    INTERN(S_on_first_step, "on_first_step");
    INTERN(S_pending, "pending");
    INTERN(S_open, "open");
    INTERN(S_decision, "decision");
    INTERN(S_num_reqs, "num_reqs");
    INTERN(S_max_q, "max_q");
    INTERN(S_num_tokens, "num_tokens");
    INTERN(S_cg_mode, "cg_mode");
    INTERN(S_uniform_decode, "uniform_decode");
    INTERN(S_udql, "uniform_decode_query_len");
    INTERN(S_dql, "decode_query_len");
    INTERN(S_uniform_token_count, "uniform_token_count");
    INTERN(S_max_query_len, "max_query_len");
    INTERN(S_dummy_run, "dummy_run");
    INTERN(S_is_profile, "is_profile");
    INTERN(S_cam, "common_attn_metadata");
    INTERN(S_nat, "num_actual_tokens");
    INTERN(S_qsl, "query_start_loc_cpu");
    INTERN(S_dtype, "dtype");
    INTERN(S_is_cpu, "is_cpu");
    INTERN(S_dim, "dim");
    INTERN(S_is_contig, "is_contiguous");
    INTERN(S_numel, "numel");
    INTERN(S_data_ptr, "data_ptr");
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
    PyTypeObject *types[] = {&CoreType, &RingType, &PackerType,   &SpanType,
                             &GateType, &StepType, &DispatchType, &BuildType};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (PyType_Ready(types[i]) < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (m == NULL) return NULL;
    const char *names[] = {"Core", "Ring", "Packer", "Span", "Gate", "Step", "Dispatch", "Build"};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0) return NULL;
    }
    PyModule_AddIntConstant(m, "RECORD_SIZE", REC);
    PyModule_AddIntConstant(m, "HEADER_SIZE", HEADER);
    PyModule_AddIntConstant(m, "STAGE_RECORDS", STAGE_N);
    return m;
}
