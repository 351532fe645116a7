/* The mfs core's tables (see core.h): RMLQ slots, batches and requests, their rows handed out
 * again once freed; admission and completion of flows; the RED memo; the order's and the
 * coordinator's tables; forget. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

/* ------------------------------------------------------------ memory */

/* *p with room for need elements of size elem (doubling); 0 or -1 with MemoryError. */
int mfs_reserve(void **p, int64_t *room, int64_t need, size_t elem)
{
    if (need <= *room)
        return 0;
    int64_t n = *room ? *room : 16;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q) {
        PyErr_NoMemory();
        return -1;
    }
    *p = q;
    *room = n;
    return 0;
}

/* A row of table t (rows of `size` bytes at *rows): the last freed one, else a new one at the end (the
 * arrays grown by doubling, the free list first: it has room for every row); -1: MemoryError. */
static int64_t take_row(Rows *t, void **rows, size_t size)
{
    if (t->n_free)
        return t->free[--t->n_free];
    int64_t room_free = t->room;
    if (mfs_reserve((void **)&t->free, &room_free, t->n + 1, 8) || mfs_reserve(rows, &t->room, t->n + 1, size))
        return -1;
    return t->n++;
}

/* dict[key] = i */
static int set_index(PyObject *dict, PyObject *key, int64_t i)
{
    PyObject *v = PyLong_FromLongLong(i);
    int bad = !v || PyDict_SetItem(dict, key, v);
    Py_XDECREF(v);
    return bad ? -1 : 0;
}

/* ------------------------------------------------------------ batches and requests */

static int touch(Core *c, int64_t b)
{
    if (!c->batches[b].touched) {
        if (mfs_reserve((void **)&c->touched, &c->room_touched, c->n_touched + 1, 8))
            return -1;
        c->batches[b].touched = 1;
        c->touched[c->n_touched++] = b;
    }
    return 0;
}

/* The batch named `name` (entered, unranked, when new). */
static int64_t enter_batch(Core *c, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(c->batch_index, name);
    if (v)
        return PyLong_AsLongLong(v);
    if (PyErr_Occurred())
        return -1;
    int64_t fresh = c->batch_rows.n, b = take_row(&c->batch_rows, (void **)&c->batches, sizeof(Batch));
    if (b < 0)
        return -1;
    if (b == fresh)
        memset(&c->batches[b], 0, sizeof(Batch)); /* (a new row: no arrays yet; a freed one keeps its own) */
    if (set_index(c->batch_index, name, b)) {
        c->batch_rows.free[c->batch_rows.n_free++] = b;
        return -1;
    }
    Batch *e = &c->batches[b];
    e->name = Py_NewRef(name);
    e->rank = UNRANKED;
    e->flows = e->n_members = e->n_home = 0;
    e->live = e->red_valid = e->ranked = e->touched = 0;
    c->order_stale = 1;
    return b;
}

static int add_home(Core *c, int64_t b, int64_t r)
{
    Batch *e = &c->batches[b];
    if (mfs_reserve((void **)&e->home, &e->room_home, e->n_home + 1, 8))
        return -1;
    e->home[e->n_home++] = r;
    return 0;
}

/* The request named `name`: a new entry (deadline, home batch b; -1: none), or the known one (its
 * deadline and home set if only the coordinator had named it so far). */
static int64_t enter_request(Core *c, PyObject *name, double deadline, int64_t b)
{
    PyObject *v = PyDict_GetItemWithError(c->request_index, name);
    if (v) {
        int64_t r = PyLong_AsLongLong(v);
        if (b >= 0 && c->requests[r].batch < 0) { /* first named by set_pruned */
            c->requests[r].deadline = deadline;
            c->requests[r].batch = b;
            if (add_home(c, b, r))
                return -1;
        }
        return r;
    }
    if (PyErr_Occurred())
        return -1;
    int64_t r = take_row(&c->request_rows, (void **)&c->requests, sizeof(Request));
    if (r < 0)
        return -1;
    if (set_index(c->request_index, name, r)) {
        c->request_rows.free[c->request_rows.n_free++] = r;
        return -1;
    }
    c->requests[r] = (Request){Py_NewRef(name), deadline, b, 0};
    c->order_stale = 1;
    return b >= 0 ? (add_home(c, b, r) ? -1 : r) : r;
}

/* A new flow of request r joins batch b. */
static int join(Core *c, int64_t b, int64_t r)
{
    Batch *e = &c->batches[b];
    if (!e->live) { /* the batch is live (again): its rank is the order's to give */
        e->live = 1;
        e->prev = c->live_tail;
        e->next = -1;
        if (c->live_tail >= 0)
            c->batches[c->live_tail].next = b;
        else
            c->live_head = b;
        c->live_tail = b;
        c->n_live++;
        c->order_stale = 1;
        if (touch(c, b))
            return -1;
    }
    e->flows++;
    for (int64_t j = 0; j < e->n_members; j++)
        if (e->members[j].r == r) {
            e->members[j].count++;
            return 0;
        }
    if (mfs_reserve((void **)&e->members, &e->room_members, e->n_members + 1, sizeof(Member)))
        return -1;
    e->members[e->n_members++] = (Member){r, 1};
    e->red_valid = 0; /* its live deadlines changed */
    c->red_moved = 1;
    return touch(c, b);
}

/* RED of live batch b by its live deadlines, memoized until they change. */
static int red_of(Core *c, int64_t b, double *red)
{
    Batch *e = &c->batches[b];
    if (!e->red_valid) {
        PyObject *d = PyTuple_New(e->n_members);
        if (!d)
            return -1;
        Py_ssize_t k = 0;
        for (int64_t j = 0; j < e->n_members; j++) {
            double x = c->requests[e->members[j].r].deadline;
            if (x == x) {
                PyObject *f = PyFloat_FromDouble(x);
                if (!f) {
                    Py_DECREF(d);
                    return -1;
                }
                PyTuple_SET_ITEM(d, k++, f);
            }
        }
        if (k < e->n_members && _PyTuple_Resize(&d, k))
            return -1;
        PyObject *v = PyObject_CallOneArg(c->red, d);
        Py_DECREF(d);
        if (!v)
            return -1;
        int bad = mfs_as_f64(v, &e->red);
        Py_DECREF(v);
        if (bad)
            return -1;
        e->red_valid = 1;
    }
    *red = e->red;
    return 0;
}

/* Whether the ranks the last full reorder gave still order the live batches as a new one would: every
 * batch touched since (became live, or its live requests changed) is gone again or has the RED it was
 * ranked by.  1 (the touched set cleared), 0, -1 error. */
int mfs_ranks_hold(Core *c)
{
    for (int64_t j = 0; j < c->n_touched; j++) {
        int64_t b = c->touched[j];
        Batch *e = &c->batches[b];
        if (!e->live)
            continue;
        double red;
        if (red_of(c, b, &red))
            return -1;
        if (!e->ranked || !(e->ranked_red == red))
            return 0;
    }
    for (int64_t j = 0; j < c->n_touched; j++)
        c->batches[c->touched[j]].touched = 0;
    c->n_touched = 0;
    return 1;
}

/* ------------------------------------------------------------ admission */

/* The first link of the path attaining the min of capacity / weight (a zero weight: inf, or NaN at zero
 * capacity), that min and the flow's weight there. */
static int bottleneck(Core *c, PyObject *f, const double *capacity, int64_t *link, double *rate, double *weight)
{
    PyObject *lo = PyObject_GetAttr(f, s_links), *wo = lo ? PyObject_GetAttr(f, s_weights) : NULL;
    Buf lb = {0}, wb = {0};
    int rc = -1;
    if (!wo || mfs_get_buffer(lo, 'q', 1, &lb, "a flow's links")
        || mfs_get_buffer(wo, 'd', lb.view.len / 8, &wb, "a flow's weights"))
        goto out;
    const int64_t *l = lb.view.buf;
    const double *w = wb.view.buf;
    int64_t best = -1;
    double best_r = 0.0;
    for (Py_ssize_t k = 0; k < lb.view.len / 8; k++) {
        if (l[k] < 0 || l[k] >= c->links) {
            PyObject *id = PyObject_GetAttr(f, s_id);
            PyErr_Format(PyExc_ValueError, "mfs: flow %R uses link %lld, but the network has %lld links", id,
                         (long long)l[k], (long long)c->links);
            Py_XDECREF(id);
            goto out;
        }
        double cap = capacity[l[k]];
        double r = w[k] == 0.0 ? (cap != 0.0 ? copysign(INFINITY, cap) : NAN) : cap / w[k];
        if (best < 0 || r < best_r) {
            best = k;
            best_r = r;
        }
    }
    *link = l[best];
    *rate = best_r;
    *weight = w[best];
    rc = 0;
out:
    mfs_put_buffer(&lb);
    mfs_put_buffer(&wb);
    Py_XDECREF(lo);
    Py_XDECREF(wo);
    return rc;
}

/* A new flow into the RMLQ: a slot, its static facts, its request progress, its batch and request
 * entered.  Its slot, or -1 (nothing changed). */
int64_t mfs_admit(Core *c, PyObject *f, const double *capacity)
{
    Slot x = {0};
    PyObject *stage = NULL, *code, *bname = NULL, *rname = NULL;
    double deadline;
    int64_t s = -1;
    if (bottleneck(c, f, capacity, &x.link, &x.rate, &x.weight) || mfs_attr_f64(f, s_size, &x.last_rem)
        || mfs_attr_f64(f, s_layer, &x.target) || mfs_attr_f64(f, s_current_layer, &x.seen_layer)
        || mfs_attr_f64(f, s_deadline, &deadline) || !(stage = PyObject_GetAttr(f, s_stage)))
        goto out;
    if (!(code = PyDict_GetItemWithError(stage_codes, stage))) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "mfs: a flow's stage %R has no stage code", stage);
        goto out;
    }
    x.stage = (int8_t)PyLong_AsLong(code);
    int done = mfs_attr_true(f, s_compute_done), explicit_ = done < 0 ? -1 : mfs_attr_true(f, s_explicit);
    if (explicit_ < 0 || mfs_attr_f64(f, s_due, &x.due)) /* (as the flow defines them: a subclass may) */
        goto out;
    x.seen_done = (uint8_t)done;
    x.explicit_ = (uint8_t)explicit_;
    if (!(bname = PyObject_GetAttr(f, s_batch)) || !(rname = PyObject_GetAttr(f, s_request)))
        goto out;
    if ((s = take_row(&c->slot_rows, (void **)&c->slots, sizeof(Slot))) < 0)
        goto out;
    if (set_index(c->slot_of, f, s)) {
        c->slot_rows.free[c->slot_rows.n_free++] = s;
        s = -1;
        goto out;
    }
    x.batch = enter_batch(c, bname);
    x.request = x.batch < 0 ? -1 : enter_request(c, rname, deadline, x.batch);
    if (x.request < 0 || join(c, x.batch, x.request)) { /* (no memory, or a name that does not hash) */
        PyDict_DelItem(c->slot_of, f);
        c->slot_rows.free[c->slot_rows.n_free++] = s;
        s = -1;
        goto out;
    }
    x.used = 1;
    c->slots[s] = x;
out:
    Py_XDECREF(stage);
    Py_XDECREF(bname);
    Py_XDECREF(rname);
    return s;
}

/* ------------------------------------------------------------ completion and the tables */

/* Core.complete(flow): its slot free; an explicit flow's last bytes counted on its bottleneck link for
 * the next measurement; the flow leaves its batch's live tables; a batch whose last flow this was
 * departs, and the order is stale unless only the departed batch's gap in the ranks would close. */
static PyObject *mfs_complete(Core *c, PyObject *flow)
{
    PyObject *so = PyDict_GetItemWithError(c->slot_of, flow);
    if (!so) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    int64_t s = PyLong_AsLongLong(so);
    if (PyDict_DelItem(c->slot_of, flow))
        return NULL;
    Slot *x = &c->slots[s];
    x->used = 0;
    c->slot_rows.free[c->slot_rows.n_free++] = s;
    if (x->explicit_ && c->links > 0) {
        c->finished[x->link] += x->last_rem * x->weight;
        if (!c->is_finished[x->link]) {
            c->is_finished[x->link] = 1;
            c->finished_list[c->n_finished++] = x->link;
        }
    }
    Batch *e = &c->batches[x->batch];
    e->flows--;
    int64_t j = 0;
    while (e->members[j].r != x->request)
        j++;
    if (--e->members[j].count)
        Py_RETURN_NONE;
    memmove(&e->members[j], &e->members[j + 1], sizeof(Member) * (size_t)(e->n_members - j - 1));
    e->n_members--;
    e->red_valid = 0;
    if (touch(c, x->batch))
        return NULL;
    if (e->flows) {
        c->red_moved = 1;
        Py_RETURN_NONE;
    }
    e->live = 0; /* departure */
    if (e->prev >= 0)
        c->batches[e->prev].next = e->next;
    else
        c->live_head = e->next;
    if (e->next >= 0)
        c->batches[e->next].prev = e->prev;
    else
        c->live_tail = e->prev;
    c->n_live--;
    if (c->red_moved || c->external || c->prunes)
        c->order_stale = 1;
    Py_RETURN_NONE;
}

/* Request r's entry freed (its index handed out again later), or, while a live batch holds it, kept as
 * that batch's. */
static int free_request(Core *c, int64_t r)
{
    for (int64_t b = c->live_head; b >= 0; b = c->batches[b].next) {
        Batch *e = &c->batches[b];
        for (int64_t j = 0; j < e->n_members; j++)
            if (e->members[j].r == r) {
                c->requests[r].batch = b;
                return add_home(c, b, r);
            }
    }
    Request *q = &c->requests[r];
    if (PyDict_DelItem(c->request_index, q->name))
        return -1;
    Py_CLEAR(q->name);
    *q = (Request){NULL, NAN, -1, 0};
    c->request_rows.free[c->request_rows.n_free++] = r;
    return 0;
}

/* Core.forget(batches) -> the names freed now (see MfsPolicy.forget). */
static PyObject *mfs_forget(Core *c, PyObject *names)
{
    PyObject *freed = PyList_New(0), *pending = NULL;
    if (!freed || _PySet_Update(c->forget_pending, names) < 0 || !(pending = PySequence_List(c->forget_pending)))
        goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pending); i++) {
        PyObject *name = PyList_GET_ITEM(pending, i), *v = PyDict_GetItemWithError(c->batch_index, name);
        if (!v && PyErr_Occurred())
            goto fail;
        int64_t b = v ? PyLong_AsLongLong(v) : -1;
        if (b >= 0 && c->batches[b].live) /* still has live flows: at a later call */
            continue;
        if (PySet_Discard(c->forget_pending, name) < 0 || (b >= 0 && PyList_Append(freed, name)))
            goto fail;
        if (b < 0)
            continue;
        Batch *e = &c->batches[b];
        if (PyDict_DelItem(c->batch_index, name))
            goto fail;
        Py_CLEAR(e->name);
        e->ranked = e->red_valid = 0;
        if (e->touched) {
            e->touched = 0;
            int64_t j = 0;
            while (c->touched[j] != b)
                j++;
            memmove(&c->touched[j], &c->touched[j + 1], 8 * (size_t)(c->n_touched - j - 1));
            c->n_touched--;
        }
        c->batch_rows.free[c->batch_rows.n_free++] = b;
        int64_t n_home = e->n_home;
        e->n_home = 0;
        for (int64_t j = 0; j < n_home; j++)
            if (free_request(c, c->batches[b].home[j])) /* (entries may move: re-read) */
                goto fail;
    }
    for (int64_t r = 0; r < c->request_rows.n; r++) /* requests only the coordinator named, not pruned */
        if (c->requests[r].name && c->requests[r].batch < 0 && !c->requests[r].pruned && free_request(c, r))
            goto fail;
    Py_DECREF(pending);
    return freed;
fail:
    Py_XDECREF(pending);
    Py_XDECREF(freed);
    return NULL;
}

/* Core.set_pruned(names): the coordinator's pruned set (its order is the policy's from now on). */
static PyObject *mfs_set_pruned(Core *c, PyObject *names)
{
    PyObject *it = PyObject_GetIter(names), *name;
    if (!it)
        return NULL;
    c->external = 1;
    for (int64_t r = 0; r < c->request_rows.n; r++)
        c->requests[r].pruned = 0;
    while ((name = PyIter_Next(it))) {
        int64_t r = enter_request(c, name, NAN, -1);
        Py_DECREF(name);
        if (r < 0)
            break;
        c->requests[r].pruned = 1;
    }
    Py_DECREF(it);
    c->order_stale = 1;
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* Core.prune(names): Algorithm 1 pruned these (known) requests. */
static PyObject *mfs_prune(Core *c, PyObject *names)
{
    PyObject *it = PyObject_GetIter(names), *name;
    if (!it)
        return NULL;
    while ((name = PyIter_Next(it))) {
        PyObject *v = PyDict_GetItemWithError(c->request_index, name);
        if (v)
            c->requests[PyLong_AsLongLong(v)].pruned = 1;
        else if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, name);
        Py_DECREF(name);
        if (!v)
            break;
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *mfs_pruned_names(Core *c, PyObject *unused)
{
    PyObject *out = PySet_New(NULL);
    for (int64_t r = 0; out && r < c->request_rows.n; r++)
        if (c->requests[r].pruned && PySet_Add(out, c->requests[r].name))
            Py_CLEAR(out);
    return out;
}

/* (RED, name, b) of the live batches in the order they became live (live 1), or of the batches the last
 * full reorder ranked that are not live now (live 0: by the RED they were ranked with). */
static PyObject *batch_list(Core *c, int live)
{
    PyObject *out = PyList_New(0);
    int64_t b = live ? c->live_head : 0;
    while (out && (live ? b >= 0 : b < c->batch_rows.n)) {
        Batch *e = &c->batches[b];
        double red = e->ranked_red;
        if ((live || (e->name && e->ranked && !e->live)) && (!live || !red_of(c, b, &red))) {
            PyObject *t = Py_BuildValue("(dOL)", red, e->name, (long long)b);
            if (!t || PyList_Append(out, t))
                Py_CLEAR(out);
            Py_XDECREF(t);
        } else if (PyErr_Occurred())
            Py_CLEAR(out);
        b = live ? e->next : b + 1;
    }
    return out;
}

static PyObject *mfs_live_batches(Core *c, PyObject *unused) { return batch_list(c, 1); }
static PyObject *mfs_gone_batches(Core *c, PyObject *unused) { return batch_list(c, 0); }

static int64_t batch_arg(Core *c, PyObject *arg)
{
    int64_t b = PyLong_AsLongLong(arg);
    if (b == -1 && PyErr_Occurred())
        return -1;
    if (b < 0 || b >= c->batch_rows.n || !c->batches[b].name) {
        PyErr_Format(PyExc_IndexError, "mfs: no batch %lld", (long long)b);
        return -1;
    }
    return b;
}

/* Core.deadlines(b): live batch b's live deadlines (NaN ones left out), in the order its requests came. */
static PyObject *mfs_deadlines(Core *c, PyObject *arg)
{
    int64_t b = batch_arg(c, arg);
    PyObject *out = b < 0 ? NULL : PyList_New(0);
    for (int64_t j = 0; out && j < c->batches[b].n_members; j++) {
        double d = c->requests[c->batches[b].members[j].r].deadline;
        PyObject *f = d == d ? PyFloat_FromDouble(d) : NULL;
        if (d == d && (!f || PyList_Append(out, f)))
            Py_CLEAR(out);
        Py_XDECREF(f);
    }
    return out;
}

static PyObject *mfs_batch_index(Core *c, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(c->batch_index, name);
    return v ? Py_NewRef(v) : PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
}

/* Core.set_ranks(ranked, ranked_red) -> whether a live batch's rank changed. */
static PyObject *mfs_set_ranks(Core *c, PyObject *args)
{
    PyObject *ranked, *reds, *item, *it;
    if (!PyArg_ParseTuple(args, "OO", &ranked, &reds) || !(it = PyObject_GetIter(ranked)))
        return NULL;
    int moved = 0;
    while ((item = PyIter_Next(it))) {
        long long b, k;
        int ok = PyArg_ParseTuple(item, "LL", &b, &k);
        Py_DECREF(item);
        if (!ok || (b < 0 || b >= c->batch_rows.n ? (PyErr_Format(PyExc_IndexError, "mfs: no batch %lld", b), 1) : 0))
            break;
        if (c->batches[b].rank != k) {
            c->batches[b].rank = k;
            moved |= c->batches[b].live;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    if (reds != Py_None) {
        if (!PyDict_Check(reds)) {
            PyErr_SetString(PyExc_TypeError, "mfs: ranked_red must be a dict or None");
            return NULL;
        }
        for (int64_t b = 0; b < c->batch_rows.n; b++)
            c->batches[b].ranked = 0;
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(reds, &pos, &key, &value)) {
            int64_t b = batch_arg(c, key);
            if (b < 0 || mfs_as_f64(value, &c->batches[b].ranked_red))
                return NULL;
            c->batches[b].ranked = 1;
        }
    }
    for (int64_t j = 0; j < c->n_touched; j++)
        c->batches[c->touched[j]].touched = 0;
    c->n_touched = 0;
    return PyBool_FromLong(moved);
}

/* Core.owners(flows): per flow (batch, request, request name, deadline, pruned), None without a slot. */
static PyObject *mfs_owners(Core *c, PyObject *flows)
{
    PyObject *fast = PySequence_Fast(flows, "mfs: owners() takes a sequence of flows");
    PyObject *out = fast ? PyList_New(PySequence_Fast_GET_SIZE(fast)) : NULL;
    for (Py_ssize_t i = 0; out && i < PySequence_Fast_GET_SIZE(fast); i++) {
        PyObject *so = PyDict_GetItemWithError(c->slot_of, PySequence_Fast_GET_ITEM(fast, i)), *t;
        if (so) {
            const Slot *x = &c->slots[PyLong_AsLongLong(so)];
            const Request *q = &c->requests[x->request];
            t = Py_BuildValue("(LLOdO)", (long long)x->batch, (long long)x->request, q->name, q->deadline,
                              q->pruned ? Py_True : Py_False);
        } else
            t = PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
        if (!t)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, t);
    }
    Py_XDECREF(fast);
    return out;
}

/* Core.level(flow, pruning): a live flow's RMLQ level (K: the scavenger, with pruning applied). */
static PyObject *mfs_level(Core *c, PyObject *args)
{
    PyObject *flow, *so;
    int pruning;
    if (!PyArg_ParseTuple(args, "Op", &flow, &pruning) || !(so = PyDict_GetItemWithError(c->slot_of, flow))) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, flow);
        return NULL;
    }
    const Slot *x = &c->slots[PyLong_AsLongLong(so)];
    return PyLong_FromLongLong(mfs_queue_of(c, x, pruning && c->requests[x->request].pruned
                                                  && x->stage != LXF_STAGE_COLLECTIVE));
}

static PyObject *mfs_sizes(Core *c, PyObject *unused)
{
    int64_t memo = 0;
    for (int64_t b = 0; b < c->batch_rows.n; b++)
        memo += c->batches[b].name && c->batches[b].red_valid;
    return Py_BuildValue("{sLsLsLsLsL}", "slots", (long long)c->slot_rows.n, "batches", (long long)c->batch_rows.n,
                         "requests", (long long)c->request_rows.n, "live_batches", (long long)c->n_live, "red_memo",
                         (long long)memo);
}

#define METHOD(name, flags, doc) {#name, (PyCFunction)mfs_##name, flags, doc}
PyMethodDef mfs_methods[] = { /* Core's, decide's (core.c) and those of the tables */
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
    METHOD(level, METH_VARARGS, "level(flow, pruning) -> a live flow's RMLQ level, pruning applied or not"),
    METHOD(sizes, METH_NOARGS, "sizes() -> table sizes"),
    {NULL},
};
