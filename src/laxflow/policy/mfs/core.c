/* The mfs policy's state and decision step in C: laxflow.policy.mfs._core.Core.
 *
 * One Core per MfsPolicy (policy.py) holds the whole state of the paper's
 * per-flow rules, keyed by integers given once: a live flow's RMLQ slot
 * (its urgency, the static facts of its path and request, when its level was
 * last set, its request's progress), each batch's entry (RED rank, live
 * flows, live requests, RED memo, the RED the last full reorder ranked it
 * by), each request's (deadline, pruned flag), each link's explicit-traffic
 * average.  It does what reference.py's Reference does, with the same
 * methods, the same float operations in the same order (NumPy's per-element
 * rules spelled out where NaN or -0.0 could tell them apart) and the same
 * slot and index numbering: the tests hold the two to each other decision
 * by decision.
 *
 * What needs Python stays in the policy and is called back: RED of a set of
 * deadlines (laxflow.policy.red), a full reorder (the coordinator's ranks,
 * the RED order with returning batches, Algorithm 1), and the notes on Flow
 * objects.  Called on the policy's one thread; the GIL is held throughout.
 * Units: bytes, bytes/s, seconds. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "laxflow_shm.h" /* the one stage table: LXF_STAGE_* (laxflow.stage reads the same header) */

#define UNRANKED (INT64_MAX / 2) /* a new batch's rank until ordered: last */

typedef struct { /* one RMLQ slot: a live flow */
    double target, due, rate, weight, last_rem, layer_at, seen_layer; /* layer_at: -inf none */
    int64_t urgency, link, batch, request, tick_at;
    int8_t stage;
    uint8_t explicit_, seen_done, used;
} Slot;

typedef struct { int64_t r, count; } Member; /* a live request of a batch, with its live flows there */

typedef struct {
    PyObject *name;          /* NULL: a free entry */
    int64_t rank, flows;     /* RED rank; live flows */
    Member *members;         /* its live requests, in the order they came */
    int64_t n_members, room_members;
    int64_t *home;           /* requests first entered with it: freed with it (forget) */
    int64_t n_home, room_home;
    double red, ranked_red;  /* RED memo (red_valid); the RED the last full reorder ranked it by (ranked) */
    int64_t prev, next;      /* the live list, in the order batches became live */
    uint8_t live, red_valid, ranked, touched;
} Batch;

typedef struct {
    PyObject *name; /* NULL: a free entry */
    double deadline; /* NaN: none */
    int64_t batch;  /* the batch it was first entered with (-1: named by the coordinator only) */
    uint8_t pruned;
} Request;

typedef struct { int64_t q, e, u, r, pos; } Key; /* arbitration.engine_levels' key and the flow's position */

typedef struct {
    PyObject_HEAD
    /* MfsConfig */
    int64_t levels, n_thresholds;
    double period, window;
    double *thresholds; /* MLU level thresholds, ascending */
    uint8_t *dscp;      /* queue -> DSCP, index K = scavenger */
    int prunes, note_levels;
    PyObject *red, *reorder, *notes, *decision;
    /* flows */
    PyObject *slot_of; /* dict: Flow -> slot */
    Slot *slots;
    int64_t n_slots, room_slots, n_free_slots;
    int64_t *free_slots;
    /* batches and requests */
    PyObject *batch_index, *request_index, *forget_pending; /* name -> index, names forget() waits on */
    Batch *batches;
    int64_t n_batches, room_batches, n_free_batches, live_head, live_tail, n_live, n_touched;
    int64_t *free_batches, *touched;
    Request *requests;
    int64_t n_requests, room_requests, n_free_requests;
    int64_t *free_requests;
    int order_stale, red_moved, external;
    /* links */
    int64_t links, n_finished, n_nonzero;
    double *load, *finished, *sent;
    uint8_t *is_finished, *has_sent, *in_nonzero;
    int64_t *finished_list, *touched_links, *nonzero;
    double last_t;
    int has_last_t;
    /* per decision */
    int64_t room_flows;
    int64_t *pos_slot, *noted, *bad;
    const double *capacity; /* the decision's, while it runs */
    uint8_t *is_new;
    Key *keys;
    /* an incremental decision's out-arrays (level, queue, dscp, tag) and the Decisions over their first n */
    PyObject *out[4], *views;
    Py_buffer outbuf[4];
    int64_t out_room;
} Core;

static PyObject *np_empty, *np_contiguous, *dt_f64, *dt_i64, *dt_u8, *flow_type, *stage_codes, *p2d, *empty_tuple;
static PyObject *s_flows, *s_now, *s_capacity, *s_remaining, *s_tag, *s_kept, *s_progressed, *s_link_load,
    *s_link_load_in_use, *s_batch, *s_request, *s_deadline, *s_downstream, *s_size, *s_links, *s_weights,
    *s_stage, *s_layer, *s_current_layer, *s_compute_done, *s_due, *s_explicit, *s_id, *s_timers;

/* ------------------------------------------------------------ memory */

/* *p with room for need elements of size elem (doubling); 0 or -1 with MemoryError. */
static int reserve(void **p, int64_t *room, int64_t need, size_t elem)
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

static int as_f64(PyObject *o, double *v)
{
    double x = PyFloat_AsDouble(o);
    if (x == -1.0 && PyErr_Occurred())
        return -1;
    *v = x;
    return 0;
}

/* getattr(o, name) as a double, None as NaN. */
static int attr_f64(PyObject *o, PyObject *name, double *v)
{
    PyObject *x = PyObject_GetAttr(o, name);
    if (!x)
        return -1;
    int bad = x == Py_None ? (*v = NAN, 0) : as_f64(x, v);
    Py_DECREF(x);
    return bad;
}

static int attr_true(PyObject *o, PyObject *name)
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
static int get_buffer(PyObject *obj, char kind, Py_ssize_t count, Py_buffer *b, PyObject **tmp, const char *what)
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

static void put_buffer(Py_buffer *b, PyObject *tmp)
{
    PyBuffer_Release(b);
    Py_XDECREF(tmp);
}

/* ------------------------------------------------------------ batches and requests */

static int touch(Core *c, int64_t b)
{
    if (!c->batches[b].touched) {
        c->batches[b].touched = 1;
        c->touched[c->n_touched++] = b; /* (room: as many as batches) */
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
    int64_t b, room = c->room_batches;
    if (c->n_free_batches)
        b = c->free_batches[--c->n_free_batches];
    else {
        b = c->n_batches;
        if (reserve((void **)&c->batches, &room, b + 1, sizeof(Batch)))
            return -1;
        if (room != c->room_batches) {
            int64_t r1 = c->room_batches, r2 = c->room_batches;
            if (reserve((void **)&c->free_batches, &r1, room, 8) || reserve((void **)&c->touched, &r2, room, 8))
                return -1;
            c->room_batches = room;
        }
        memset(&c->batches[b], 0, sizeof(Batch));
        c->n_batches++;
    }
    PyObject *index = PyLong_FromLongLong(b);
    if (!index || PyDict_SetItem(c->batch_index, name, index)) {
        Py_XDECREF(index);
        return -1;
    }
    Py_DECREF(index);
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
    if (reserve((void **)&e->home, &e->room_home, e->n_home + 1, 8))
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
    int64_t r, room = c->room_requests;
    if (c->n_free_requests)
        r = c->free_requests[--c->n_free_requests];
    else {
        r = c->n_requests;
        if (reserve((void **)&c->requests, &room, r + 1, sizeof(Request)))
            return -1;
        if (room != c->room_requests) {
            int64_t r1 = c->room_requests;
            if (reserve((void **)&c->free_requests, &r1, room, 8))
                return -1;
            c->room_requests = room;
        }
        c->n_requests++;
    }
    PyObject *index = PyLong_FromLongLong(r);
    if (!index || PyDict_SetItem(c->request_index, name, index)) {
        Py_XDECREF(index);
        return -1;
    }
    Py_DECREF(index);
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
        touch(c, b);
        c->order_stale = 1;
    }
    e->flows++;
    for (int64_t j = 0; j < e->n_members; j++)
        if (e->members[j].r == r) {
            e->members[j].count++;
            return 0;
        }
    if (reserve((void **)&e->members, &e->room_members, e->n_members + 1, sizeof(Member)))
        return -1;
    e->members[e->n_members++] = (Member){r, 1};
    e->red_valid = 0; /* its live deadlines changed */
    touch(c, b);
    c->red_moved = 1;
    return 0;
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
        int bad = as_f64(v, &e->red);
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
static int ranks_hold(Core *c)
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
    PyObject *lo = PyObject_GetAttr(f, s_links), *wo = lo ? PyObject_GetAttr(f, s_weights) : NULL, *lt, *wt;
    Py_buffer lb, wb;
    int rc = -1;
    if (!wo || get_buffer(lo, 'q', 1, &lb, &lt, "a flow's links"))
        goto out;
    if (get_buffer(wo, 'd', lb.len / 8, &wb, &wt, "a flow's weights")) {
        put_buffer(&lb, lt);
        goto out;
    }
    const int64_t *l = lb.buf;
    const double *w = wb.buf;
    int64_t best = -1;
    double best_r = 0.0;
    for (Py_ssize_t k = 0; k < lb.len / 8; k++) {
        if (l[k] < 0 || l[k] >= c->links) {
            PyObject *id = PyObject_GetAttr(f, s_id);
            PyErr_Format(PyExc_ValueError, "mfs: flow %R uses link %lld, but the network has %lld links", id,
                         (long long)l[k], (long long)c->links);
            Py_XDECREF(id);
            best = -2;
            break;
        }
        double cap = capacity[l[k]];
        double r = w[k] == 0.0 ? (cap != 0.0 ? copysign(INFINITY, cap) : NAN) : cap / w[k];
        if (best < 0 || r < best_r) {
            best = k;
            best_r = r;
        }
    }
    if (best >= 0) {
        *link = l[best];
        *rate = best_r;
        *weight = w[best];
        rc = 0;
    }
    put_buffer(&lb, lt);
    put_buffer(&wb, wt);
out:
    Py_XDECREF(lo);
    Py_XDECREF(wo);
    return rc;
}

/* A new flow into the RMLQ: a slot, its static facts, its request progress, its batch and request
 * entered.  Its slot, or -1 (nothing changed). */
static int64_t admit(Core *c, PyObject *f, const double *capacity)
{
    Slot x = {0};
    PyObject *stage = NULL, *code, *bname = NULL, *rname = NULL;
    double deadline, downstream;
    int64_t s = -1;
    if (bottleneck(c, f, capacity, &x.link, &x.rate, &x.weight) || attr_f64(f, s_size, &x.last_rem)
        || attr_f64(f, s_layer, &x.target) || attr_f64(f, s_current_layer, &x.seen_layer)
        || attr_f64(f, s_deadline, &deadline) || !(stage = PyObject_GetAttr(f, s_stage)))
        goto out;
    if (!(code = PyDict_GetItemWithError(stage_codes, stage))) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "mfs: a flow's stage %R has no stage code", stage);
        goto out;
    }
    x.stage = (int8_t)PyLong_AsLong(code);
    int done = attr_true(f, s_compute_done);
    if (done < 0)
        goto out;
    x.seen_done = (uint8_t)done;
    if (Py_TYPE(f) == (PyTypeObject *)flow_type) { /* a plain Flow: its due and explicit, as its properties */
        if (attr_f64(f, s_downstream, &downstream))
            goto out;
        x.explicit_ = stage == p2d && deadline == deadline;
        x.due = deadline - downstream;
    } else { /* a subclass may define its own */
        int e = attr_true(f, s_explicit);
        if (e < 0 || attr_f64(f, s_due, &x.due))
            goto out;
        x.explicit_ = (uint8_t)e;
    }
    if (!(bname = PyObject_GetAttr(f, s_batch)) || !(rname = PyObject_GetAttr(f, s_request)))
        goto out;
    /* the slot: a freed one first (the last freed), else a new one */
    if (c->n_free_slots)
        s = c->free_slots[--c->n_free_slots];
    else {
        int64_t room = c->room_slots, r2 = c->room_slots;
        if (reserve((void **)&c->slots, &room, c->n_slots + 1, sizeof(Slot))
            || reserve((void **)&c->free_slots, &r2, room, 8))
            goto out;
        c->room_slots = room;
        s = c->n_slots++;
    }
    PyObject *so = PyLong_FromLongLong(s);
    if (!so || PyDict_SetItem(c->slot_of, f, so)) {
        Py_XDECREF(so);
        c->free_slots[c->n_free_slots++] = s;
        s = -1;
        goto out;
    }
    Py_DECREF(so);
    x.batch = enter_batch(c, bname);
    x.request = x.batch < 0 ? -1 : enter_request(c, rname, deadline, x.batch);
    if (x.request < 0 || join(c, x.batch, x.request)) { /* (no memory, or a name that does not hash) */
        PyDict_DelItem(c->slot_of, f);
        c->free_slots[c->n_free_slots++] = s;
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

/* ------------------------------------------------------------ the decision step */

/* bisect.bisect_right(a, x) */
static int64_t bisect_right(const double *a, int64_t len, double x)
{
    int64_t lo = 0, hi = len;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (x < a[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* Python's max(a, b) and min(a, b) for floats: the first unless the second compares strictly beyond it. */
static double py_max(double a, double b) { return b > a ? b : a; }
static double py_min(double a, double b) { return b < a ? b : a; }

/* The urgency slot s would have now: its MLU level (explicit deadline) or its RLI (reference.candidates). */
static int64_t candidate(const Core *c, const Slot *x, double remaining, const double *link_load, int clip,
                         double now, int *infeasible)
{
    int64_t k = c->levels;
    if (!x->explicit_) {
        if (x->stage == LXF_STAGE_COLLECTIVE)
            return 0;
        if (x->stage == LXF_STAGE_P2D)
            return k - 1;
        double diff = x->target - x->seen_layer;
        if (isnan(diff))
            return k - 1;
        return (int64_t)py_min(py_max(diff, 0.0), (double)(k - 1));
    }
    double load = link_load[x->link];
    if (clip) { /* as the engine's snapshot column: [0, 1], NaN kept */
        load = (load >= 0.0 || load != load) ? load : 0.0;
        load = (load <= 1.0 || load != load) ? load : 1.0;
    }
    double rho = py_min(py_max(load - c->load[x->link], 0.0), 1.0);
    double residual = (x->due - now) * x->rate * (1.0 - rho);
    double mlu = residual > 0 ? remaining / residual : INFINITY;
    if (mlu > 1.0)
        *infeasible = 1;
    return c->n_thresholds - bisect_right(c->thresholds, c->n_thresholds, mlu);
}

/* Whether slot x (not new) may change level now: a layer boundary, or a period tick past compute. */
static int eligible(const Slot *x, int64_t tick)
{
    if (x->urgency <= 0)
        return 0;
    double cur = x->seen_layer != x->seen_layer ? -INFINITY : x->seen_layer;
    return cur > x->layer_at || (x->explicit_ && x->seen_done && tick > x->tick_at);
}

/* The explicit-traffic average per link after dt seconds (reference.explicit_load): utilization by the
 * bytes live explicit flows sent since the last decision, and those of flows done meanwhile, on each
 * one's bottleneck link; load <- u + (load - u) * exp(-dt / window), u clipped to [0, 1]. */
static void measure(Core *c, int64_t n, const double *remaining, double dt)
{
    double *sent = c->sent, *load = c->load;
    uint8_t *has = c->has_sent;
    int64_t nt = 0;
    for (int64_t i = 0; i < n; i++) {
        const Slot *x = &c->slots[c->pos_slot[i]];
        if (!x->explicit_ || c->is_new[i])
            continue;
        double prev = 0.0;
        if (has[x->link])
            prev = sent[x->link];
        else {
            has[x->link] = 1;
            c->touched_links[nt++] = x->link;
        }
        sent[x->link] = prev + (x->last_rem - remaining[i]) * x->weight;
    }
    double decay = exp(-dt / c->window);
    for (int64_t j = 0; j < c->n_finished; j++) { /* the union: finished links not in sent, moved 0.0 + done */
        int64_t link = c->finished_list[j];
        if (!has[link]) {
            has[link] = 1;
            sent[link] = 0.0;
            c->touched_links[nt++] = link;
        }
    }
    for (int64_t j = 0; j < nt; j++) { /* each moved link's new value, from its old average */
        int64_t link = c->touched_links[j];
        double moved = c->n_finished ? sent[link] + c->finished[link] : sent[link];
        double span = c->capacity[link] * dt, util;
        if (span > 0)
            util = moved / span;
        else
            util = (moved == 0 || isnan(moved)) ? 0.0 : copysign(1.0, moved);
        if (!(util >= 0.0))
            util = 0.0;
        else if (util > 1.0)
            util = 1.0;
        sent[link] = util + (load[link] - util) * decay;
    }
    /* load *= decay on every link: 0.0 (or -0.0) stays as it is, so only the listed links (those whose
     * average is not 0.0); one that reaches 0.0 leaves the list. */
    for (int64_t j = 0; j < c->n_nonzero;) {
        int64_t l = c->nonzero[j];
        load[l] *= decay;
        if (load[l] == 0.0) {
            c->in_nonzero[l] = 0;
            c->nonzero[j] = c->nonzero[--c->n_nonzero];
        } else
            j++;
    }
    for (int64_t j = 0; j < nt; j++) {
        int64_t link = c->touched_links[j];
        load[link] = sent[link];
        has[link] = 0;
        if (load[link] != 0.0 && !c->in_nonzero[link]) {
            c->in_nonzero[link] = 1;
            c->nonzero[c->n_nonzero++] = link;
        }
    }
    for (int64_t j = 0; j < c->n_finished; j++) {
        c->finished[c->finished_list[j]] = 0.0;
        c->is_finished[c->finished_list[j]] = 0;
    }
    c->n_finished = 0;
}

static int key_cmp(const void *pa, const void *pb)
{
    const Key *a = pa, *b = pb;
    if (a->q != b->q)
        return a->q < b->q ? -1 : 1;
    if (a->e != b->e)
        return a->e < b->e ? -1 : 1;
    if (a->u != b->u)
        return a->u < b->u ? -1 : 1;
    if (a->r != b->r)
        return a->r < b->r ? -1 : 1;
    return 0;
}

/* A key packed into one word where its fields fit (q, u < 256, e in {0, 1}, 0 <= r < 2^46): the words
 * order as the keys do. */
typedef struct { uint64_t k; int64_t pos; } PKey;
#define PK_R_BITS 46

/* Quicksort by k (Hoare partition, median of three), the smaller side first; insertion sort below 25. */
static void pkey_sort(PKey *a, int64_t n)
{
    while (n > 24) {
        uint64_t x = a[0].k, y = a[n / 2].k, z = a[n - 1].k;
        uint64_t pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        int64_t i = -1, j = n;
        for (;;) {
            do
                i++;
            while (a[i].k < pivot);
            do
                j--;
            while (a[j].k > pivot);
            if (i >= j)
                break;
            PKey t = a[i];
            a[i] = a[j];
            a[j] = t;
        }
        int64_t left = j + 1;
        if (left < n - left) {
            pkey_sort(a, left);
            a += left;
            n -= left;
        } else {
            pkey_sort(a + left, n - left);
            n = left;
        }
    }
    for (int64_t j = 1; j < n; j++) {
        PKey x = a[j];
        int64_t i = j - 1;
        for (; i >= 0 && a[i].k > x.k; i--)
            a[i + 1] = a[i];
        a[i + 1] = x;
    }
}

/* level[pos] = the dense rank of each flow's key (arbitration.engine_levels: equal keys, equal levels). */
static void dense_levels(Key *keys, int64_t n, int64_t *level)
{
    int packed = 1;
    for (int64_t i = 0; i < n && packed; i++)
        packed = keys[i].q >= 0 && keys[i].q < 256 && keys[i].u >= 0 && keys[i].u < 256 && keys[i].r >= 0
                 && keys[i].r < ((int64_t)1 << PK_R_BITS);
    int64_t dense = -1;
    if (packed) { /* (always in practice: fewer than 256 levels, ranks below 2^46) */
        PKey *pk = (PKey *)keys; /* (in the keys' own buffer: each key is read before its word is written) */
        for (int64_t i = 0; i < n; i++) {
            Key key = keys[i];
            pk[i].k = ((uint64_t)key.q << (PK_R_BITS + 9)) | ((uint64_t)key.e << (PK_R_BITS + 8))
                      | ((uint64_t)key.u << PK_R_BITS) | (uint64_t)key.r;
            pk[i].pos = key.pos;
        }
        pkey_sort(pk, n);
        for (int64_t j = 0; j < n; j++) {
            dense += j == 0 || pk[j].k != pk[j - 1].k;
            level[pk[j].pos] = dense;
        }
        return;
    }
    qsort(keys, (size_t)n, sizeof(Key), key_cmp);
    for (int64_t j = 0; j < n; j++) {
        dense += j == 0 || key_cmp(&keys[j], &keys[j - 1]);
        level[keys[j].pos] = dense;
    }
}

static int64_t queue_of(const Core *c, const Slot *x, int scavenged)
{
    if (scavenged)
        return c->levels;
    return x->explicit_ ? x->urgency : (x->urgency + 1 < c->levels - 1 ? x->urgency + 1 : c->levels - 1);
}

/* Entry levels of the new flows, promotions of the old ones, their arbitration keys, queues and DSCP,
 * and their bytes left for the next measurement, in position order; then the dense levels.  The timer
 * (NaN: none); noted and bad counts in *nn, *nb. */
static double step(Core *c, int64_t n, const double *remaining, const double *link_load, int clip, double now,
                   int64_t tick, int64_t *level, int64_t *queue, uint8_t *dscp, int64_t *nn, int64_t *nb)
{
    int64_t k = c->levels;
    double timer = NAN;
    *nn = *nb = 0;
    for (int64_t i = 0; i < n; i++) {
        Slot *x = &c->slots[c->pos_slot[i]];
        if (c->is_new[i] || eligible(x, tick)) {
            int64_t was = x->urgency;
            int bad = 0;
            int64_t cand = candidate(c, x, remaining[i], link_load, clip, now, &bad);
            if (bad)
                c->bad[(*nb)++] = i;
            int64_t u = c->is_new[i] || cand < was ? cand : was;
            x->urgency = u;
            x->layer_at = x->seen_layer != x->seen_layer ? -INFINITY : x->seen_layer;
            x->tick_at = tick;
            if ((c->is_new[i] || u < was) && c->note_levels) {
                c->noted[2 * *nn] = i;
                c->noted[2 * *nn + 1] = queue_of(c, x, 0);
                (*nn)++;
            }
        }
        Key *key = &c->keys[i];
        key->pos = i;
        if (c->requests[x->request].pruned && x->stage != LXF_STAGE_COLLECTIVE) {
            key->q = k; /* the scavenger is one level */
            key->e = key->u = key->r = 0;
        } else if (x->explicit_) {
            key->q = x->urgency;
            key->e = 1;
            key->u = key->r = 0;
            if (timer != timer && x->urgency > 0 && x->seen_done)
                timer = (double)(tick + 1) * c->period;
        } else {
            key->q = queue_of(c, x, 0);
            key->e = 0;
            key->u = x->urgency;
            key->r = c->batches[x->batch].rank;
        }
        queue[i] = key->q;
        dscp[i] = c->dscp[key->q];
        x->last_rem = remaining[i];
    }
    dense_levels(c->keys, n, level);
    return timer;
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
        if (attr_f64(flows[i], s_current_layer, &x->seen_layer) || (done = attr_true(flows[i], s_compute_done)) < 0)
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
static PyObject *core_decide(Core *c, PyObject *snap)
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
    int bad_now = !now_o || as_f64(now_o, &now);
    Py_XDECREF(now_o);
    if (bad_now || !(cap_o = PyObject_GetAttr(snap, s_capacity)) || !(rem_o = PyObject_GetAttr(snap, s_remaining))
        || !(tag_o = PyObject_GetAttr(snap, s_tag)))
        goto out;
    Py_ssize_t links = PyObject_Length(cap_o);
    if (links < 0 || get_buffer(cap_o, 'd', links, &cap_b, &cap_t, "Snapshot.capacity"))
        goto out;
    have_cap = 1;
    if (get_buffer(rem_o, 'd', n, &rem_b, &rem_t, "Snapshot.remaining"))
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
        if (get_buffer(tag_o, 'q', kept, &tag_b, &tag_t, "Snapshot.tag"))
            goto out;
        have_tag = 1;
        const int64_t *tag = tag_b.buf;
        for (int64_t i = 0; i < kept; i++) {
            if (tag[i] < 0 || tag[i] >= c->n_slots || !c->slots[tag[i]].used) {
                PyErr_Format(PyExc_RuntimeError, "mfs: flow %lld's tag %lld is no live RMLQ slot of this policy "
                             "(an owner's tags out of step)", (long long)i, (long long)tag[i]);
                goto out;
            }
            c->pos_slot[i] = tag_out[i] = tag[i];
        }
        for (int64_t i = kept; i < n; i++) {
            if ((c->pos_slot[i] = tag_out[i] = admit(c, flows[i], c->capacity)) < 0)
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
            else if (PyErr_Occurred() || (c->pos_slot[i] = admit(c, flows[i], c->capacity)) < 0)
                goto out;
            else
                c->is_new[i] = 1;
        }
        if (read_progress(c, flows, n, NULL))
            goto out;
    }
    if (c->order_stale) { /* RED order (reads no level; pruning reads the snapshot) */
        c->order_stale = c->red_moved = 0;
        int hold = c->external || c->prunes ? 0 : ranks_hold(c);
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
        if (x->explicit_ && (c->is_new[i] || eligible(x, tick))) {
            if (incremental) {
                load_o = PyObject_GetAttr(snap, s_link_load_in_use);
                if (load_o == Py_None)
                    Py_CLEAR(load_o);
            }
            if (!load_o && !(load_o = PyObject_GetAttr(snap, s_link_load)))
                goto out;
            if (get_buffer(load_o, 'd', c->links, &load_b, &load_t, "the snapshot's link load"))
                goto out;
            have_load = 1;
            load = load_b.buf;
        }
    }
    if (dt >= 0)
        measure(c, n, rem_b.buf, dt);
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
    double timer = step(c, n, rem_b.buf, load, 1 - !incremental, now, tick, level, queue, dscp, &nn, &nb);
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
        put_buffer(&cap_b, cap_t);
    if (have_rem)
        put_buffer(&rem_b, rem_t);
    if (have_tag)
        put_buffer(&tag_b, tag_t);
    if (have_load)
        put_buffer(&load_b, load_t);
    Py_XDECREF(fast);
    Py_XDECREF(flows_o);
    Py_XDECREF(cap_o);
    Py_XDECREF(rem_o);
    Py_XDECREF(tag_o);
    Py_XDECREF(load_o);
    Py_XDECREF(prog);
    return result;
}

/* ------------------------------------------------------------ completion and the tables */

/* Core.complete(flow): its slot free; an explicit flow's last bytes counted on its bottleneck link for
 * the next measurement; the flow leaves its batch's live tables; a batch whose last flow this was
 * departs, and the order is stale unless only the departed batch's gap in the ranks would close. */
static PyObject *core_complete(Core *c, PyObject *flow)
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
    c->free_slots[c->n_free_slots++] = s;
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
    touch(c, x->batch);
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
    c->free_requests[c->n_free_requests++] = r;
    return 0;
}

/* Core.forget(batches) -> the names freed now (see MfsPolicy.forget). */
static PyObject *core_forget(Core *c, PyObject *names)
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
        c->free_batches[c->n_free_batches++] = b;
        int64_t n_home = e->n_home;
        e->n_home = 0;
        for (int64_t j = 0; j < n_home; j++)
            if (free_request(c, c->batches[b].home[j])) /* (entries may move: re-read) */
                goto fail;
    }
    for (int64_t r = 0; r < c->n_requests; r++) /* requests only the coordinator named, not pruned */
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
static PyObject *core_set_pruned(Core *c, PyObject *names)
{
    PyObject *it = PyObject_GetIter(names), *name;
    if (!it)
        return NULL;
    c->external = 1;
    for (int64_t r = 0; r < c->n_requests; r++)
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
static PyObject *core_prune(Core *c, PyObject *names)
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

static PyObject *core_pruned_names(Core *c, PyObject *unused)
{
    PyObject *out = PySet_New(NULL);
    for (int64_t r = 0; out && r < c->n_requests; r++)
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
    while (out && (live ? b >= 0 : b < c->n_batches)) {
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

static PyObject *core_live_batches(Core *c, PyObject *unused) { return batch_list(c, 1); }
static PyObject *core_gone_batches(Core *c, PyObject *unused) { return batch_list(c, 0); }

static int64_t batch_arg(Core *c, PyObject *arg)
{
    int64_t b = PyLong_AsLongLong(arg);
    if (b == -1 && PyErr_Occurred())
        return -1;
    if (b < 0 || b >= c->n_batches || !c->batches[b].name) {
        PyErr_Format(PyExc_IndexError, "mfs: no batch %lld", (long long)b);
        return -1;
    }
    return b;
}

/* Core.deadlines(b): live batch b's live deadlines (NaN ones left out), in the order its requests came. */
static PyObject *core_deadlines(Core *c, PyObject *arg)
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

static PyObject *core_batch_index(Core *c, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(c->batch_index, name);
    return v ? Py_NewRef(v) : PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
}

/* Core.set_ranks(ranked, ranked_red) -> whether a live batch's rank changed. */
static PyObject *core_set_ranks(Core *c, PyObject *args)
{
    PyObject *ranked, *reds, *item, *it;
    if (!PyArg_ParseTuple(args, "OO", &ranked, &reds) || !(it = PyObject_GetIter(ranked)))
        return NULL;
    int moved = 0;
    while ((item = PyIter_Next(it))) {
        long long b, k;
        int ok = PyArg_ParseTuple(item, "LL", &b, &k);
        Py_DECREF(item);
        if (!ok || (b < 0 || b >= c->n_batches ? (PyErr_Format(PyExc_IndexError, "mfs: no batch %lld", b), 1) : 0))
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
        for (int64_t b = 0; b < c->n_batches; b++)
            c->batches[b].ranked = 0;
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(reds, &pos, &key, &value)) {
            int64_t b = batch_arg(c, key);
            if (b < 0 || as_f64(value, &c->batches[b].ranked_red))
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
static PyObject *core_owners(Core *c, PyObject *flows)
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

static PyObject *level_of(Core *c, PyObject *flow, int pruning)
{
    PyObject *so = PyDict_GetItemWithError(c->slot_of, flow);
    if (!so) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, flow);
        return NULL;
    }
    const Slot *x = &c->slots[PyLong_AsLongLong(so)];
    return PyLong_FromLongLong(queue_of(c, x, pruning && c->requests[x->request].pruned
                                                  && x->stage != LXF_STAGE_COLLECTIVE));
}

static PyObject *core_queue_level(Core *c, PyObject *flow) { return level_of(c, flow, 1); }
static PyObject *core_rmlq_level(Core *c, PyObject *flow) { return level_of(c, flow, 0); }

static PyObject *core_sizes(Core *c, PyObject *unused)
{
    int64_t memo = 0;
    for (int64_t b = 0; b < c->n_batches; b++)
        memo += c->batches[b].name && c->batches[b].red_valid;
    return Py_BuildValue("{sLsLsLsLsL}", "slots", (long long)c->n_slots, "batches", (long long)c->n_batches,
                         "requests", (long long)c->n_requests, "live_batches", (long long)c->n_live, "red_memo",
                         (long long)memo);
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
    if (!v || as_f64(v, &period)) goto fail;
    Py_SETREF(v, PyObject_GetAttrString(config, "load_window"));
    if (!v || as_f64(v, &window)) goto fail;
    Py_SETREF(v, PyObject_GetAttrString(config, "dscp_map"));
    if (!v || !(codes = PyObject_GetAttrString(v, "codes"))) goto fail;
    if (get_buffer(thresholds, 'd', 0, &tb, &t, "thresholds")) goto fail;
    if (PyObject_GetBuffer(codes, &cb, PyBUF_C_CONTIGUOUS) || cb.len != levels + 1 || cb.itemsize != 1) {
        if (!PyErr_Occurred()) {
            PyBuffer_Release(&cb);
            PyErr_Format(PyExc_ValueError, "mfs: the DSCP map needs %lld uint8 codes", levels + 1);
        }
        put_buffer(&tb, t);
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
    put_buffer(&tb, t);
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
    for (int64_t b = 0; b < c->n_batches; b++) {
        Py_XDECREF(c->batches[b].name);
        free(c->batches[b].members);
        free(c->batches[b].home);
    }
    for (int64_t r = 0; r < c->n_requests; r++)
        Py_XDECREF(c->requests[r].name);
    void *blocks[] = {c->thresholds, c->dscp, c->slots, c->free_slots, c->batches, c->free_batches, c->touched,
                      c->requests, c->free_requests, c->load, c->keys};
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

#define METHOD(name, flags, doc) {#name, (PyCFunction)core_##name, flags, doc}
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
    .tp_doc = "One mfs policy's state and decision step (see core.c and reference.Reference).",
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
