/* probe.engine.accel._accel, the metadata-build wrapper. Included once by probe/engine/accel/_accel.c (one translation unit,
 * split by room like CPython's stringlib): not a public header. */
#ifndef PROBE_ACCEL_BUILD_H
#define PROBE_ACCEL_BUILD_H

/* ---------------------------------------------------------------------------------- */
/* Build: an attention-metadata build (probe/engine/hooks/builders.py) in C                    */
/*                                                                                    */
/* The common path (int fields, the builder class already interned, a compiled BUILD    */
/* packer) records here, reading plain attributes only (no tensor, no exception raised  */
/* for a missing one); every other call hands its result to the Python                 */
/* ``record(md, t0, t1, self, *args, **kwargs)``, so both paths write the same record.  */
/* The real token/request counts are the reader's (probe.reader.assemble.fill_builds).         */
/* ---------------------------------------------------------------------------------- */

static PyObject *S_cam, *S_nat, *S_rbt, *S_dth, *S_nd, *S_np, *S_ndt, *S_npt, *S_put, *S_build,
    *S_intern, *S_name;

static PyTypeObject BuildType;

/* getattr(o, name) or NULL with no exception when it is missing (-1: another error) */
static int lookup_attr(PyObject *o, PyObject *name, PyObject **out) {
#if PY_VERSION_HEX >= 0x030D0000
    return PyObject_GetOptionalAttr(o, name, out);
#else
    return _PyObject_LookupAttr(o, name, out);
#endif
}

/* The value of an int attribute: *state 0 an int, 1 missing, 2 None; *bad on anything
   else (not an int, an error other than a missing attribute) */
static long long attr_int_opt(PyObject *o, PyObject *name, int *state, int *bad) {
    PyObject *v = NULL;
    int found = lookup_attr(o, name, &v);
    *state = 1;
    if (found < 0) {
        *bad = 1;
        return 0;
    }
    if (found == 0) return 0;
    long long x = 0;
    if (v == Py_None) *state = 2;
    else if (!PyLong_Check(v)) *bad = 1;
    else {
        *state = 0;
        x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred()) *bad = 1;
    }
    Py_DECREF(v);
    return x;
}

/* getattr(o, name) as a strict int: *bad when missing, None or not an int */
static long long attr_int(PyObject *o, PyObject *name, int *bad) {
    int state;
    long long x = attr_int_opt(o, name, &state, bad);
    if (state != 0) *bad = 1;
    return x;
}

/* The compiled BUILD packer of the ring bound to ``c`` (cached on the wrapper until the
   ring changes), or NULL with no exception when there is none (a Python writer). */
static PackerObject *build_packer(WrapObject *self, CoreObject *c) {
    PackerObject *p = (PackerObject *)self->packer;
    if (p != NULL && p->ring == c->ring) return p;
    PyObject *put = PyObject_GetAttr((PyObject *)c, S_put);
    PyObject *packer = put != NULL ? PyObject_GetAttr(put, S_build) : NULL;
    Py_XDECREF(put);
    if (packer == NULL || !PyObject_TypeCheck(packer, &PackerType) ||
        ((PackerObject *)packer)->ring != c->ring) {
        Py_XDECREF(packer);
        PyErr_Clear();
        return NULL;
    }
    Py_XSETREF(self->packer, packer);
    return (PackerObject *)packer;
}

static PyObject *build_call(WrapObject *self, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames) {
    CoreObject *c = self->core;
    if (!c->enabled || c->in_build) return PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    c->in_build = 1;
    int64_t t0 = now_ns(c);
    PyObject *md = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    int64_t t1 = now_ns(c);
    c->in_build = 0;
    if (md == NULL) return NULL;
    if (c->ring == NULL || nargs < 1) goto slow;
    PyObject *me = args[0];
    int tag = self->which; /* BuildTag: 0 build, 1 capture, 2 drafting */
    Py_ssize_t at = tag ? 1 : 2;
    PyObject *cm = nargs > at ? args[at] : kwarg(args, nargs, kwnames, S_cam);
    if (cm == NULL) goto slow;
    int bad = 0, st = 0;
    long long padded_tokens = attr_int(cm, S_nat, &bad);
    long long padded_reqs = attr_int(cm, S_num_reqs, &bad);
    long long mql = attr_int(cm, S_max_query_len, &bad);
    long long thr = attr_int_opt(me, S_rbt, &st, &bad);
    if (st != 0) {
        thr = attr_int_opt(me, S_dth, &st, &bad);
        if (st != 0) thr = -1;
    }
    long long nd = attr_int_opt(md, S_nd, &st, &bad), npf = -1, ndt = -1, npt = -1;
    if (st == 0) {
        npf = attr_int_opt(md, S_np, &st, &bad);
        if (st == 2) bad = 1; /* None: the Python record decides */
        if (st == 1) npf = 0;
        ndt = attr_int_opt(md, S_ndt, &st, &bad);
        if (st == 2) bad = 1;
        if (st == 1) ndt = 0;
        npt = attr_int_opt(md, S_npt, &st, &bad);
        if (st != 0) npt = -1;
    } else {
        nd = -1;
    }
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
    int f = (c->in_step > 0 ? 0 : FLAG_OUTSIDE_STEP) | (c->drafter > 0 ? FLAG_DRAFTER : 0);
    long long t = tag ? tag : (c->drafter > 0 ? 2 : 0);
    PackerObject *packer = build_packer(self, c);
    if (packer == NULL) goto slow;
    /* the BUILD fields at their declared places (the generated BUILD_F_*); the real token
       and request counts are the reader's: -1 */
    long long vals[BUILD_FIELDS] = {
        [BUILD_F_STEP] = c->step,           [BUILD_F_TAG] = t,
        [BUILD_F_BUILDER_ID] = ident,       [BUILD_F_FLAGS] = f,
        [BUILD_F_T0] = t0,                  [BUILD_F_T1] = t1,
        [BUILD_F_PADDED_TOKENS] = padded_tokens, [BUILD_F_REAL_TOKENS] = -1,
        [BUILD_F_PADDED_REQS] = padded_reqs, [BUILD_F_REAL_REQS] = -1,
        [BUILD_F_MAX_QUERY_LEN] = mql,      [BUILD_F_REORDER_BATCH_THRESHOLD] = thr,
        [BUILD_F_NUM_DECODES] = nd,         [BUILD_F_NUM_PREFILLS] = npf,
        [BUILD_F_NUM_DECODE_TOKENS] = ndt,  [BUILD_F_NUM_PREFILL_TOKENS] = npt};
    if (packer_put(packer, vals) < 0) goto slow_clear;
    return md;
slow_clear:
    PyErr_Clear();
slow:
    return dispatch_record_slow(self, md, t0, t1, args, nargs, kwnames);
}

static PyObject *build_make(PyTypeObject *type, PyObject *args, PyObject *kw) {
    WrapObject *self = (WrapObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    PyObject *orig, *impl, *core;
    int tag = 0;
    static char *kwlist[] = {"orig", "record", "core", "tag", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO!i", kwlist, &orig, &impl, &CoreType, &core,
                                     &tag))
        goto fail;
    if (wrap_own(self, orig, impl, core) < 0) goto fail;
    self->vectorcall = (vectorcallfunc)build_call;
    self->which = tag;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static PyTypeObject BuildType = WRAP_TYPE(
    Build, build_make, "Build(orig, record, core, tag): a metadata build in C.");


#endif /* PROBE_ACCEL_BUILD_H */
