/* probe._accel, the metadata-build wrapper. Included once by probe/_accel.c (one translation unit,
 * split by room like CPython's stringlib): not a public header. */
#ifndef PROBE_ACCEL_BUILD_H
#define PROBE_ACCEL_BUILD_H

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
    if (wrap_own(self, orig, impl, core) < 0) goto fail;
    self->vectorcall = (vectorcallfunc)build_call;
    self->which = tag;
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


#endif /* PROBE_ACCEL_BUILD_H */
