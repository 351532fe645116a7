/* The mfs core's Python type (see core.h): Core(levels, period, window, prunes, thresholds, dscp, red,
 * reorder, notes), its decide, its methods, the module laxflow.policy.mfs._core. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "structmember.h"

PyObject *np_empty, *np_contiguous, *dt_f64, *dt_i64, *dt_u8, *decision_type, *stage_codes, *empty_tuple;
PyObject *s_flows, *s_now, *s_capacity, *s_remaining, *s_tag, *s_kept, *s_progressed, *s_link_load,
    *s_link_load_in_use, *s_batch, *s_request, *s_deadline, *s_size, *s_links, *s_weights, *s_stage, *s_layer,
    *s_current_layer, *s_compute_done, *s_due, *s_explicit, *s_id, *s_timers;

/* ------------------------------------------------------------ scratch and per-link arrays */

/* Scratch of a decision over n flows (one block: nothing in it outlives a decision). */
static int reserve_flows(Core *c, int64_t n)
{
    if (n <= c->room_flows)
        return 0;
    int64_t room = n > 2 * c->room_flows ? n : 2 * c->room_flows;
    char *block = malloc((size_t)room * (sizeof(Key) + 8 * 4 + 1));
    if (!block) {
        PyErr_NoMemory();
        return -1;
    }
    free(c->keys);
    c->keys = (Key *)block;
    c->pos_slot = (int64_t *)(block + sizeof(Key) * room);
    c->noted = c->pos_slot + room; /* (pairs) */
    c->bad = c->noted + 2 * room;
    c->is_new = (uint8_t *)(c->bad + room);
    c->room_flows = room;
    return 0;
}

/* Per-link arrays for `links` links (one block): the averages start over at 0 (the network changed). */
static int fit_links(Core *c, int64_t links)
{
    size_t n = (size_t)(links ? links : 1);
    char *block = calloc(n, 6 * 8 + 3);
    if (!block) {
        PyErr_NoMemory();
        return -1;
    }
    free(c->load);
    c->load = (double *)block, c->finished = c->load + n, c->sent = c->finished + n;
    c->finished_list = (int64_t *)(c->sent + n), c->touched_links = c->finished_list + n;
    c->nonzero = c->touched_links + n;
    c->is_finished = (uint8_t *)(c->nonzero + n), c->has_sent = c->is_finished + n, c->in_nonzero = c->has_sent + n;
    c->links = links;
    c->n_finished = c->n_nonzero = 0;
    return 0;
}

/* ------------------------------------------------------------ Python values */

int mfs_as_f64(PyObject *o, double *v)
{
    double x = PyFloat_AsDouble(o);
    if (x == -1.0 && PyErr_Occurred())
        return -1;
    *v = x;
    return 0;
}

/* getattr(o, name) as a double, None as NaN. */
int mfs_attr_f64(PyObject *o, PyObject *name, double *v)
{
    PyObject *x = PyObject_GetAttr(o, name);
    if (!x)
        return -1;
    int bad = x == Py_None ? (*v = NAN, 0) : mfs_as_f64(x, v);
    Py_DECREF(x);
    return bad;
}

int mfs_attr_true(PyObject *o, PyObject *name)
{
    PyObject *x = PyObject_GetAttr(o, name);
    if (!x)
        return -1;
    int t = PyObject_IsTrue(x);
    Py_DECREF(x);
    return t;
}

/* A C-contiguous 1-D buffer of `count` or more items of `kind` ('d' float64, 'q' int64) over obj,
 * converted by numpy.ascontiguousarray when obj is not one.  mfs_put_buffer releases it (and a Buf
 * that holds nothing, as {0} does). */
int mfs_get_buffer(PyObject *obj, char kind, Py_ssize_t count, Buf *b, const char *what)
{
    b->copy = NULL;
    b->held = 0;
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
        const char *f = b->view.format ? b->view.format : "B";
        if (f[0] == '<' || f[0] == '=' || f[0] == '@')
            f++;
        int match = b->view.itemsize == 8 && !f[1] && (kind == 'd' ? f[0] == 'd' : (f[0] == 'q' || f[0] == 'l'));
        if (match && b->view.ndim <= 1)
            goto sized;
        PyBuffer_Release(&b->view);
    } else
        PyErr_Clear();
    b->copy = PyObject_CallFunctionObjArgs(np_contiguous, obj, kind == 'd' ? dt_f64 : dt_i64, NULL);
    if (!b->copy || PyObject_GetBuffer(b->copy, &b->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)) {
        Py_CLEAR(b->copy);
        return -1;
    }
sized:
    b->held = 1;
    if (b->view.len / 8 < count) {
        PyErr_Format(PyExc_ValueError, "mfs: %s has %zd values, %zd needed", what, b->view.len / 8, count);
        mfs_put_buffer(b);
        return -1;
    }
    return 0;
}

void mfs_put_buffer(Buf *b)
{
    if (b->held)
        PyBuffer_Release(&b->view);
    Py_CLEAR(b->copy);
    b->held = 0;
}

/* The flows' request progress into their slots: every flow's (named NULL), or the named flows' that
 * have a slot. */
static int read_progress(Core *c, PyObject **flows, int64_t n, PyObject *named)
{
    PyObject *fast = NULL;
    if (named) {
        if (!(fast = PySequence_Fast(named, "mfs: Snapshot.progressed must be True, False or a list of flows")))
            return -1;
        flows = PySequence_Fast_ITEMS(fast);
        n = PySequence_Fast_GET_SIZE(fast);
    }
    int rc = 0;
    for (int64_t i = 0; i < n && !rc; i++) {
        int64_t s;
        if (named) {
            PyObject *so = PyDict_GetItemWithError(c->slot_of, flows[i]);
            if (!so) { /* (not admitted yet, or done) */
                rc = PyErr_Occurred() ? -1 : 0;
                continue;
            }
            s = PyLong_AsLongLong(so);
        } else
            s = c->pos_slot[i];
        Slot *x = &c->slots[s];
        int done;
        if (mfs_attr_f64(flows[i], s_current_layer, &x->seen_layer) || (done = mfs_attr_true(flows[i], s_compute_done)) < 0)
            rc = -1;
        else
            x->seen_done = (uint8_t)done;
    }
    Py_XDECREF(fast);
    return rc;
}

/* The out-arrays (level, queue, dscp, tag) let go of, and the Decisions over them. */
static void release_out(Core *c)
{
    for (int j = 0; j < 4; j++)
        if (c->out[j]) {
            PyBuffer_Release(&c->outbuf[j]);
            Py_CLEAR(c->out[j]);
        }
    c->out_room = 0;
    if (c->views)
        PyDict_Clear(c->views);
}

static PyObject **const out_dtype[4] = {&dt_i64, &dt_i64, &dt_u8, &dt_i64}; /* level, queue, dscp, tag */

/* numpy.empty(n) of out-array j's dtype, with its buffer. */
static PyObject *new_out(int j, int64_t n, Py_buffer *b)
{
    PyObject *a = PyObject_CallFunction(np_empty, "LO", (long long)n, *out_dtype[j]);
    if (a && PyObject_GetBuffer(a, b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS))
        Py_CLEAR(a);
    return a;
}

/* The out-arrays with room for n flows (grown by doubling). */
static int reserve_out(Core *c, int64_t n)
{
    if (n <= c->out_room)
        return 0;
    int64_t room = n > 2 * c->out_room ? n : 2 * c->out_room;
    release_out(c);
    for (int j = 0; j < 4; j++)
        if (!(c->out[j] = new_out(j, room, &c->outbuf[j]))) {
            release_out(c);
            return -1;
        }
    c->out_room = room;
    return 0;
}

/* Decision(level, queue, dscp, timers, tag) over the out-arrays' first n: views of them with the tag
 * (an incremental owner reads them before the next decision), or copies without (an owner may keep
 * them). */
static PyObject *over_out(Core *c, int64_t n, int copy, PyObject *timers)
{
    PyObject *v[4] = {NULL, NULL, NULL, Py_NewRef(Py_None)}, *d = NULL;
    int j = 0, arrays = copy ? 3 : 4;
    for (; j < arrays; j++) {
        Py_buffer b;
        if (!copy)
            Py_XSETREF(v[j], PySequence_GetSlice(c->out[j], 0, n));
        else if ((v[j] = new_out(j, n, &b))) {
            memcpy(b.buf, c->outbuf[j].buf, (size_t)b.len);
            PyBuffer_Release(&b);
        }
        if (!v[j])
            break;
    }
    if (j == arrays) {
        PyObject *kw = Py_BuildValue("{sOsOsOsOsO}", "level", v[0], "queue", v[1], "dscp", v[2], "timers", timers,
                                     "tag", v[3]);
        d = kw ? PyObject_Call(decision_type, empty_tuple, kw) : NULL;
        Py_XDECREF(kw);
    }
    for (j = 0; j < 4; j++)
        Py_XDECREF(v[j]);
    return d;
}

/* The view Decision over the out-arrays' first n (one per n, handed out again), its timers set. */
static PyObject *out_decision(Core *c, int64_t n, PyObject *timers)
{
    PyObject *key = PyLong_FromLongLong(n), *d;
    if (!key)
        return NULL;
    d = PyDict_GetItemWithError(c->views, key);
    if (d)
        Py_INCREF(d);
    else if (!PyErr_Occurred() && (d = over_out(c, n, 0, empty_tuple))) {
        if (PyDict_GET_SIZE(c->views) >= 4096)
            PyDict_Clear(c->views);
        if (PyDict_SetItem(c->views, key, d))
            Py_CLEAR(d);
    }
    Py_DECREF(key);
    if (d && PyObject_SetAttr(d, s_timers, timers))
        Py_CLEAR(d);
    return d;
}

/* notes(flows, noted, bad) with a decision's noted (position, RMLQ level) pairs and bad positions. */
static int call_notes(Core *c, PyObject *flows, int64_t nn, int64_t nb)
{
    PyObject *noted = PyList_New(2 * nn), *bad = PyList_New(nb), *r = NULL;
    for (int64_t j = 0; noted && j < 2 * nn; j++)
        PyList_SET_ITEM(noted, j, PyLong_FromLongLong(c->noted[j]));
    for (int64_t j = 0; bad && j < nb; j++)
        PyList_SET_ITEM(bad, j, PyLong_FromLongLong(c->bad[j]));
    if (noted && bad)
        r = PyObject_CallFunctionObjArgs(c->notes, flows, noted, bad, NULL);
    int rc = r ? 0 : -1;
    Py_XDECREF(noted);
    Py_XDECREF(bad);
    Py_XDECREF(r);
    return rc;
}

/* Each flow's slot: the first `kept` from the tags (checked), the others' from slot_of, or new (admitted,
 * is_new); into pos_slot and the tag out-array. */
static int find_slots(Core *c, PyObject **flows, int64_t n, const int64_t *tag, int64_t kept)
{
    int64_t *slot_out = c->outbuf[3].buf;
    memset(c->is_new, 0, (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        int64_t s;
        if (i < kept) {
            s = tag[i];
            if (s < 0 || s >= c->slot_rows.n || !c->slots[s].used) {
                PyErr_Format(PyExc_RuntimeError, "mfs: flow %lld's tag %lld is no live RMLQ slot of this policy "
                             "(an owner's tags out of step)", (long long)i, (long long)s);
                return -1;
            }
        } else {
            PyObject *so = PyDict_GetItemWithError(c->slot_of, flows[i]);
            if (so)
                s = PyLong_AsLongLong(so);
            else if (PyErr_Occurred() || (s = mfs_admit(c, flows[i], c->capacity)) < 0)
                return -1;
            else
                c->is_new[i] = 1;
        }
        c->pos_slot[i] = slot_out[i] = s;
    }
    return 0;
}

/* Core.decide(snap) -> Decision: see reference.Reference.decide. */
PyObject *mfs_decide(Core *c, PyObject *snap)
{
    PyObject *flows_o = NULL, *fast = NULL, *cap_o = NULL, *rem_o = NULL, *tag_o = NULL, *load_o = NULL;
    PyObject *prog = NULL, *timers = NULL, *result = NULL;
    Buf cap = {0}, rem = {0}, tag = {0}, load = {0};
    double now;
    if (!(flows_o = PyObject_GetAttr(snap, s_flows))
        || !(fast = PySequence_Fast(flows_o, "mfs: Snapshot.flows must be a sequence")))
        goto out;
    int64_t n = PySequence_Fast_GET_SIZE(fast), kept = 0;
    PyObject **flows = PySequence_Fast_ITEMS(fast);
    if (n == 0) { /* nothing to decide: nothing changes */
        result = reserve_out(c, 1) ? NULL : over_out(c, 0, 1, empty_tuple);
        goto out;
    }
    PyObject *now_o = PyObject_GetAttr(snap, s_now);
    int bad_now = !now_o || mfs_as_f64(now_o, &now);
    Py_XDECREF(now_o);
    if (bad_now || !(cap_o = PyObject_GetAttr(snap, s_capacity)) || !(rem_o = PyObject_GetAttr(snap, s_remaining))
        || !(tag_o = PyObject_GetAttr(snap, s_tag)))
        goto out;
    Py_ssize_t links = PyObject_Length(cap_o);
    if (links < 0 || mfs_get_buffer(cap_o, 'd', links, &cap, "Snapshot.capacity")
        || mfs_get_buffer(rem_o, 'd', n, &rem, "Snapshot.remaining"))
        goto out;
    if (rem.view.len / 8 != n) {
        PyErr_Format(PyExc_ValueError, "mfs: Snapshot.remaining has %zd values for %lld flows", rem.view.len / 8,
                     (long long)n);
        goto out;
    }
    if ((links != c->links && fit_links(c, links)) || reserve_flows(c, n) || reserve_out(c, n))
        goto out;
    c->capacity = cap.view.buf;
    int incremental = tag_o != Py_None;
    if (incremental) { /* the first kept flows' slots are their tags; the rest are new */
        PyObject *kept_o = PyObject_GetAttr(snap, s_kept);
        kept = kept_o ? PyLong_AsLongLong(kept_o) : -1;
        Py_XDECREF(kept_o);
        if (kept == -1 && PyErr_Occurred())
            goto out;
        if (kept < 0 || kept > n) {
            PyErr_Format(PyExc_ValueError, "mfs: Snapshot.kept is %lld for %lld flows", (long long)kept, (long long)n);
            goto out;
        }
        if (mfs_get_buffer(tag_o, 'q', kept, &tag, "Snapshot.tag") || !(prog = PyObject_GetAttr(snap, s_progressed)))
            goto out;
    }
    if (find_slots(c, flows, n, tag.view.buf, kept))
        goto out;
    if ((!prog || prog == Py_True) ? read_progress(c, flows, n, NULL)
                                   : (PyObject_IsTrue(prog) > 0 && read_progress(c, flows, n, prog)))
        goto out;
    if (PyErr_Occurred())
        goto out;
    if (c->order_stale) { /* RED order (reads no level; pruning reads the snapshot) */
        c->order_stale = c->red_moved = 0;
        int hold = c->external || c->prunes ? 0 : mfs_ranks_hold(c);
        if (hold < 0)
            goto out;
        if (!hold) {
            PyObject *r = PyObject_CallOneArg(c->reorder, snap);
            if (!r)
                goto out;
            Py_DECREF(r);
        }
    }
    double dt = c->has_last_t && !(now <= c->last_t) ? now - c->last_t : -1.0;
    c->last_t = now;
    c->has_last_t = 1;
    int64_t tick = (int64_t)floor(now / c->period + 1e-9);
    int clip = 0;
    for (int64_t i = 0; i < n && !load.held; i++) { /* is an explicit flow's MLU due? then the link load */
        const Slot *x = &c->slots[c->pos_slot[i]];
        if (!x->explicit_ || !(c->is_new[i] || mfs_eligible(x, tick)))
            continue;
        if (incremental && !(load_o = PyObject_GetAttr(snap, s_link_load_in_use)))
            goto out;
        clip = load_o && load_o != Py_None; /* (the in-use column is unclipped) */
        if (!clip)
            Py_XSETREF(load_o, PyObject_GetAttr(snap, s_link_load));
        if (!load_o || mfs_get_buffer(load_o, 'd', c->links, &load, "the snapshot's link load"))
            goto out;
    }
    if (dt >= 0)
        mfs_measure(c, n, rem.view.buf, dt);
    int64_t nn, nb;
    double timer = mfs_step(c, n, rem.view.buf, load.held ? load.view.buf : NULL, clip, now, tick, c->outbuf[0].buf,
                            c->outbuf[1].buf, c->outbuf[2].buf, &nn, &nb);
    timers = timer != timer ? Py_NewRef(empty_tuple) : Py_BuildValue("(d)", timer);
    if (timers && (!(nn || nb) || !call_notes(c, fast, nn, nb)))
        result = incremental ? out_decision(c, n, timers) : over_out(c, n, 1, timers);
out:
    c->capacity = NULL;
    mfs_put_buffer(&cap);
    mfs_put_buffer(&rem);
    mfs_put_buffer(&tag);
    mfs_put_buffer(&load);
    PyObject *refs[] = {fast, flows_o, cap_o, rem_o, tag_o, load_o, prog, timers};
    for (size_t j = 0; j < sizeof refs / sizeof *refs; j++)
        Py_XDECREF(refs[j]);
    return result;
}

/* ------------------------------------------------------------ the type */

/* Core(levels, period, window, prunes, thresholds, dscp, red, reorder, notes): see MfsPolicy.__init__. */
static int core_init(Core *c, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"levels", "period", "window", "prunes", "thresholds", "dscp", "red", "reorder", "notes",
                             NULL};
    PyObject *thresholds, *red, *reorder, *notes;
    long long levels;
    Py_buffer codes;
    Buf t = {0};
    if (c->slot_of) {
        PyErr_SetString(PyExc_RuntimeError, "mfs: Core is already initialized");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LddpOy*OOO", kwlist, &levels, &c->period, &c->window, &c->prunes,
                                     &thresholds, &codes, &red, &reorder, &notes))
        return -1;
    int bad = mfs_get_buffer(thresholds, 'd', 0, &t, "thresholds");
    if (!bad && (levels < 1 || codes.len != levels + 1)) {
        PyErr_Format(PyExc_ValueError, "mfs: the DSCP map has %zd codes for %lld levels (one per queue and the "
                     "scavenger)", codes.len, levels);
        bad = 1;
    }
    if (!bad) {
        c->n_thresholds = t.view.len / 8;
        c->thresholds = malloc(8 * (size_t)(c->n_thresholds + 1));
        c->dscp = malloc((size_t)levels + 1);
        if (!c->thresholds || !c->dscp)
            bad = !PyErr_NoMemory();
    }
    for (int64_t j = 0; !bad && j < c->n_thresholds; j++) /* ascending: the thresholds reversed */
        c->thresholds[j] = ((const double *)t.view.buf)[c->n_thresholds - 1 - j];
    if (!bad)
        memcpy(c->dscp, codes.buf, (size_t)levels + 1);
    PyBuffer_Release(&codes);
    mfs_put_buffer(&t);
    if (bad)
        return -1;
    c->levels = levels, c->note_levels = 1;
    c->red = Py_NewRef(red), c->reorder = Py_NewRef(reorder), c->notes = Py_NewRef(notes);
    c->live_head = c->live_tail = -1;
    if (!(c->slot_of = PyDict_New()) || !(c->batch_index = PyDict_New()) || !(c->request_index = PyDict_New())
        || !(c->forget_pending = PySet_New(NULL)) || !(c->views = PyDict_New()) || fit_links(c, 0))
        return -1;
    return 0;
}

#define OBJECTS(X) X(red) X(reorder) X(notes) X(slot_of) X(batch_index) X(request_index) X(forget_pending) X(views)

static int core_traverse(Core *c, visitproc visit, void *arg)
{
#define VISIT(f) Py_VISIT(c->f);
    OBJECTS(VISIT)
#undef VISIT
    for (int j = 0; j < 4; j++)
        Py_VISIT(c->out[j]);
    return 0;
}

static int core_clear(Core *c)
{
    release_out(c);
#define CLEAR(f) Py_CLEAR(c->f);
    OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void core_dealloc(Core *c)
{
    PyObject_GC_UnTrack(c);
    core_clear(c);
    for (int64_t b = 0; b < c->batch_rows.n; b++) {
        Py_XDECREF(c->batches[b].name);
        free(c->batches[b].members);
        free(c->batches[b].home);
    }
    for (int64_t r = 0; r < c->request_rows.n; r++)
        Py_XDECREF(c->requests[r].name);
    void *blocks[] = {c->thresholds, c->dscp, c->slots, c->slot_rows.free, c->batches, c->batch_rows.free,
                      c->touched, c->requests, c->request_rows.free, c->load, c->keys};
    for (size_t j = 0; j < sizeof blocks / sizeof *blocks; j++)
        free(blocks[j]);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyMemberDef core_members[] = {
    {"note_levels", T_BOOL, offsetof(Core, note_levels), 0, "Whether decide notes RMLQ levels (a bool)."},
    {NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "laxflow.policy.mfs._core.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One mfs policy's state and decision step (see core.h and reference.Reference).",
    .tp_traverse = (traverseproc)core_traverse,
    .tp_clear = (inquiry)core_clear,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)core_init,
    .tp_methods = mfs_methods,
    .tp_members = core_members,
};

static struct PyModuleDef core_module = {PyModuleDef_HEAD_INIT, .m_name = "laxflow.policy.mfs._core",
                                         .m_doc = "The mfs policy's state and decision step in C.", .m_size = -1};

/* module.name, a new reference */
static PyObject *import_attr(const char *module, const char *name)
{
    PyObject *m = PyImport_ImportModule(module), *v = m ? PyObject_GetAttrString(m, name) : NULL;
    Py_XDECREF(m);
    return v;
}

PyMODINIT_FUNC PyInit__core(void)
{
#define NAME(var, text) if (!(var = PyUnicode_InternFromString(text))) return NULL
    NAME(s_flows, "flows"); NAME(s_now, "now"); NAME(s_capacity, "capacity"); NAME(s_remaining, "remaining");
    NAME(s_tag, "tag"); NAME(s_kept, "kept"); NAME(s_progressed, "progressed"); NAME(s_link_load, "link_load");
    NAME(s_link_load_in_use, "link_load_in_use"); NAME(s_batch, "batch"); NAME(s_request, "request");
    NAME(s_deadline, "deadline"); NAME(s_size, "size"); NAME(s_links, "links"); NAME(s_weights, "weights");
    NAME(s_stage, "stage"); NAME(s_layer, "layer"); NAME(s_current_layer, "current_layer");
    NAME(s_compute_done, "compute_done"); NAME(s_due, "due"); NAME(s_explicit, "has_explicit_deadline");
    NAME(s_id, "id"); NAME(s_timers, "timers");
#undef NAME
    if (!(np_empty = import_attr("numpy", "empty")) || !(np_contiguous = import_attr("numpy", "ascontiguousarray"))
        || !(dt_f64 = import_attr("numpy", "float64")) || !(dt_i64 = import_attr("numpy", "int64"))
        || !(dt_u8 = import_attr("numpy", "uint8")) || !(decision_type = import_attr("laxflow.policy.base", "Decision"))
        || !(stage_codes = import_attr("laxflow.stage", "STAGE_CODES")) || !(empty_tuple = PyTuple_New(0))
        || PyType_Ready(&CoreType) < 0)
        return NULL;
    PyObject *mod = PyModule_Create(&core_module);
    if (mod && PyModule_AddObjectRef(mod, "Core", (PyObject *)&CoreType) < 0)
        Py_CLEAR(mod);
    return mod;
}
