/* The mfs core's Python type (see core.h): Core(config, thresholds, red, reorder, notes, decision),
 * its decide, its methods, the module laxflow.policy.mfs._core. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

PyObject *np_empty, *np_contiguous, *dt_f64, *dt_i64, *dt_u8, *flow_type, *stage_codes, *p2d, *empty_tuple;
PyObject *s_flows, *s_now, *s_capacity, *s_remaining, *s_tag, *s_kept, *s_progressed, *s_link_load,
    *s_link_load_in_use, *s_batch, *s_request, *s_deadline, *s_downstream, *s_size, *s_links, *s_weights,
    *s_stage, *s_layer, *s_current_layer, *s_compute_done, *s_due, *s_explicit, *s_id, *s_timers;

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
 * converted by numpy.ascontiguousarray when obj is not one (*tmp holds the copy). */
int mfs_get_buffer(PyObject *obj, char kind, Py_ssize_t count, Py_buffer *b, PyObject **tmp, const char *what)
{
    *tmp = NULL;
    if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
        const char *f = b->format ? b->format : "B";
        if (f[0] == '<' || f[0] == '=' || f[0] == '@')
            f++;
        int match = b->itemsize == 8 && !f[1] && (kind == 'd' ? f[0] == 'd' : (f[0] == 'q' || f[0] == 'l'));
        if (match && b->ndim <= 1)
            goto sized;
        PyBuffer_Release(b);
    } else
        PyErr_Clear();
    *tmp = PyObject_CallFunctionObjArgs(np_contiguous, obj, kind == 'd' ? dt_f64 : dt_i64, NULL);
    if (!*tmp || PyObject_GetBuffer(*tmp, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)) {
        Py_CLEAR(*tmp);
        return -1;
    }
sized:
    if (b->len / 8 < count) {
        PyErr_Format(PyExc_ValueError, "mfs: %s has %zd values, %zd needed", what, b->len / 8, count);
        PyBuffer_Release(b);
        Py_CLEAR(*tmp);
        return -1;
    }
    return 0;
}

void mfs_put_buffer(Py_buffer *b, PyObject *tmp)
{
    PyBuffer_Release(b);
    Py_XDECREF(tmp);
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

/* numpy.empty(n, dtype) with its buffer. */
static PyObject *new_array(int64_t n, PyObject *dtype, Py_buffer *b)
{
    PyObject *a = PyObject_CallFunction(np_empty, "LO", (long long)n, dtype);
    if (a && PyObject_GetBuffer(a, b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)) {
        Py_CLEAR(a);
    }
    return a;
}

/* The incremental decision's out-arrays with room for n flows. */
static int reserve_out(Core *c, int64_t n)
{
    if (n <= c->out_room)
        return 0;
    int64_t room = n > 2 * c->out_room ? n : 2 * c->out_room;
    PyObject *dtypes[4] = {dt_i64, dt_i64, dt_u8, dt_i64};
    for (int j = 0; j < 4; j++) {
        if (c->out[j]) {
            PyBuffer_Release(&c->outbuf[j]);
            Py_CLEAR(c->out[j]);
        }
    }
    c->out_room = 0;
    for (int j = 0; j < 4; j++)
        if (!(c->out[j] = new_array(room, dtypes[j], &c->outbuf[j]))) {
            for (int i = 0; i < j; i++) {
                PyBuffer_Release(&c->outbuf[i]);
                Py_CLEAR(c->out[i]);
            }
            return -1;
        }
    c->out_room = room;
    PyDict_Clear(c->views);
    return 0;
}

static PyObject *make_decision(Core *c, PyObject *level, PyObject *queue, PyObject *dscp, PyObject *timers,
                               PyObject *tag)
{
    PyObject *kw = Py_BuildValue("{sOsOsOsOsO}", "level", level, "queue", queue, "dscp", dscp, "timers", timers,
                                 "tag", tag);
    if (!kw)
        return NULL;
    PyObject *d = PyObject_Call(c->decision, empty_tuple, kw);
    Py_DECREF(kw);
    return d;
}

/* The Decision over the out-arrays' first n (one per n, handed out again), its timers set. */
static PyObject *out_decision(Core *c, int64_t n, PyObject *timers)
{
    PyObject *key = PyLong_FromLongLong(n), *d;
    if (!key)
        return NULL;
    d = PyDict_GetItemWithError(c->views, key);
    if (d)
        Py_INCREF(d);
    else if (!PyErr_Occurred()) {
        PyObject *v[4] = {NULL, NULL, NULL, NULL};
        int j = 0;
        for (; j < 4; j++)
            if (!(v[j] = PySequence_GetSlice(c->out[j], 0, n)))
                break;
        if (j == 4 && (d = make_decision(c, v[0], v[1], v[2], empty_tuple, v[3]))) {
            if (PyDict_GET_SIZE(c->views) >= 4096)
                PyDict_Clear(c->views);
            if (PyDict_SetItem(c->views, key, d))
                Py_CLEAR(d);
        }
        for (j = 0; j < 4; j++)
            Py_XDECREF(v[j]);
    }
    Py_DECREF(key);
    if (d && PyObject_SetAttr(d, s_timers, timers))
        Py_CLEAR(d);
    return d;
}

/* Core.decide(snap) -> Decision: see reference.Reference.decide. */
static PyObject *mfs_decide(Core *c, PyObject *snap)
{
    PyObject *flows_o = NULL, *cap_o = NULL, *rem_o = NULL, *tag_o = NULL, *load_o = NULL, *prog = NULL;
    PyObject *cap_t = NULL, *rem_t = NULL, *tag_t = NULL, *load_t = NULL, *result = NULL, *fast = NULL;
    Py_buffer cap_b, rem_b, tag_b, load_b;
    int have_cap = 0, have_rem = 0, have_tag = 0, have_load = 0;
    double now;
    if (!(flows_o = PyObject_GetAttr(snap, s_flows))
        || !(fast = PySequence_Fast(flows_o, "mfs: Snapshot.flows must be a sequence")))
        goto out;
    int64_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **flows = PySequence_Fast_ITEMS(fast);
    if (n == 0) { /* nothing to decide: nothing changes */
        PyObject *a[3] = {PyObject_CallFunction(np_empty, "iO", 0, dt_i64),
                          PyObject_CallFunction(np_empty, "iO", 0, dt_i64),
                          PyObject_CallFunction(np_empty, "iO", 0, dt_u8)};
        if (a[0] && a[1] && a[2])
            result = make_decision(c, a[0], a[1], a[2], empty_tuple, Py_None);
        Py_XDECREF(a[0]), Py_XDECREF(a[1]), Py_XDECREF(a[2]);
        goto out;
    }
    PyObject *now_o = PyObject_GetAttr(snap, s_now);
    int bad_now = !now_o || mfs_as_f64(now_o, &now);
    Py_XDECREF(now_o);
    if (bad_now || !(cap_o = PyObject_GetAttr(snap, s_capacity)) || !(rem_o = PyObject_GetAttr(snap, s_remaining))
        || !(tag_o = PyObject_GetAttr(snap, s_tag)))
        goto out;
    Py_ssize_t links = PyObject_Length(cap_o);
    if (links < 0 || mfs_get_buffer(cap_o, 'd', links, &cap_b, &cap_t, "Snapshot.capacity"))
        goto out;
    have_cap = 1;
    if (mfs_get_buffer(rem_o, 'd', n, &rem_b, &rem_t, "Snapshot.remaining"))
        goto out;
    have_rem = 1;
    if (rem_b.len / 8 != n) {
        PyErr_Format(PyExc_ValueError, "mfs: Snapshot.remaining has %zd values for %lld flows", rem_b.len / 8,
                     (long long)n);
        goto out;
    }
    if (links != c->links && fit_links(c, links))
        goto out;
    c->capacity = cap_b.buf;
    int incremental = tag_o != Py_None;
    int64_t kept = 0;
    if (reserve_flows(c, n) || (incremental && reserve_out(c, n)))
        goto out;
    memset(c->is_new, 0, (size_t)n);
    int64_t *tag_out = incremental ? c->outbuf[3].buf : NULL;
    if (incremental) { /* the kept flows' slots are their tags; the rest are new */
        PyObject *kept_o = PyObject_GetAttr(snap, s_kept);
        kept = kept_o ? PyLong_AsLongLong(kept_o) : -1;
        Py_XDECREF(kept_o);
        if (kept == -1 && PyErr_Occurred())
            goto out;
        if (kept < 0 || kept > n) {
            PyErr_Format(PyExc_ValueError, "mfs: Snapshot.kept is %lld for %lld flows", (long long)kept, (long long)n);
            goto out;
        }
        if (mfs_get_buffer(tag_o, 'q', kept, &tag_b, &tag_t, "Snapshot.tag"))
            goto out;
        have_tag = 1;
        const int64_t *tag = tag_b.buf;
        for (int64_t i = 0; i < kept; i++) {
            if (tag[i] < 0 || tag[i] >= c->slot_rows.n || !c->slots[tag[i]].used) {
                PyErr_Format(PyExc_RuntimeError, "mfs: flow %lld's tag %lld is no live RMLQ slot of this policy "
                             "(an owner's tags out of step)", (long long)i, (long long)tag[i]);
                goto out;
            }
            c->pos_slot[i] = tag_out[i] = tag[i];
        }
        for (int64_t i = kept; i < n; i++) {
            if ((c->pos_slot[i] = tag_out[i] = mfs_admit(c, flows[i], c->capacity)) < 0)
                goto out;
            c->is_new[i] = 1;
        }
        if (!(prog = PyObject_GetAttr(snap, s_progressed)))
            goto out;
        int every = prog == Py_True;
        if (every ? read_progress(c, flows, n, NULL) : (PyObject_IsTrue(prog) > 0 && read_progress(c, flows, n, prog)))
            goto out;
        if (PyErr_Occurred())
            goto out;
    } else {
        for (int64_t i = 0; i < n; i++) {
            PyObject *so = PyDict_GetItemWithError(c->slot_of, flows[i]);
            if (so)
                c->pos_slot[i] = PyLong_AsLongLong(so);
            else if (PyErr_Occurred() || (c->pos_slot[i] = mfs_admit(c, flows[i], c->capacity)) < 0)
                goto out;
            else
                c->is_new[i] = 1;
        }
        if (read_progress(c, flows, n, NULL))
            goto out;
    }
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
    const double *load = NULL;
    for (int64_t i = 0; i < n && !load; i++) { /* is an explicit flow's MLU due? then the link load */
        const Slot *x = &c->slots[c->pos_slot[i]];
        if (x->explicit_ && (c->is_new[i] || mfs_eligible(x, tick))) {
            if (incremental) {
                load_o = PyObject_GetAttr(snap, s_link_load_in_use);
                if (load_o == Py_None)
                    Py_CLEAR(load_o);
            }
            if (!load_o && !(load_o = PyObject_GetAttr(snap, s_link_load)))
                goto out;
            if (mfs_get_buffer(load_o, 'd', c->links, &load_b, &load_t, "the snapshot's link load"))
                goto out;
            have_load = 1;
            load = load_b.buf;
        }
    }
    if (dt >= 0)
        mfs_measure(c, n, rem_b.buf, dt);
    PyObject *arrays[3] = {NULL, NULL, NULL};
    Py_buffer bufs[3];
    int64_t *level, *queue;
    uint8_t *dscp;
    if (incremental) {
        level = c->outbuf[0].buf, queue = c->outbuf[1].buf, dscp = c->outbuf[2].buf;
    } else {
        PyObject *dtypes[3] = {dt_i64, dt_i64, dt_u8};
        for (int j = 0; j < 3; j++)
            if (!(arrays[j] = new_array(n, dtypes[j], &bufs[j]))) {
                for (int i = 0; i < j; i++) {
                    PyBuffer_Release(&bufs[i]);
                    Py_DECREF(arrays[i]);
                }
                goto out;
            }
        level = bufs[0].buf, queue = bufs[1].buf, dscp = bufs[2].buf;
    }
    int64_t nn, nb;
    double timer = mfs_step(c, n, rem_b.buf, load, 1 - !incremental, now, tick, level, queue, dscp, &nn, &nb);
    if (!incremental)
        for (int j = 0; j < 3; j++)
            PyBuffer_Release(&bufs[j]);
    PyObject *timers = timer != timer ? Py_NewRef(empty_tuple) : Py_BuildValue("(d)", timer);
    if (timers && (nn || nb)) { /* the notes on the flows */
        PyObject *noted = PyList_New(2 * nn), *bad = PyList_New(nb), *r = NULL;
        for (int64_t j = 0; noted && j < 2 * nn; j++)
            PyList_SET_ITEM(noted, j, PyLong_FromLongLong(c->noted[j]));
        for (int64_t j = 0; bad && j < nb; j++)
            PyList_SET_ITEM(bad, j, PyLong_FromLongLong(c->bad[j]));
        if (noted && bad)
            r = PyObject_CallFunctionObjArgs(c->notes, fast, noted, bad, NULL);
        Py_XDECREF(noted);
        Py_XDECREF(bad);
        if (!r)
            Py_CLEAR(timers);
        Py_XDECREF(r);
    }
    if (timers)
        result = incremental ? out_decision(c, n, timers)
                             : make_decision(c, arrays[0], arrays[1], arrays[2], timers, Py_None);
    Py_XDECREF(timers);
    for (int j = 0; j < 3; j++)
        Py_XDECREF(arrays[j]);
out:
    c->capacity = NULL;
    if (have_cap)
        mfs_put_buffer(&cap_b, cap_t);
    if (have_rem)
        mfs_put_buffer(&rem_b, rem_t);
    if (have_tag)
        mfs_put_buffer(&tag_b, tag_t);
    if (have_load)
        mfs_put_buffer(&load_b, load_t);
    Py_XDECREF(fast);
    Py_XDECREF(flows_o);
    Py_XDECREF(cap_o);
    Py_XDECREF(rem_o);
    Py_XDECREF(tag_o);
    Py_XDECREF(load_o);
    Py_XDECREF(prog);
    return result;
}

/* ------------------------------------------------------------ the type */

/* Core(config, thresholds, red, reorder, notes, decision) */
static int core_init(Core *c, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"config", "thresholds", "red", "reorder", "notes", "decision", NULL};
    PyObject *config, *thresholds, *red, *reorder, *notes, *decision, *v = NULL, *t = NULL, *codes = NULL;
    Py_buffer tb, cb;
    if (c->slot_of) {
        PyErr_SetString(PyExc_RuntimeError, "mfs: Core is already initialized");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOO", kwlist, &config, &thresholds, &red, &reorder, &notes,
                                     &decision))
        return -1;
    long long levels, budget;
    double period, window;
    if (!(v = PyObject_GetAttrString(config, "levels")) || (levels = PyLong_AsLongLong(v)) == -1) goto fail;
    Py_SETREF(v, PyObject_GetAttrString(config, "drop_budget"));
    if (!v || ((budget = PyLong_AsLongLong(v)) == -1 && PyErr_Occurred())) goto fail;
    Py_SETREF(v, PyObject_GetAttrString(config, "period"));
    if (!v || mfs_as_f64(v, &period)) goto fail;
    Py_SETREF(v, PyObject_GetAttrString(config, "load_window"));
    if (!v || mfs_as_f64(v, &window)) goto fail;
    Py_SETREF(v, PyObject_GetAttrString(config, "dscp_map"));
    if (!v || !(codes = PyObject_GetAttrString(v, "codes"))) goto fail;
    if (mfs_get_buffer(thresholds, 'd', 0, &tb, &t, "thresholds")) goto fail;
    if (PyObject_GetBuffer(codes, &cb, PyBUF_C_CONTIGUOUS) || cb.len != levels + 1 || cb.itemsize != 1) {
        if (!PyErr_Occurred()) {
            PyBuffer_Release(&cb);
            PyErr_Format(PyExc_ValueError, "mfs: the DSCP map needs %lld uint8 codes", levels + 1);
        }
        mfs_put_buffer(&tb, t);
        goto fail;
    }
    c->n_thresholds = tb.len / 8;
    c->thresholds = malloc(8 * (size_t)(c->n_thresholds + 1));
    c->dscp = malloc((size_t)levels + 1);
    if (c->thresholds && c->dscp) {
        for (int64_t j = 0; j < c->n_thresholds; j++) /* ascending: the thresholds reversed */
            c->thresholds[j] = ((const double *)tb.buf)[c->n_thresholds - 1 - j];
        memcpy(c->dscp, cb.buf, (size_t)levels + 1);
    }
    PyBuffer_Release(&cb);
    mfs_put_buffer(&tb, t);
    if (!c->thresholds || !c->dscp) {
        PyErr_NoMemory();
        goto fail;
    }
    c->levels = levels, c->period = period, c->window = window, c->prunes = budget > 0, c->note_levels = 1;
    c->red = Py_NewRef(red), c->reorder = Py_NewRef(reorder), c->notes = Py_NewRef(notes);
    c->decision = Py_NewRef(decision);
    c->live_head = c->live_tail = -1;
    if (!(c->slot_of = PyDict_New()) || !(c->batch_index = PyDict_New()) || !(c->request_index = PyDict_New())
        || !(c->forget_pending = PySet_New(NULL)) || !(c->views = PyDict_New()) || fit_links(c, 0))
        goto fail;
    Py_XDECREF(v);
    Py_XDECREF(codes);
    return 0;
fail:
    Py_XDECREF(v);
    Py_XDECREF(codes);
    return -1;
}

#define OBJECTS(X) X(red) X(reorder) X(notes) X(decision) X(slot_of) X(batch_index) X(request_index) \
    X(forget_pending) X(views) X(out[0]) X(out[1]) X(out[2]) X(out[3])

static int core_traverse(Core *c, visitproc visit, void *arg)
{
#define VISIT(f) Py_VISIT(c->f);
    OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int core_clear(Core *c)
{
    for (int j = 0; j < 4; j++)
        if (c->out[j])
            PyBuffer_Release(&c->outbuf[j]);
    c->out_room = 0;
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

static PyObject *get_note_levels(Core *c, void *unused) { return PyBool_FromLong(c->note_levels); }

static int set_note_levels(Core *c, PyObject *v, void *unused)
{
    int t = v ? PyObject_IsTrue(v) : -1;
    if (t < 0) {
        if (!v)
            PyErr_SetString(PyExc_AttributeError, "mfs: note_levels cannot be deleted");
        return -1;
    }
    c->note_levels = t;
    return 0;
}

static PyGetSetDef core_getset[] = {
    {"note_levels", (getter)get_note_levels, (setter)set_note_levels, "Whether decide notes RMLQ levels.", NULL},
    {NULL},
};

#define METHOD(name, flags, doc) {#name, (PyCFunction)mfs_##name, flags, doc}
static PyMethodDef core_methods[] = {
    METHOD(decide, METH_O, "decide(snap) -> Decision"),
    METHOD(complete, METH_O, "complete(flow): the flow's last byte was delivered"),
    METHOD(forget, METH_O, "forget(batches) -> the batch names freed now"),
    METHOD(set_pruned, METH_O, "set_pruned(names): the coordinator's pruned requests"),
    METHOD(prune, METH_O, "prune(names): Algorithm 1 pruned these requests"),
    METHOD(pruned_names, METH_NOARGS, "pruned_names() -> set of request names"),
    METHOD(live_batches, METH_NOARGS, "live_batches() -> [(RED, name, index)] in the order they became live"),
    METHOD(gone_batches, METH_NOARGS, "gone_batches() -> [(ranked RED, name, index)] ranked, not live"),
    METHOD(deadlines, METH_O, "deadlines(b) -> live batch b's live deadlines"),
    METHOD(batch_index, METH_O, "batch_index(name) -> index or None"),
    METHOD(set_ranks, METH_VARARGS, "set_ranks(ranked, ranked_red) -> whether a live batch's rank changed"),
    METHOD(owners, METH_O, "owners(flows) -> [(batch, request, name, deadline, pruned) or None]"),
    METHOD(queue_level, METH_O, "queue_level(flow) -> RMLQ level with pruning"),
    METHOD(rmlq_level, METH_O, "rmlq_level(flow) -> RMLQ level as promotion left it"),
    METHOD(sizes, METH_NOARGS, "sizes() -> table sizes"),
    {NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "laxflow.policy.mfs._core.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One mfs policy's state and decision mfs_step(see core.c and reference.Reference).",
    .tp_traverse = (traverseproc)core_traverse,
    .tp_clear = (inquiry)core_clear,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)core_init,
    .tp_methods = core_methods,
    .tp_getset = core_getset,
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
    NAME(s_deadline, "deadline"); NAME(s_downstream, "downstream"); NAME(s_size, "size"); NAME(s_links, "links");
    NAME(s_weights, "weights"); NAME(s_stage, "stage"); NAME(s_layer, "layer");
    NAME(s_current_layer, "current_layer"); NAME(s_compute_done, "compute_done"); NAME(s_due, "due");
    NAME(s_explicit, "has_explicit_deadline"); NAME(s_id, "id"); NAME(s_timers, "timers");
#undef NAME
    PyObject *stage = import_attr("laxflow.stage", "Stage");
    if (!stage || !(p2d = PyObject_GetAttrString(stage, "P2D")) || !(np_empty = import_attr("numpy", "empty"))
        || !(np_contiguous = import_attr("numpy", "ascontiguousarray")) || !(dt_f64 = import_attr("numpy", "float64"))
        || !(dt_i64 = import_attr("numpy", "int64")) || !(dt_u8 = import_attr("numpy", "uint8"))
        || !(flow_type = import_attr("laxflow.policy.flow", "Flow"))
        || !(stage_codes = import_attr("laxflow.stage", "STAGE_CODES")) || !(empty_tuple = PyTuple_New(0))
        || PyType_Ready(&CoreType) < 0) {
        Py_XDECREF(stage);
        return NULL;
    }
    Py_DECREF(stage);
    PyObject *mod = PyModule_Create(&core_module);
    if (mod && PyModule_AddObjectRef(mod, "Core", (PyObject *)&CoreType) < 0)
        Py_CLEAR(mod);
    return mod;
}
