/* The per-collective seam of the live agent in C (the agent's overhead budget, agent/cost.py).

   Recording one host collective in Python costs the training thread ~7-8 us of CPU in place
   (bench/collective_cost.py): every Python-level call between the engine's kernels runs cold,
   ~0.5 us each, and recording an op and timing its wait() takes about a dozen. Here the same
   work is two C calls, ~3.5-4 us in all: ``Recorder.__call__`` (what ``tel.collective(work,
   op=..., ...)`` resolves to on the host) and ``HostWork.wait``.

   ``resolve_hosts`` is the sender thread's side: a step's records as the wire's Collectives
   in one call (a ZeRO-3 step has hundreds; in Python each costs the cold sender ~0.4 us more).

   The records are the very lists agent/host_seam.py's Python path makes, in the one layout of
   agent/collective_record.py (``FIELDS`` there; this module exports its own as ``FIELDS`` and
   the twin test holds the two equal), so everything downstream (the step end's take, the
   sender's resolution, the attach's wait bookkeeping: ``book_wait``) is shared, and
   agent/host_seam.py's pure-Python ``Recorder`` and ``HostWork`` and agent/collective_record.py
   are the reference this module is tested against (tests/test_agent_native.py). Times are CLOCK_MONOTONIC nanoseconds, the
   clock of Python's ``time.perf_counter_ns`` on Linux (this module is built on Linux only).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

enum { OP, NBYTES, GROUP, PREFETCHED, LABEL, START, END, EXPOSED, REF, FIELDS };
static const char *field_names[FIELDS] = {"op",      "nbytes", "group_size",
                                          "prefetched", "label", "start_ns",
                                          "end_ns",  "exposed_ns", "ref"};

static PyObject *s_wait, *s_is_completed, *s_get_future;
static PyObject *s_op, *s_nbytes, *s_group_size, *s_prefetched, *s_label, *s_timeout;
static PyObject *empty_str, *s_host;
static PyObject *collective_kwnames; /* the wire Collective's fields resolve_hosts sets, by name */

static inline long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int set_item_ns(PyObject *rec, Py_ssize_t i, long long ns) {
    PyObject *v = PyLong_FromLongLong(ns);
    if (v == NULL) return -1;
    return PyList_SetItem(rec, i, v); /* steals v */
}

/* ---- HostWork: the handle collective() returns on the host -------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *pending; /* the list of records issued since the last take() */
    PyObject *fallback; /* fallback(work, op, nbytes, group_size, prefetched, label, start_ns) */
    long long collective_ns; /* the agent's own time per collective (agent/cost.py) */
    long long host_ended;    /* records whose end wait() stamped */
    vectorcallfunc vectorcall;
} RecorderObject;

static PyTypeObject RecorderType;


typedef struct {
    PyObject_HEAD
    PyObject *work;
    PyObject *record;
    PyObject *counters; /* the Recorder whose counters wait() adds to, or None */
} HostWorkObject;

static PyTypeObject HostWorkType;

static void hw_dealloc(HostWorkObject *self) {
    Py_XDECREF(self->work);
    Py_XDECREF(self->record);
    Py_XDECREF(self->counters);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *hw_make(PyObject *work, PyObject *record, PyObject *counters) {
    HostWorkObject *self = PyObject_New(HostWorkObject, &HostWorkType);
    if (self == NULL) return NULL;
    Py_INCREF(work);
    Py_INCREF(record);
    Py_INCREF(counters);
    self->work = work;
    self->record = record;
    self->counters = counters;
    return (PyObject *)self;
}

static PyObject *hw_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *work, *record, *counters = Py_None;
    static char *kwlist[] = {"work", "record", "counters", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|O", kwlist, &work, &record, &counters))
        return NULL;
    if (counters != Py_None && !PyObject_TypeCheck(counters, &RecorderType)) {
        PyErr_SetString(PyExc_TypeError, "counters must be a Recorder or None");
        return NULL;
    }
    return hw_make(work, record, counters);
}

/* wait()'s bookkeeping, as agent/collective_record.py book_wait_python: the time inside is
   exposed time, its end the op's completion (the earliest of the ends seen). 1 = this wait
   gave the record its first end, 0 = it had one (or is not a host record), -1 = error. */
static int book(PyObject *rec, long long t0, long long t1) {
    if (!PyList_Check(rec) || PyList_GET_SIZE(rec) < FIELDS) return 0;
    long long exposed = PyLong_AsLongLong(PyList_GET_ITEM(rec, EXPOSED));
    if (exposed == -1 && PyErr_Occurred()) return -1;
    if (set_item_ns(rec, EXPOSED, exposed + (t1 - t0)) < 0) return -1;
    PyObject *end = PyList_GET_ITEM(rec, END);
    if (end == Py_None) return set_item_ns(rec, END, t1) < 0 ? -1 : 1;
    long long e = PyLong_AsLongLong(end);
    if (e == -1 && PyErr_Occurred()) return -1;
    if (t1 < e && set_item_ns(rec, END, t1) < 0) return -1;
    return 0;
}

static int hw_book(HostWorkObject *self, long long t0, long long t1) {
    RecorderObject *counters =
        self->counters == Py_None ? NULL : (RecorderObject *)self->counters;
    int first = book(self->record, t0, t1);
    if (first < 0) return -1;
    if (counters != NULL) {
        counters->host_ended += first;
        counters->collective_ns += now_ns() - t1;
    }
    return 0;
}

static PyObject *hw_wait(HostWorkObject *self, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames) {
    PyObject *timeout = nargs > 0 ? args[0] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw > 1) {
        PyErr_SetString(PyExc_TypeError, "wait() takes at most one argument (timeout)");
        return NULL;
    }
    if (nkw == 1) {
        if (PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), s_timeout) != 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "wait() got an unexpected keyword argument");
            return NULL;
        }
        timeout = args[0];
    }
    long long t0 = now_ns();
    PyObject *result = (timeout == NULL || timeout == Py_None)
                           ? PyObject_CallMethodNoArgs(self->work, s_wait)
                           : PyObject_CallMethodOneArg(self->work, s_wait, timeout);
    long long t1 = now_ns();
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* the wait's own exception, if any, passes through */
    if (hw_book(self, t0, t1) < 0) PyErr_Clear(); /* bookkeeping never fails the job */
    PyErr_Restore(type, value, tb);
    return result;
}

static PyObject *hw_is_completed(HostWorkObject *self, PyObject *unused) {
    PyObject *r = PyObject_CallMethodNoArgs(self->work, s_is_completed);
    if (r == NULL) return NULL;
    int truth = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (truth < 0) return NULL;
    return PyBool_FromLong(truth);
}

static PyObject *hw_get_future(HostWorkObject *self, PyObject *unused) {
    return PyObject_CallMethodNoArgs(self->work, s_get_future);
}

/* Anything else is the Work's (a handle stands in for the Work it wraps). */
static PyObject *hw_getattro(PyObject *self, PyObject *name) {
    PyObject *r = PyObject_GenericGetAttr(self, name);
    if (r != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError)) return r;
    PyErr_Clear();
    return PyObject_GetAttr(((HostWorkObject *)self)->work, name);
}

static PyMethodDef hw_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))hw_wait, METH_FASTCALL | METH_KEYWORDS,
     "Wait for the op; the time inside is its exposed time, the end its completion."},
    {"is_completed", (PyCFunction)hw_is_completed, METH_NOARGS, NULL},
    {"get_future", (PyCFunction)hw_get_future, METH_NOARGS, NULL},
    {NULL},
};

static PyMemberDef hw_members[] = {
    {"work", T_OBJECT, offsetof(HostWorkObject, work), READONLY, "The Work it wraps."},
    {"record", T_OBJECT, offsetof(HostWorkObject, record), READONLY, "The host record."},
    {"counters", T_OBJECT, offsetof(HostWorkObject, counters), READONLY,
     "The Recorder whose counters wait() adds to."},
    {NULL},
};

static PyTypeObject HostWorkType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "zeroscope.agent._seam.HostWork",
    .tp_basicsize = sizeof(HostWorkObject),
    .tp_dealloc = (destructor)hw_dealloc,
    .tp_getattro = hw_getattro,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What collective() returns on the host: use its wait() instead of the Work's.",
    .tp_methods = hw_methods,
    .tp_members = hw_members,
    .tp_new = hw_new,
};

/* ---- Recorder: tel.collective on the host -------------------------------------------- */

/* A Recorder's fallback is its tracker's bound method, and the tracker holds the Recorder: a
   cycle, so the Recorder takes part in garbage collection (it is made once per agent). A
   HostWork does not (made per op, as cheaply as possible): nothing it holds refers back to it
   unless a work object keeps its own handle, which leaks that pair. */
static int rec_traverse(RecorderObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->pending);
    Py_VISIT(self->fallback);
    return 0;
}

static int rec_clear(RecorderObject *self) {
    Py_CLEAR(self->pending);
    Py_CLEAR(self->fallback);
    return 0;
}

static void rec_dealloc(RecorderObject *self) {
    PyObject_GC_UnTrack(self);
    rec_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int kw_is(PyObject *name, PyObject *interned) {
    return name == interned || PyUnicode_Compare(name, interned) == 0;
}

static PyObject *rec_call(RecorderObject *self, PyObject *const *args, size_t nargsf,
                          PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "collective() takes the work and keywords");
        return NULL;
    }
    if (self->pending == NULL || self->fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "this Recorder was cleared by the garbage collector");
        return NULL;
    }
    long long t0 = now_ns();
    PyObject *work = args[0];
    PyObject *f[FIELDS] = {NULL};
    f[PREFETCHED] = Py_False;
    f[LABEL] = empty_str;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[1 + i];
        if (kw_is(name, s_op)) f[OP] = value;
        else if (kw_is(name, s_nbytes)) f[NBYTES] = value;
        else if (kw_is(name, s_group_size)) f[GROUP] = value;
        else if (kw_is(name, s_prefetched)) f[PREFETCHED] = value;
        else if (kw_is(name, s_label)) f[LABEL] = value;
        else {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "collective() got an unexpected keyword %R", name);
            return NULL;
        }
    }
    if (f[OP] == NULL || f[NBYTES] == NULL || f[GROUP] == NULL) {
        PyErr_SetString(PyExc_TypeError, "collective() needs op, nbytes and group_size");
        return NULL;
    }
    PyObject *ref = PyWeakref_NewRef(work, NULL);
    if (ref == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;
        PyErr_Clear(); /* a Work that cannot be weakly referenced: the Python path times it */
        PyObject *start = PyLong_FromLongLong(t0);
        if (start == NULL) return NULL;
        PyObject *r = PyObject_CallFunctionObjArgs(self->fallback, work, f[OP], f[NBYTES],
                                                   f[GROUP], f[PREFETCHED], f[LABEL], start,
                                                   NULL);
        Py_DECREF(start);
        return r;
    }
    PyObject *rec = PyList_New(FIELDS);
    if (rec == NULL) {
        Py_DECREF(ref);
        return NULL;
    }
    for (int i = OP; i <= LABEL; i++) {
        Py_INCREF(f[i]);
        PyList_SET_ITEM(rec, i, f[i]);
    }
    PyObject *start = PyLong_FromLongLong(t0), *zero = PyLong_FromLong(0);
    if (start == NULL || zero == NULL) {
        Py_XDECREF(start);
        Py_XDECREF(zero);
        Py_DECREF(ref);
        Py_DECREF(rec);
        return NULL;
    }
    PyList_SET_ITEM(rec, START, start);
    Py_INCREF(Py_None);
    PyList_SET_ITEM(rec, END, Py_None);
    PyList_SET_ITEM(rec, EXPOSED, zero);
    PyList_SET_ITEM(rec, REF, ref);
    PyObject *handle = NULL;
    if (PyList_Append(self->pending, rec) == 0) handle = hw_make(work, rec, (PyObject *)self);
    Py_DECREF(rec);
    self->collective_ns += now_ns() - t0;
    return handle;
}

static PyObject *rec_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *fallback;
    static char *kwlist[] = {"fallback", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &fallback)) return NULL;
    RecorderObject *self = (RecorderObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->pending = PyList_New(0);
    if (self->pending == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    Py_INCREF(fallback);
    self->fallback = fallback;
    self->vectorcall = (vectorcallfunc)rec_call;
    return (PyObject *)self;
}

static PyObject *rec_take(RecorderObject *self, PyObject *unused) {
    if (self->pending == NULL) return PyList_New(0); /* cleared by the garbage collector */
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL) return NULL;
    PyObject *taken = self->pending; /* the GIL is held: no append can fall in between */
    self->pending = fresh;
    return taken;
}

static PyMethodDef rec_methods[] = {
    {"take", (PyCFunction)rec_take, METH_NOARGS,
     "The records issued since the last take (a fresh list collects the next ones)."},
    {NULL},
};

static PyMemberDef rec_members[] = {
    {"pending", T_OBJECT, offsetof(RecorderObject, pending), READONLY,
     "The list the next records are appended to."},
    {"collective_ns", T_LONGLONG, offsetof(RecorderObject, collective_ns), 0,
     "Nanoseconds of the agent's own time in collective() and wait()'s bookkeeping."},
    {"host_ended", T_LONGLONG, offsetof(RecorderObject, host_ended), 0,
     "Records whose end wait() stamped."},
    {NULL},
};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "zeroscope.agent._seam.Recorder",
    .tp_basicsize = sizeof(RecorderObject),
    .tp_dealloc = (destructor)rec_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)rec_traverse,
    .tp_clear = (inquiry)rec_clear,
    .tp_doc = "tel.collective(work, op=, nbytes=, group_size=, prefetched=, label=) on the host.",
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(RecorderObject, vectorcall),
    .tp_methods = rec_methods,
    .tp_members = rec_members,
    .tp_new = rec_new,
};

static PyObject *seam_now_ns(PyObject *mod, PyObject *unused) {
    return PyLong_FromLongLong(now_ns());
}

/* ---- resolve_hosts: a step's host records as wire Collectives (the sender thread) ----- */

/* One field of a host record as a C integer; 0 = it is not an int (None: still in flight). */
static int field_ns(PyObject *rec, Py_ssize_t i, long long *out) {
    PyObject *v = PyList_GET_ITEM(rec, i);
    if (!PyLong_CheckExact(v)) return 0;
    *out = PyLong_AsLongLong(v);
    return !(*out == -1 && PyErr_Occurred());
}

static PyObject *seam_resolve_hosts(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "resolve_hosts(records: list, step_start_ns, make)");
        return NULL;
    }
    PyObject *records = args[0], *make = args[2];
    long long step_start = PyLong_AsLongLong(args[1]);
    if (step_start == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *rec = PyList_GET_ITEM(records, k);
        long long start, end, exposed_ns;
        if (!PyList_CheckExact(rec) || PyList_GET_SIZE(rec) < FIELDS ||
            !field_ns(rec, START, &start) || !field_ns(rec, END, &end) ||
            !field_ns(rec, EXPOSED, &exposed_ns)) {
            PyErr_Clear(); /* not a host record that ended (or out of range): not all did */
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        /* As the Python twin computes them: exposed is capped at the op's duration. */
        double duration = end > start ? (double)(end - start) / 1e9 : 0.0;
        double exposed = (double)exposed_ns / 1e9;
        /* clock "host": on CPU the op ran while the host waited in wait(), on its clock. */
        PyObject *fields[10] = {PyList_GET_ITEM(rec, OP), PyList_GET_ITEM(rec, NBYTES),
                                PyList_GET_ITEM(rec, GROUP), NULL, NULL, NULL,
                                PyList_GET_ITEM(rec, PREFETCHED), PyList_GET_ITEM(rec, LABEL),
                                s_host, Py_True};
        fields[3] = PyFloat_FromDouble((double)(start - step_start) / 1e9);
        fields[4] = PyFloat_FromDouble(duration);
        fields[5] = PyFloat_FromDouble(exposed < duration ? exposed : duration);
        PyObject *made = NULL;
        if (fields[3] != NULL && fields[4] != NULL && fields[5] != NULL)
            made = PyObject_Vectorcall(make, fields, 0, collective_kwnames);
        Py_XDECREF(fields[3]);
        Py_XDECREF(fields[4]);
        Py_XDECREF(fields[5]);
        if (made == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, k, made); /* steals made */
    }
    return out;
}

static PyObject *seam_book_wait(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "book_wait(record, t0_ns, t1_ns)");
        return NULL;
    }
    long long t0 = PyLong_AsLongLong(args[1]), t1 = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    int first = book(args[0], t0, t1);
    if (first < 0) return NULL;
    return PyBool_FromLong(first);
}

static PyMethodDef module_methods[] = {
    {"now_ns", seam_now_ns, METH_NOARGS, "This module's clock (perf_counter_ns's on Linux)."},
    {"book_wait", (PyCFunction)(void (*)(void))seam_book_wait, METH_FASTCALL,
     "book_wait(record, t0_ns, t1_ns) -> bool: a wait() from t0 to t1 on the record's op "
     "(agent/collective_record.py's book_wait_python is its twin)."},
    {"resolve_hosts", (PyCFunction)(void (*)(void))seam_resolve_hosts, METH_FASTCALL,
     "resolve_hosts(records, step_start_ns, make): make(op=, nbytes=, group_size=, start_s=, "
     "duration_s=, exposed_s=, prefetched=, label=, clock='host', exposed_measured=True) per "
     "record, by keyword, or None unless every record is a "
     "host record that ended (agent/host_seam.py's resolve_hosts is its twin)."},
    {NULL},
};

static struct PyModuleDef seam_module = {
    PyModuleDef_HEAD_INIT, "_seam", "The agent's per-collective seam in C (see _seam.c).", -1,
    module_methods,
};

#define INTERN(var, text)                                                                      \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__seam(void) {
    INTERN(s_wait, "wait");
    INTERN(s_is_completed, "is_completed");
    INTERN(s_get_future, "get_future");
    INTERN(s_op, "op");
    INTERN(s_nbytes, "nbytes");
    INTERN(s_group_size, "group_size");
    INTERN(s_prefetched, "prefetched");
    INTERN(s_label, "label");
    INTERN(s_timeout, "timeout");
    INTERN(empty_str, "");
    INTERN(s_host, "host");
    collective_kwnames =
        Py_BuildValue("(ssssssssss)", "op", "nbytes", "group_size", "start_s", "duration_s",
                      "exposed_s", "prefetched", "label", "clock", "exposed_measured");
    if (collective_kwnames == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(collective_kwnames); i++)
        PyUnicode_InternInPlace(&PyTuple_GET_ITEM(collective_kwnames, i));
    PyObject *names = PyTuple_New(FIELDS);
    if (names == NULL) return NULL;
    for (int i = 0; i < FIELDS; i++) {
        PyObject *name = PyUnicode_InternFromString(field_names[i]);
        if (name == NULL) {
            Py_DECREF(names);
            return NULL;
        }
        PyTuple_SET_ITEM(names, i, name);
    }
    if (PyType_Ready(&HostWorkType) < 0 || PyType_Ready(&RecorderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&seam_module);
    if (m == NULL) {
        Py_DECREF(names);
        return NULL;
    }
    if (PyModule_AddObject(m, "FIELDS", names) < 0) {
        Py_DECREF(names);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&HostWorkType);
    Py_INCREF(&RecorderType);
    if (PyModule_AddObject(m, "HostWork", (PyObject *)&HostWorkType) < 0 ||
        PyModule_AddObject(m, "Recorder", (PyObject *)&RecorderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
