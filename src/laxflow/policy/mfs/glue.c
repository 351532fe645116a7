/* The mfs policy's per-flow Python glue in C: laxflow.policy.mfs._glue.
 *
 * The native path (core.py) runs each decision's arithmetic in C
 * (core.c, through cffi), but admitting a new flow, forgetting a
 * finished one and the glue around each decision touch Python objects: the
 * Flow's fields, the RMLQ's slot dict and free list, the policy's batch and
 * request tables and flags.  At paper scale that is ~350,000 flows and
 * ~450,000 decisions a run, and the interpreter's dispatch around those few
 * dict operations cost as much as the decision step itself.  This module
 * does the same dict, list and set operations, in the same order, through
 * the CPython API:
 *
 *   Glue.decide(flows, now, kept, progressed, capacity, columns, snapshot)
 *                                                   core._decide_incremental
 *   Glue.admit(flows, kept, capacity, allocated)   core._admit_new
 *   Glue.complete(flow)                             MfsPolicy.on_complete
 *   Glue.bound(gen, urgency, capacity, room)       what NativeCore bound
 *
 * Every value stored is the object the Python code stores (the same ints
 * from the same dicts, the same NaN object, floats made by the same
 * conversions), so policy state is identical whichever code ran; anything
 * off the common path (a Flow subclass, a transfer shape not in the
 * bottleneck cache, a batch or request seen for the first time, a burst
 * that outgrows the free slots, a reorder that moves ranks, arrays to bind
 * again) calls the policy's own Python for that step.  complete() declines
 * (returns False, nothing changed) where the Python method must run: a slot
 * without facts, or an explicit flow
 * while the C state is not bound to the policy's current arrays.
 *
 * Built by setup.py as a CPython extension (it needs the C API, which cffi
 * does not expose); without it the same steps run in Python.  Called on
 * the policy's one thread; the GIL is held throughout. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core.h"

typedef int (*admit_fn)(struct lxf_mfs *m, int64_t s, double size, double current, int done, int explicit_,
                        int stage, int64_t bneck_link, double bneck_rate, double bneck_weight, int64_t batch,
                        int64_t request, double target, double due);

typedef int (*progress_fn)(struct lxf_mfs *m, int64_t k, const int64_t *slot, const double *current,
                           const char *done);

typedef int (*decide_fn)(struct lxf_mfs *m, int64_t n, int64_t n_new, const double *current, const char *done,
                         double now, double dt, const int64_t *finished, int64_t n_finished);

typedef struct {
    PyObject_HEAD
    PyObject *policy;        /* MfsPolicy: its flags are set and its slow steps called on it */
    PyObject *rmlq;
    PyObject *slot;          /* rmlq.slot: Flow -> slot */
    PyObject *free;          /* rmlq._free */
    PyObject *facts;         /* rmlq.facts */
    PyObject *batch_index, *request_index, *request_batch;
    PyObject *live_flows, *live_requests, *touched, *batch_red;
    PyObject *bneck_cache, *finished_links, *red_by_requests;
    PyObject *stage_codes;   /* laxflow.policy.flow.STAGE_CODES */
    PyObject *p2d;           /* Stage.P2D */
    PyObject *flow_type;     /* laxflow.policy.flow.Flow (subclasses go to facts_of) */
    PyObject *nan;           /* core._NAN: the NaN object the Python admission stores */
    PyObject *bottleneck;    /* core.bottleneck(p, f, capacity) */
    PyObject *facts_of;      /* core.admission_facts(p, flows, capacity) */
    PyObject *core;          /* the policy's NativeCore (its buffers(n) and _after_step's argument) */
    PyObject *admit_new, *bind, *after_step;  /* core.py's Python for the rare steps */
    PyObject *urgency;       /* the rmlq.urgency array the struct was last bound with (bound()) */
    PyObject *capacity;      /* and the capacity array */
    long long gen;           /* the policy's _arrays_gen then (-1: bind again) */
    int64_t room;            /* flows the struct's out-buffers have room for */
    int prunes;              /* config.drop_budget > 0 (MfsConfig is frozen): every reorder is a full one,
                                and every batch departure asks for one */
    double *current;         /* scratch of decide: every flow's (or the named flows') progress */
    char *done;
    int64_t *named;          /* the named flows' slots */
    int64_t *finished;
    Py_ssize_t scratch, finished_room;
    struct lxf_mfs *m;
    admit_fn admit;
    progress_fn progress;
    decide_fn decide;
} Glue;

/* Interned attribute names. */
static PyObject *s_batch, *s_request, *s_deadline, *s_links, *s_weights, *s_stage, *s_downstream, *s_layer,
    *s_size, *s_current_layer, *s_compute_done, *s_batch_slot, *s_request_slot, *s_order_stale, *s_red_moved,
    *s_arrays_gen, *s_urgency, *s_external, *s_reorder, *s_last_t, *s_buffers, *s_ranked_red, *s_red_of;

static PyObject *one;  /* the int 1 */

static int intern_names(void)
{
    if (!(one = PyLong_FromLong(1)))
        return -1;
#define NAME(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1
    NAME(s_batch, "batch"); NAME(s_request, "request"); NAME(s_deadline, "deadline"); NAME(s_links, "links");
    NAME(s_weights, "weights"); NAME(s_stage, "stage"); NAME(s_downstream, "downstream"); NAME(s_layer, "layer");
    NAME(s_size, "size"); NAME(s_current_layer, "current_layer"); NAME(s_compute_done, "compute_done");
    NAME(s_batch_slot, "_batch_slot"); NAME(s_request_slot, "_request_slot"); NAME(s_order_stale, "_order_stale");
    NAME(s_red_moved, "_red_moved"); NAME(s_arrays_gen, "_arrays_gen");
    NAME(s_urgency, "urgency"); NAME(s_external, "_external"); NAME(s_reorder, "_reorder");
    NAME(s_last_t, "_last_t"); NAME(s_buffers, "buffers");
    NAME(s_ranked_red, "_ranked_red"); NAME(s_red_of, "_red_of");
#undef NAME
    return 0;
}

/* Every object a Glue holds (the policy holds its Glue: a cycle the collector must see). */
#define GLUE_FIELDS(X) X(policy) X(rmlq) X(slot) X(free) X(facts) X(batch_index) X(request_index) \
    X(request_batch) X(live_flows) X(live_requests) X(touched) X(batch_red) X(bneck_cache) X(finished_links) \
    X(red_by_requests) X(stage_codes) X(p2d) X(flow_type) X(nan) X(bottleneck) X(facts_of) X(core) \
    X(admit_new) X(bind) X(after_step) X(urgency) X(capacity)

static int glue_traverse(Glue *g, visitproc visit, void *arg)
{
#define VISIT(field) Py_VISIT(g->field);
    GLUE_FIELDS(VISIT)
#undef VISIT
    return 0;
}

static int glue_clear(Glue *g)
{
#define CLEAR(field) Py_CLEAR(g->field);
    GLUE_FIELDS(CLEAR)
#undef CLEAR
    return 0;
}

static void glue_dealloc(Glue *g)
{
    PyObject_GC_UnTrack(g);
    glue_clear(g);
    free(g->current);
    free(g->done);
    free(g->named);
    free(g->finished);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

/* getattr(obj, name) that must be a given type (the policy's containers). */
static PyObject *attr_of(PyObject *obj, const char *name, PyTypeObject *type)
{
    PyObject *v = PyObject_GetAttrString(obj, name);
    if (v && type && !PyObject_TypeCheck(v, type)) {
        PyErr_Format(PyExc_TypeError, "mfs glue: %s is a %s, not a %s", name, Py_TYPE(v)->tp_name, type->tp_name);
        Py_DECREF(v);
        return NULL;
    }
    return v;
}

/* Glue(policy, core, struct, admit, progress, decide, stage_codes, p2d, flow_type, nan, bottleneck,
 *      facts_of, admit_new, bind, after_step): struct, admit, progress and decide are
 * addresses (the lxf_mfs struct, lxf_mfs_admit, lxf_mfs_progress, lxf_mfs_decide_engine). */
static int glue_init(Glue *g, PyObject *args, PyObject *kwds)
{
    PyObject *policy, *core, *codes, *p2d, *flow_type, *nan, *bottleneck, *facts_of, *admit_new, *bind,
        *after_step;
    unsigned long long m_addr, admit_addr, progress_addr, decide_addr;
    static char *kwlist[] = {"policy", "core", "struct", "admit", "progress", "decide", "stage_codes", "p2d",
                             "flow_type", "nan", "bottleneck", "facts_of", "admit_new", "bind", "after_step", NULL};
    if (g->policy) {
        PyErr_SetString(PyExc_RuntimeError, "mfs glue: already initialized");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOKKKKO!OO!O!OOOOO", kwlist, &policy, &core, &m_addr,
                                     &admit_addr, &progress_addr, &decide_addr, &PyDict_Type, &codes, &p2d,
                                     &PyType_Type, &flow_type, &PyFloat_Type, &nan, &bottleneck, &facts_of,
                                     &admit_new, &bind, &after_step))
        return -1;
    if (!m_addr || !admit_addr || !progress_addr || !decide_addr) {
        PyErr_SetString(PyExc_ValueError, "mfs glue: the struct and the C step's functions must not be NULL");
        return -1;
    }
    g->progress = (progress_fn)(uintptr_t)progress_addr;
    g->core = Py_NewRef(core);
    g->admit_new = Py_NewRef(admit_new);
    g->bind = Py_NewRef(bind);
    g->after_step = Py_NewRef(after_step);
    g->decide = (decide_fn)(uintptr_t)decide_addr;
    g->policy = Py_NewRef(policy);
    if (!(g->rmlq = attr_of(policy, "rmlq", NULL))
        || !(g->slot = attr_of(g->rmlq, "slot", &PyDict_Type))
        || !(g->free = attr_of(g->rmlq, "_free", &PyList_Type))
        || !(g->facts = attr_of(g->rmlq, "facts", &PyList_Type))
        || !(g->batch_index = attr_of(policy, "_batch_index", &PyDict_Type))
        || !(g->request_index = attr_of(policy, "_request_index", &PyDict_Type))
        || !(g->request_batch = attr_of(policy, "_request_batch", &PyList_Type))
        || !(g->live_flows = attr_of(policy, "_live_flows", &PyDict_Type))
        || !(g->live_requests = attr_of(policy, "_live_requests", &PyDict_Type))
        || !(g->touched = attr_of(policy, "_touched", &PySet_Type))
        || !(g->batch_red = attr_of(policy, "_batch_red", &PyDict_Type))
        || !(g->bneck_cache = attr_of(policy, "_bneck_cache", &PyDict_Type))
        || !(g->finished_links = attr_of(policy, "_finished_links", &PySet_Type))
        || !(g->red_by_requests = attr_of(policy, "_red_by_requests", &PyDict_Type)))
        return -1;
    PyObject *config = attr_of(policy, "config", NULL), *budget = config ? attr_of(config, "drop_budget", NULL) : NULL;
    Py_XDECREF(config);
    if (!budget)
        return -1;
    g->prunes = PyObject_IsTrue(budget);  /* (MfsConfig: an int >= 0, fixed) */
    Py_DECREF(budget);
    if (g->prunes < 0)
        return -1;
    g->stage_codes = Py_NewRef(codes);
    g->p2d = Py_NewRef(p2d);
    g->flow_type = Py_NewRef(flow_type);
    g->nan = Py_NewRef(nan);
    g->bottleneck = Py_NewRef(bottleneck);
    g->facts_of = Py_NewRef(facts_of);
    g->gen = -1;
    g->m = (struct lxf_mfs *)(uintptr_t)m_addr;
    g->admit = (admit_fn)(uintptr_t)admit_addr;
    return 0;
}

/* Glue.bound(gen, urgency, capacity, room): the struct was bound to the
 * policy's arrays of _arrays_gen ``gen`` (-1: it must be bound again),
 * those slot arrays and that capacity array, with out-buffers for ``room`` flows. */
static PyObject *glue_bound(Glue *g, PyObject *args)
{
    long long gen, room;
    PyObject *urgency, *capacity;
    if (!PyArg_ParseTuple(args, "LOOL", &gen, &urgency, &capacity, &room))
        return NULL;
    Py_XSETREF(g->urgency, Py_NewRef(urgency));
    Py_XSETREF(g->capacity, Py_NewRef(capacity));
    g->gen = gen;
    g->room = room;
    Py_RETURN_NONE;
}

static int set_flag(PyObject *obj, PyObject *name)
{
    return PyObject_SetAttr(obj, name, Py_True);
}

/* d.get(key) as a borrowed reference; NULL with no error set: absent. */
static PyObject *get(PyObject *d, PyObject *key)
{
    return PyDict_GetItemWithError(d, key);
}

static int as_i64(PyObject *o, int64_t *v)
{
    long long x = PyLong_AsLongLong(o);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *v = x;
    return 0;
}

static int as_f64(PyObject *o, double *v)
{
    double x = PyFloat_AsDouble(o);
    if (x == -1.0 && PyErr_Occurred())
        return -1;
    *v = x;
    return 0;
}

/* The int in a new reference, which is released here (NULL: the error already set). */
static int take_i64(PyObject *o, int64_t *v)
{
    if (!o)
        return -1;
    int bad = as_i64(o, v);
    Py_DECREF(o);
    return bad;
}

/* A flow's current_layer as the C step takes it (None: NaN). */
static int current_of(PyObject *f, double *v)
{
    PyObject *c = PyObject_GetAttr(f, s_current_layer);
    if (!c)
        return -1;
    int bad = c == Py_None ? (*v = NAN, 0) : as_f64(c, v);
    Py_DECREF(c);
    return bad;
}

/* MfsPolicy._enter_many for one flow: (batch, request) as new references in *b, *r. */
static int enter(Glue *g, PyObject *f, PyObject **b_out, PyObject **r_out)
{
    PyObject *b = NULL, *r = NULL, *name = NULL, *live, *requests, *count;
    int rc = -1;
    if (!(name = PyObject_GetAttr(f, s_batch)))
        goto out;
    b = get(g->batch_index, name);
    if (b) {
        Py_INCREF(b);
    } else {
        if (PyErr_Occurred() || !(b = PyObject_CallMethodOneArg(g->policy, s_batch_slot, name)))
            goto out;
    }
    Py_SETREF(name, PyObject_GetAttr(f, s_request));
    if (!name)
        goto out;
    r = get(g->request_index, name);
    int known = 0;
    if (r) {
        Py_INCREF(r);
        int64_t v;
        if (take_i64(PyObject_GetItem(g->request_batch, r), &v))  /* request_batch[r] < 0 */
            goto out;
        known = v >= 0;
    } else if (PyErr_Occurred()) {
        goto out;
    }
    if (!known) {
        PyObject *d = PyObject_GetAttr(f, s_deadline);
        if (!d)
            goto out;
        if (d == Py_None)
            Py_SETREF(d, Py_NewRef(g->nan));
        Py_XSETREF(r, PyObject_CallMethodObjArgs(g->policy, s_request_slot, name, d, b, NULL));
        Py_DECREF(d);
        if (!r)
            goto out;
    }
    live = get(g->live_flows, b);
    if (!live) {
        if (PyErr_Occurred())
            goto out;
        /* the batch is live (again): its rank is Algorithm 1's to give */
        PyObject *fresh = PyDict_New(), *fresh_requests = PyDict_New();
        int bad = !fresh || !fresh_requests || PyDict_SetItem(g->live_flows, b, fresh)
                  || PyDict_SetItem(g->live_requests, b, fresh_requests);
        Py_XDECREF(fresh);
        Py_XDECREF(fresh_requests);
        if (bad || PySet_Add(g->touched, b) || set_flag(g->policy, s_order_stale))
            goto out;
        live = get(g->live_flows, b);
        if (!live)
            goto out;
    }
    if (PyDict_SetItem(live, f, r))
        goto out;
    requests = PyObject_GetItem(g->live_requests, b);
    if (!requests)
        goto out;
    count = get(requests, r);
    if (!count) {
        if (PyErr_Occurred() || PyDict_SetItem(requests, r, one)) {
            Py_DECREF(requests);
            goto out;
        }
        /* its live deadlines changed */
        int has = PyDict_Contains(g->batch_red, b);
        if (has < 0 || (has && PyDict_DelItem(g->batch_red, b)) || PySet_Add(g->touched, b)
            || set_flag(g->policy, s_red_moved)) {
            Py_DECREF(requests);
            goto out;
        }
    } else {
        PyObject *more = PyNumber_Add(count, one);
        int bad = !more || PyDict_SetItem(requests, r, more);
        Py_XDECREF(more);
        if (bad) {
            Py_DECREF(requests);
            goto out;
        }
    }
    Py_DECREF(requests);
    rc = 0;
out:
    Py_XDECREF(name);
    if (rc) {
        Py_XDECREF(b);
        Py_XDECREF(r);
    } else {
        *b_out = b;
        *r_out = r;
    }
    return rc;
}

/* Whether a NumPy array is read-only (as ``not a.flags.writeable``); -1 when
 * its buffer cannot say (then the Python bottleneck decides). */
static int read_only(PyObject *a)
{
    Py_buffer view;
    if (PyObject_GetBuffer(a, &view, PyBUF_STRIDES) < 0) {
        PyErr_Clear();
        return -1;
    }
    int ro = view.readonly != 0;
    PyBuffer_Release(&view);
    return ro;
}

/* core.bottleneck: a new reference to its (link, rate, weight) tuple. */
static PyObject *bottleneck(Glue *g, PyObject *f, PyObject *capacity)
{
    PyObject *links = PyObject_GetAttr(f, s_links), *weights = NULL, *out = NULL;
    if (!links || !(weights = PyObject_GetAttr(f, s_weights)))
        goto out;
    if (read_only(links) == 1 && read_only(weights) == 1) {
        PyObject *key = Py_BuildValue("(NN)", PyLong_FromVoidPtr(links), PyLong_FromVoidPtr(weights));
        if (!key)
            goto out;
        PyObject *hit = get(g->bneck_cache, key);
        Py_DECREF(key);
        if (hit && PyTuple_Check(hit) && PyTuple_GET_SIZE(hit) == 4 && PyTuple_GET_ITEM(hit, 2) == capacity) {
            out = Py_NewRef(PyTuple_GET_ITEM(hit, 3));
            goto out;
        }
        if (PyErr_Occurred())
            goto out;
    }
    out = PyObject_CallFunctionObjArgs(g->bottleneck, g->policy, f, capacity, NULL);
out:
    Py_XDECREF(links);
    Py_XDECREF(weights);
    return out;
}

/* float(x) as the Python code writes it: a new reference (NaN: the shared object for None). */
static PyObject *float_or_nan(Glue *g, PyObject *x)
{
    return x == Py_None ? Py_NewRef(g->nan) : PyNumber_Float(x);
}

/* admission_facts for one plain Flow: the facts tuple (a new reference). */
static PyObject *facts_of_flow(Glue *g, PyObject *f, PyObject *capacity)
{
    PyObject *b = NULL, *r = NULL, *bn = NULL, *layer = NULL, *d = NULL, *kind = NULL, *target = NULL,
             *due = NULL, *out = NULL;
    if (enter(g, f, &b, &r))
        return NULL;
    if (!(bn = bottleneck(g, f, capacity)))
        goto out;
    if (!PyTuple_Check(bn) || PyTuple_GET_SIZE(bn) != 3) {
        PyErr_SetString(PyExc_TypeError, "mfs glue: bottleneck gave no (link, rate, weight)");
        goto out;
    }
    if (!(layer = PyObject_GetAttr(f, s_layer)) || !(target = float_or_nan(g, layer)))
        goto out;
    if (!(d = PyObject_GetAttr(f, s_deadline)) || !(kind = PyObject_GetAttr(f, s_stage)))
        goto out;
    if (d == Py_None) {
        due = Py_NewRef(g->nan);
    } else {
        PyObject *down = PyObject_GetAttr(f, s_downstream), *diff;
        if (!down)
            goto out;
        diff = PyNumber_Subtract(d, down);
        Py_DECREF(down);
        if (!diff)
            goto out;
        due = PyNumber_Float(diff);
        Py_DECREF(diff);
        if (!due)
            goto out;
    }
    PyObject *code = get(g->stage_codes, kind);
    if (!code) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, kind);
        goto out;
    }
    PyObject *explicit_ = (kind == g->p2d && d != Py_None) ? Py_True : Py_False;
    out = PyTuple_Pack(9, explicit_, code, PyTuple_GET_ITEM(bn, 0), PyTuple_GET_ITEM(bn, 1),
                       PyTuple_GET_ITEM(bn, 2), b, r, target, due);
out:
    Py_XDECREF(b); Py_XDECREF(r); Py_XDECREF(bn); Py_XDECREF(layer); Py_XDECREF(d); Py_XDECREF(kind);
    Py_XDECREF(target); Py_XDECREF(due);
    return out;
}

/* lxf_mfs_admit with a flow's facts and progress, converted as cffi converts them. */
static int admit_one(Glue *g, PyObject *f, int64_t s, PyObject *fact)
{
    PyObject *size_o = NULL, *done_o = NULL;
    int rc = -1;
    if (!PyTuple_Check(fact) || PyTuple_GET_SIZE(fact) != 9) {
        PyErr_SetString(PyExc_TypeError, "mfs glue: a flow's facts are not a 9-tuple");
        return -1;
    }
    double size, current, rate, weight, target, due;
    int64_t done, explicit_, stage, link, batch, request;
    if (!(size_o = PyObject_GetAttr(f, s_size)) || as_f64(size_o, &size))
        goto out;
    if (current_of(f, &current) || !(done_o = PyObject_GetAttr(f, s_compute_done)) || as_i64(done_o, &done))
        goto out;
    if (as_i64(PyTuple_GET_ITEM(fact, 0), &explicit_) || as_i64(PyTuple_GET_ITEM(fact, 1), &stage)
        || as_i64(PyTuple_GET_ITEM(fact, 2), &link) || as_f64(PyTuple_GET_ITEM(fact, 3), &rate)
        || as_f64(PyTuple_GET_ITEM(fact, 4), &weight) || as_i64(PyTuple_GET_ITEM(fact, 5), &batch)
        || as_i64(PyTuple_GET_ITEM(fact, 6), &request) || as_f64(PyTuple_GET_ITEM(fact, 7), &target)
        || as_f64(PyTuple_GET_ITEM(fact, 8), &due))
        goto out;
    int r = g->admit(g->m, s, size, current, (int)done, (int)explicit_, (int)stage, link, rate, weight, batch,
                     request, target, due);
    if (r == LXF_MFS_NO_MEMORY) {
        PyErr_SetString(PyExc_MemoryError, "no memory for the mfs request progress");
        goto out;
    }
    if (r) {
        PyErr_SetString(PyExc_RuntimeError,
                        "mfs: a new flow's RMLQ slot is out of range for the C step (policy state out of step)");
        goto out;
    }
    rc = 0;
out:
    Py_XDECREF(size_o);
    Py_XDECREF(done_o);
    return rc;
}

/* Glue.admit(flows, kept, capacity, allocated) -> bool
 *
 * The new flows flows[kept:] into the RMLQ (core._admit_new): their
 * slots written into the decision's tag array (the struct's e_tag) in order,
 * then, flow by flow, their batch and request entered, their facts into
 * rmlq.facts and (lxf_mfs_admit) with their progress into the slot arrays.
 * allocated=False: the slots are taken from the RMLQ's free list, and
 * nothing is done (False) when it holds fewer than the new flows (the
 * caller allocates, which may grow the arrays, binds, and calls again with
 * allocated=True: the slots are then read from the tag array). */
static int admit_flows(Glue *g, PyObject *flows, Py_ssize_t kept, PyObject *capacity, int allocated)
{
    Py_ssize_t n = PyList_GET_SIZE(flows);
    if (kept < 0 || kept > n) {
        PyErr_SetString(PyExc_ValueError, "mfs glue: kept out of range");
        return -1;
    }
    int64_t *tag = (int64_t *)g->m->e_tag;
    if (!tag) {
        PyErr_SetString(PyExc_RuntimeError, "mfs glue: the struct is bound to no engine tag column");
        return -1;
    }
    if (!allocated) {
        Py_ssize_t nfree = PyList_GET_SIZE(g->free);
        if (nfree < n - kept)
            return 0;
        for (Py_ssize_t i = kept; i < n; i++) {  /* Rmlq.allocate: the free list's last slot */
            PyObject *s = Py_NewRef(PyList_GET_ITEM(g->free, nfree - 1));
            if (PyList_SetSlice(g->free, nfree - 1, nfree, NULL) < 0) {
                Py_DECREF(s);
                return -1;
            }
            nfree--;
            int64_t v;
            if (PyDict_SetItem(g->slot, PyList_GET_ITEM(flows, i), s) || as_i64(s, &v)) {
                Py_DECREF(s);
                return -1;
            }
            Py_DECREF(s);
            tag[i] = v;
        }
    }
    Py_ssize_t nfacts = PyList_GET_SIZE(g->facts);
    for (Py_ssize_t i = kept; i < n; i++) {
        PyObject *f = PyList_GET_ITEM(flows, i), *fact;
        int64_t s = tag[i];
        if (s < 0 || s >= nfacts) {
            PyErr_SetString(PyExc_RuntimeError, "mfs glue: a new flow's slot is not in rmlq.facts");
            return -1;
        }
        if (Py_TYPE(f) == (PyTypeObject *)g->flow_type) {
            fact = facts_of_flow(g, f, capacity);
        } else {  /* a subclass may define its own due: admission_facts as it is */
            PyObject *single = PyList_New(1), *list;
            if (!single)
                return -1;
            PyList_SET_ITEM(single, 0, Py_NewRef(f));
            list = PyObject_CallFunctionObjArgs(g->facts_of, g->policy, single, capacity, NULL);
            Py_DECREF(single);
            if (!list)
                return -1;
            fact = PySequence_GetItem(list, 0);
            Py_DECREF(list);
        }
        if (!fact)
            return -1;
        if (PyList_SetItem(g->facts, s, Py_NewRef(fact)) || admit_one(g, f, s, fact)) {
            Py_DECREF(fact);
            return -1;
        }
        Py_DECREF(fact);
    }
    return 1;
}

static PyObject *glue_admit(Glue *g, PyObject *args)
{
    PyObject *flows, *capacity;
    Py_ssize_t kept;
    int allocated;
    if (!PyArg_ParseTuple(args, "O!nOp", &PyList_Type, &flows, &kept, &capacity, &allocated))
        return NULL;
    int rc = admit_flows(g, flows, kept, capacity, allocated);
    return rc < 0 ? NULL : PyBool_FromLong(rc);
}

/* Room for n flows' progress and n_finished links in the scratch of decide. */
static int scratch(Glue *g, Py_ssize_t n, Py_ssize_t n_finished)
{
    if (n > g->scratch) {
        Py_ssize_t room = n > 2 * g->scratch ? n : 2 * g->scratch;
        double *current = realloc(g->current, room * sizeof *current);
        if (current)
            g->current = current;
        char *done = current ? realloc(g->done, room) : NULL;
        if (done)
            g->done = done;
        int64_t *named = done ? realloc(g->named, room * sizeof *named) : NULL;
        if (named)
            g->named = named;
        if (!current || !done || !named) {
            PyErr_NoMemory();
            return -1;
        }
        g->scratch = room;
    }
    if (n_finished > g->finished_room) {
        int64_t *finished = realloc(g->finished, n_finished * sizeof *finished);
        if (!finished) {
            PyErr_NoMemory();
            return -1;
        }
        g->finished = finished;
        g->finished_room = n_finished;
    }
    return 0;
}

/* One flow's progress into the scratch at i (core._progress). */
static int progress_at(Glue *g, PyObject *f, Py_ssize_t i)
{
    PyObject *d;
    if (current_of(f, &g->current[i]) || !(d = PyObject_GetAttr(f, s_compute_done)))
        return -1;
    int64_t v;
    int bad = as_i64(d, &v);
    Py_DECREF(d);
    if (bad)
        return -1;
    if (v < 0 || v > 255) {  /* as bytes() says it */
        PyErr_SetString(PyExc_ValueError, "bytes must be in range(0, 256)");
        return -1;
    }
    g->done[i] = (char)v;
    return 0;
}

/* core._progress_of: the progress of the flows the owner named, by slot
 * (flows no longer live skipped; new ones were read at admission). */
static int progress_of(Glue *g, PyObject *named)
{
    PyObject *seq = PySequence_Fast(named, "mfs glue: progressed must be a sequence of flows");
    if (!seq)
        return -1;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq), live = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int rc = -1;
    if (scratch(g, k, 0))
        goto out;
    for (Py_ssize_t j = 0; j < k; j++) {  /* (one pass: reading progress changes nothing) */
        PyObject *s = get(g->slot, items[j]);
        if (!s) {
            if (PyErr_Occurred())
                goto out;
            continue;
        }
        if (as_i64(s, &g->named[live]) || progress_at(g, items[j], live))
            goto out;
        live++;
    }
    if (!live) {
        rc = 0;
        goto out;
    }
    int r = g->progress(g->m, live, g->named, g->current, g->done);
    if (r == LXF_MFS_BAD_INDEX)
        PyErr_SetString(PyExc_RuntimeError,
                        "mfs: a named flow's RMLQ slot is out of range for the C step (policy state out of step)");
    else if (r)
        PyErr_SetString(PyExc_MemoryError, "no memory for the mfs request progress");
    else
        rc = 0;
out:
    Py_DECREF(seq);
    return rc;
}

/* core._progress: every flow's current layer (NaN: none) and compute-ended flag. */
static int progress(Glue *g, PyObject *flows, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (progress_at(g, PyList_GET_ITEM(flows, i), i))
            return -1;
    return 0;
}

/* Whether attribute ``name`` of ``obj`` is true (-1: error). */
static int attr_true(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v)
        return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* MfsPolicy._red_of(b) for live batch b: its memo, or by its live requests
 * from the policy's cache (memoized then), or the Python method. A new reference. */
static PyObject *red_of(Glue *g, PyObject *b)
{
    PyObject *red = get(g->batch_red, b);
    if (red)
        return Py_NewRef(red);
    if (PyErr_Occurred())
        return NULL;
    PyObject *requests = PyObject_GetItem(g->live_requests, b), *key;
    if (!requests)
        return NULL;
    key = PySequence_Tuple(requests);
    Py_DECREF(requests);
    if (!key)
        return NULL;
    red = get(g->red_by_requests, key);
    Py_DECREF(key);
    if (!red) {
        if (PyErr_Occurred())
            return NULL;
        return PyObject_CallMethodOneArg(g->policy, s_red_of, b);
    }
    Py_INCREF(red);
    if (PyDict_SetItem(g->batch_red, b, red)) {
        Py_DECREF(red);
        return NULL;
    }
    return red;
}

/* MfsPolicy._reorder's first steps: its flags reset, and whether the ranks
 * hold (MfsPolicy._ranks_hold: then the touched batches are forgotten,
 * and that is the whole reorder). 1: they hold; 0: the Python method must
 * run (it does these steps again, to the same effect); -1: error. */
static int ranks_hold(Glue *g)
{
    if (PyObject_SetAttr(g->policy, s_order_stale, Py_False) || PyObject_SetAttr(g->policy, s_red_moved, Py_False))
        return -1;
    int external = attr_true(g->policy, s_external);
    if (external)
        return external < 0 ? -1 : 0;
    if (g->prunes)
        return 0;
    PyObject *ranked = PyObject_GetAttr(g->policy, s_ranked_red), *b;
    if (!ranked)
        return -1;
    if (!PyDict_Check(ranked)) {
        Py_DECREF(ranked);
        return 0;
    }
    Py_ssize_t pos = 0;
    Py_hash_t hash;
    int rc = 1;
    while (rc == 1 && _PySet_NextEntry(g->touched, &pos, &b, &hash)) {
        int live = PyDict_Contains(g->live_flows, b);
        if (live <= 0) {
            rc = live < 0 ? -1 : 1;
            continue;
        }
        PyObject *red = red_of(g, b), *was, *ne;
        if (!red) {
            rc = -1;
            break;
        }
        was = get(ranked, b);
        if (!was && PyErr_Occurred()) {
            Py_DECREF(red);
            rc = -1;
            break;
        }
        ne = PyObject_RichCompare(was ? was : Py_None, red, Py_NE);  /* (as != : NaN is never equal, even to itself) */
        Py_DECREF(red);
        int moved = ne ? PyObject_IsTrue(ne) : -1;
        Py_XDECREF(ne);
        rc = moved < 0 ? -1 : !moved;
    }
    Py_DECREF(ranked);
    if (rc == 1 && PySet_Clear(g->touched))
        return -1;
    return rc;
}

/* decide_step: the body of Glue.decide (below), after its binding:
 *
 * core._decide_incremental for the out-arrays the struct is bound to
 * (glue_decide bound the snapshot's columns and copied the kept flows'
 * tags in): admission,
 * progress, RED order (MfsPolicy._reorder, in Python), binding, the
 * explicit-load interval and the C step, in _decide_incremental's order and with
 * its Python for the rare steps.  The timer (None: none). */
static PyObject *decide_step(Glue *g, PyObject *const *args)
{
    PyObject *flows = args[0], *now_o = args[1], *progressed = args[3], *capacity = args[4], *snapshot = args[6];
    if (!PyList_Check(flows)) {
        PyErr_SetString(PyExc_TypeError, "mfs glue: flows must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(flows), kept = PyLong_AsSsize_t(args[2]);
    double now;
    if ((kept == -1 && PyErr_Occurred()) || as_f64(now_o, &now))
        return NULL;
    int every = progressed == Py_True;
    if (kept < n) {  /* (their progress goes in with their facts) */
        PyObject *urgency = PyObject_GetAttr(g->rmlq, s_urgency);
        if (!urgency)
            return NULL;
        int fast = urgency == g->urgency;  /* (else the struct is bound again first: the facts go there) */
        Py_DECREF(urgency);
        int rc = fast ? admit_flows(g, flows, kept, capacity, 0) : 0;
        if (rc < 0)
            return NULL;
        if (!rc) {
            PyObject *r = PyObject_CallFunctionObjArgs(g->admit_new, g->policy, flows, args[2], capacity, NULL);
            if (!r)
                return NULL;
            Py_DECREF(r);
        }
    }
    if (every) {
        if (scratch(g, n, 0) || progress(g, flows, n))
            return NULL;
    }
    int stale = attr_true(g->policy, s_order_stale);
    if (stale < 0)
        return NULL;
    if (stale) {  /* (reads no level; pruning reads snapshot()) */
        int hold = ranks_hold(g);
        if (hold < 0)
            return NULL;
        if (!hold) {
            PyObject *r = PyObject_CallMethodOneArg(g->policy, s_reorder, snapshot);
            if (!r)
                return NULL;
            Py_DECREF(r);
        }
    }
    /* _bound: after admission and reorder (either may have replaced an array) */
    PyObject *urgency;
    int64_t gen;
    if (take_i64(PyObject_GetAttr(g->policy, s_arrays_gen), &gen) || !(urgency = PyObject_GetAttr(g->rmlq, s_urgency)))
        return NULL;
    int bound = gen == g->gen && urgency == g->urgency && capacity == g->capacity;
    Py_DECREF(urgency);
    if (!bound) {
        PyObject *r = PyObject_CallFunctionObjArgs(g->bind, g->policy, capacity, NULL);
        if (!r)
            return NULL;
        Py_DECREF(r);
    }
    if (n > g->room) {
        PyObject *size = PyLong_FromSsize_t(n), *r;
        if (!size)
            return NULL;
        r = PyObject_CallMethodOneArg(g->core, s_buffers, size);
        Py_DECREF(size);
        if (!r)
            return NULL;
        Py_DECREF(r);
    }
    if (!every) {
        int named = PyObject_IsTrue(progressed);
        if (named < 0)
            return NULL;
        if (named && progress_of(g, progressed))  /* the flows the owner named: their progress, by slot */
            return NULL;
    }
    /* MfsPolicy._measure_interval_at (the links were fitted at binding) */
    PyObject *last_o = PyObject_GetAttr(g->policy, s_last_t);
    if (!last_o)
        return NULL;
    double dt = -1.0;
    if (last_o != Py_None) {
        double last;
        int bad = as_f64(last_o, &last);
        if (!bad && !(now <= last))
            dt = now - last;
        if (bad) {
            Py_DECREF(last_o);
            return NULL;
        }
    }
    Py_DECREF(last_o);
    if (PyObject_SetAttr(g->policy, s_last_t, now_o))
        return NULL;
    Py_ssize_t n_finished = PySet_GET_SIZE(g->finished_links);
    if (n_finished) {  /* list(finished): the set's order */
        if (scratch(g, 0, n_finished))
            return NULL;
        Py_ssize_t pos = 0, k = 0;
        PyObject *key;
        Py_hash_t hash;
        while (_PySet_NextEntry(g->finished_links, &pos, &key, &hash))
            if (as_i64(key, &g->finished[k++]))
                return NULL;
    }
    int rc = g->decide(g->m, n, n - kept, every ? g->current : NULL, every ? g->done : NULL, now, dt,
                       n_finished ? g->finished : NULL, n_finished);
    if (!rc && n_finished && dt >= 0 && PySet_Clear(g->finished_links))
        return NULL;  /* (as _after_step: the finished bytes are in the average now) */
    if (rc || g->m->o_counts[0] || g->m->o_counts[1]) {
        PyObject *rc_o = PyLong_FromLong(rc), *zero = PyLong_FromLong(0), *r = NULL;
        if (rc_o && zero)
            r = PyObject_CallFunctionObjArgs(g->after_step, g->policy, g->core, flows, rc_o, zero, NULL);
        Py_XDECREF(rc_o);
        Py_XDECREF(zero);
        return r;
    }
    double t_next = g->m->o_timer[0];
    if (t_next != t_next)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(t_next);
}

/* Glue.decide(flows, now, kept, progressed, capacity, columns, snapshot)
 *
 * columns: (remaining, tag, link_load), the snapshot's arrays (float64,
 * int64, float64; C-contiguous), read in place while the call runs: the
 * struct reads remaining[n] and link_load[len(capacity)] there, and the
 * first ``kept`` tags (the kept flows' RMLQ slots) are copied into its tag
 * array (e_tag, room for the flows: NativeCore.buffers) before admission
 * writes the new flows'; then decide_step. */
static PyObject *glue_decide(Glue *g, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "mfs glue: decide takes 7 arguments");
        return NULL;
    }
    PyObject *cols = args[5];
    if (!PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "mfs glue: flows must be a list");
        return NULL;
    }
    if (!PyTuple_Check(cols) || PyTuple_GET_SIZE(cols) != 3) {
        PyErr_SetString(PyExc_TypeError, "mfs glue: columns must be (remaining, tag, link_load)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(args[0]), kept = PyLong_AsSsize_t(args[2]);
    Py_ssize_t links = PyObject_Length(args[4]);
    if ((kept == -1 && PyErr_Occurred()) || links < 0)
        return NULL;
    if (kept < 0 || kept > n) {
        PyErr_SetString(PyExc_ValueError, "mfs glue: kept out of range");
        return NULL;
    }
    if (!g->m->e_tag || n > g->room) {
        PyErr_SetString(PyExc_RuntimeError, "mfs glue: the struct has no room for the decision (NativeCore.buffers)");
        return NULL;
    }
    Py_buffer b[3];
    const Py_ssize_t count[3] = {n, n, links};
    int got = 0;
    PyObject *r = NULL;
    for (; got < 3; got++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(cols, got), &b[got], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT))
            goto out;
        const char *f = b[got].format ? b[got].format : "B";
        int ok = b[got].itemsize == 8 && (got == 1 ? (f[0] == 'l' || f[0] == 'q') : f[0] == 'd') && !f[1]
                 && b[got].len >= 8 * count[got];
        if (!ok) {
            PyBuffer_Release(&b[got]);
            PyErr_Format(PyExc_TypeError, "mfs glue: columns[%d] must be %zd %s", got, count[got],
                         got == 1 ? "int64" : "float64");
            goto out;
        }
    }
    g->m->e_remaining = (const double *)b[0].buf;
    memcpy((int64_t *)g->m->e_tag, b[1].buf, (size_t)kept * sizeof(int64_t));
    g->m->e_link_load = (const double *)b[2].buf;
    r = decide_step(g, args);
out:
    while (got > 0)
        PyBuffer_Release(&b[--got]);
    return r;
}

/* Glue.complete(flow) -> bool: MfsPolicy.on_complete, or False (nothing
 * changed) where the Python method must run it. */
static PyObject *glue_complete(Glue *g, PyObject *flow)
{
    PyObject *s_obj = get(g->slot, flow);
    if (!s_obj) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_TRUE;  /* no slot: nothing to forget */
    }
    int64_t s;
    if (as_i64(s_obj, &s))
        return NULL;
    if (s < 0 || s >= PyList_GET_SIZE(g->facts))
        Py_RETURN_FALSE;
    PyObject *facts = PyList_GET_ITEM(g->facts, s);
    if (!PyTuple_Check(facts) || PyTuple_GET_SIZE(facts) != 9)
        Py_RETURN_FALSE;  /* admission never finished */
    int explicit_ = PyObject_IsTrue(PyTuple_GET_ITEM(facts, 0));
    if (explicit_ < 0)
        return NULL;
    int64_t link = -1;
    double weight = 0.0;
    if (explicit_) {
        /* the finished bytes go through the struct: only while it is bound to the policy's arrays */
        PyObject *urgency;
        int64_t v;
        if (take_i64(PyObject_GetAttr(g->policy, s_arrays_gen), &v)
            || !(urgency = PyObject_GetAttr(g->rmlq, s_urgency)))
            return NULL;
        int bound = v == g->gen && urgency == g->urgency && s < g->m->slots;
        Py_DECREF(urgency);
        if (!bound)
            Py_RETURN_FALSE;
        if (g->m->num_links > 0) {  /* (the bound arrays' length: _finished_bytes.size) */
            if (as_i64(PyTuple_GET_ITEM(facts, 2), &link) || as_f64(PyTuple_GET_ITEM(facts, 4), &weight))
                return NULL;
            if (link < 0 || link >= g->m->num_links)
                Py_RETURN_FALSE;
        }
    }
    /* From here on as on_complete: its slot free, ... */
    Py_INCREF(facts);
    Py_INCREF(s_obj);
    PyObject *b = PyTuple_GET_ITEM(facts, 5), *live, *requests = NULL, *r = NULL, *count, *result = NULL;
    if (PyDict_DelItem(g->slot, flow) || PyList_Append(g->free, s_obj))
        goto out;
    if (link >= 0) {  /* its last bytes moved since the last decision: counted there */
        g->m->finished_bytes[link] += g->m->last_rem[s] * weight;
        PyObject *l = PyTuple_GET_ITEM(facts, 2);
        if (PySet_Add(g->finished_links, l))
            goto out;
    }
    live = get(g->live_flows, b);
    if (!live) {
        if (!PyErr_Occurred())
            result = Py_NewRef(Py_True);
        goto out;
    }
    if (!(r = PyObject_GetItem(live, flow)) || PyDict_DelItem(live, flow))
        goto out;
    if (!(requests = PyObject_GetItem(g->live_requests, b)) || !(count = PyObject_GetItem(requests, r)))
        goto out;
    PyObject *less = PyNumber_Subtract(count, one);
    Py_DECREF(count);
    if (!less)
        goto out;
    int left = PyObject_IsTrue(less);
    if (left) {
        int bad = left < 0 || PyDict_SetItem(requests, r, less);
        Py_DECREF(less);
        if (!bad)
            result = Py_NewRef(Py_True);
        goto out;
    }
    Py_DECREF(less);
    if (PyDict_DelItem(requests, r))
        goto out;
    int has = PyDict_Contains(g->batch_red, b);  /* its live deadlines changed */
    if (has < 0 || (has && PyDict_DelItem(g->batch_red, b)) || PySet_Add(g->touched, b))
        goto out;
    if (PyDict_GET_SIZE(live)) {
        if (!set_flag(g->policy, s_red_moved))
            result = Py_NewRef(Py_True);
        goto out;
    }
    Py_INCREF(b);  /* (the dicts' deletions below may drop the last other reference) */
    int bad = PyDict_DelItem(g->live_flows, b) || PyDict_DelItem(g->live_requests, b);
    Py_DECREF(b);
    if (bad)
        goto out;
    /* Batch departure: Algorithm 1 runs again unless it would only close the gap (MfsPolicy.on_complete). */
    int stale = attr_true(g->policy, s_red_moved);
    if (!stale)
        stale = attr_true(g->policy, s_external);
    if (!stale)
        stale = g->prunes;
    if (stale < 0 || (stale && set_flag(g->policy, s_order_stale)))
        goto out;
    result = Py_NewRef(Py_True);
out:
    Py_XDECREF(r);
    Py_XDECREF(requests);
    Py_DECREF(s_obj);
    Py_DECREF(facts);
    return result;
}

static PyMethodDef glue_methods[] = {
    {"admit", (PyCFunction)glue_admit, METH_VARARGS, "The engine's new flows into the RMLQ (core._admit_new)."},
    {"complete", (PyCFunction)glue_complete, METH_O, "MfsPolicy.on_complete, or False: the Python method must run."},
    {"decide", (PyCFunction)(void (*)(void))glue_decide, METH_FASTCALL,
     "core._decide_incremental for the out-arrays the struct is bound to."},
    {"bound", (PyCFunction)glue_bound, METH_VARARGS, "The struct was bound to the arrays of _arrays_gen gen."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject GlueType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "laxflow.policy.mfs._glue.Glue",
    .tp_basicsize = sizeof(Glue),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)glue_traverse,
    .tp_clear = (inquiry)glue_clear,
    .tp_doc = "One mfs policy's decision, admission and completion glue (see glue.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)glue_init,
    .tp_dealloc = (destructor)glue_dealloc,
    .tp_methods = glue_methods,
};

static struct PyModuleDef glue_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "laxflow.policy.mfs._glue",
    .m_doc = "The mfs policy's per-flow Python glue in C (see glue.c).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__glue(void)
{
    if (intern_names() || PyType_Ready(&GlueType) < 0)
        return NULL;
    PyObject *mod = PyModule_Create(&glue_module);
    if (!mod)
        return NULL;
    if (PyModule_AddObjectRef(mod, "Glue", (PyObject *)&GlueType) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
