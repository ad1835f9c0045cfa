/* probe.engine.accel._accel, the Ring writer and the Packer. Included once by probe/engine/accel/_accel.c (one translation unit,
 * split by room like CPython's stringlib): not a public header. */
#ifndef PROBE_ACCEL_RING_H
#define PROBE_ACCEL_RING_H

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

/* The ring a compiled hook stages a teed kind (DISPATCH, REPLAY, FORWARD, REORDER) into;
   NULL (the record goes through the Python record, hence RT.put) while probe.engine.markers
   tees RT.put, so the live marks see every decision. */
static inline RingObject *direct_ring(CoreObject *c) { return c->tee ? NULL : c->ring; }

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
    memcpy(p + OFF_STEP, &s, 4);
    for (int i = 5; i < 12; i++) put_u64(p + OFF_T0 + (i - 5) * 8, v[i]);
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
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "probe.engine.accel._accel.Ring",
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

/* Stage one record of the packer's kind from its fields as C integers (declaration
   order); -1 with an exception set when a value does not fit its slot. */
static int packer_put(PackerObject *self, const long long *vals) {
    int64_t w[11] = {0};
    for (int i = 0; i < self->nfields; i++) {
        long long v = vals[i] + self->bias[i];
        int s = self->slot[i];
        switch (self->part[i]) {
        case 1:
            if (v < INT32_MIN || v > INT32_MAX) {
                PyErr_Format(PyExc_OverflowError, "field %d = %lld does not fit 31 bits", i, v);
                return -1;
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
            return -1;
        }
    }
    RingObject *r = self->ring;
    uint8_t *p = ring_slot(r);
    p[OFF_KIND] = (uint8_t)self->kind;
    p[OFF_A] = (uint8_t)w[0];
    p[OFF_B] = (uint8_t)w[1];
    p[OFF_C] = (uint8_t)w[2];
    uint32_t st = (uint32_t)w[3];
    memcpy(p + OFF_STEP, &st, 4);
    for (int s = 4; s < 11; s++) put_u64(p + OFF_T0 + (s - 4) * 8, w[s]);
    ring_staged(r);
    return 0;
}

static PyObject *packer_call(PackerObject *self, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != self->nfields || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_Format(PyExc_TypeError, "packer of kind %d takes %d positional fields, got %zd",
                     self->kind, self->nfields, nargs);
        return NULL;
    }
    long long vals[MAXF];
    for (int i = 0; i < self->nfields; i++) {
        vals[i] = PyLong_AsLongLong(args[i]);
        if (vals[i] == -1 && PyErr_Occurred()) return NULL;
    }
    if (packer_put(self, vals) < 0) return NULL;
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
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "probe.engine.accel._accel.Packer",
    .tp_basicsize = sizeof(PackerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A record kind's positional packer (Ring.packer).",
    .tp_dealloc = (destructor)packer_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(PackerObject, vectorcall),
};


#endif /* PROBE_ACCEL_RING_H */
