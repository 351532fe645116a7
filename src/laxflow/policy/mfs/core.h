/* The mfs policy's C core, laxflow.policy.mfs._core.Core: its types and what its three files share.
 *
 *   core.c         the Python type (built from MfsConfig's values), decide (one decision over a
 *                  snapshot, into out-arrays: the Decision is views of them or copies), the module
 *   core_tables.c  slots, batches and requests: admission, completion, the RED memo, the order's
 *                  tables, the coordinator's pruned set, forget; the methods that read or change
 *                  them, and Core's method table
 *   core_step.c    the decision step: entry levels and promotions (MLU, RLI), the explicit-load
 *                  average, arbitration keys and dense levels
 *
 * One Core per MfsPolicy (policy.py) holds the whole state of the paper's per-flow rules, keyed by
 * integers given once: a live flow's RMLQ slot (its urgency, the static facts of its path and request,
 * when its level was last set, its request's progress), each batch's row (RED rank, live flows, live
 * requests, RED memo, the RED the last full reorder ranked it by), each request's (deadline, pruned
 * flag), each link's explicit-traffic average.  It does what reference.py's Reference does, with the
 * same methods, the same float operations in the same order (NumPy's per-element rules spelled out
 * where NaN or -0.0 could tell them apart) and the same slot and index numbering: the tests hold the
 * two to each other decision by decision.
 *
 * What needs Python stays in the policy and is called back: RED of a set of deadlines
 * (laxflow.policy.red), a full reorder (the coordinator's ranks, the RED order with returning batches,
 * Algorithm 1), and the notes on Flow objects.  Called on the policy's one thread; the GIL is held
 * throughout.  Units: bytes, bytes/s, seconds.  Built with -ffp-contract=off (setup.py). */
#ifndef LAXFLOW_MFS_CORE_H
#define LAXFLOW_MFS_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

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

typedef struct { /* the rows of a table (slots, batches, requests): how many, room, the freed ones */
    int64_t n, room, n_free;
    int64_t *free;
} Rows;

typedef struct { /* a C-contiguous 1-D buffer over a Python object, or over the copy converted from it */
    Py_buffer view;
    PyObject *copy; /* NULL: none */
    int held;
} Buf;

typedef struct {
    PyObject_HEAD
    /* MfsConfig */
    int64_t levels, n_thresholds;
    double period, window;
    double *thresholds; /* MLU level thresholds, ascending */
    uint8_t *dscp;      /* queue -> DSCP, index K = scavenger */
    int prunes;
    char note_levels; /* (a T_BOOL member) */
    PyObject *red, *reorder, *notes;
    /* flows */
    PyObject *slot_of; /* dict: Flow -> slot */
    Slot *slots;
    Rows slot_rows;
    /* batches and requests */
    PyObject *batch_index, *request_index, *forget_pending; /* name -> index, names forget() waits on */
    Batch *batches;
    Rows batch_rows;
    int64_t live_head, live_tail, n_live, n_touched, room_touched;
    int64_t *touched;
    Request *requests;
    Rows request_rows;
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
    /* the out-arrays (level, queue, dscp, tag) and the incremental Decisions over their first n */
    PyObject *out[4], *views;
    Py_buffer outbuf[4];
    int64_t out_room;
} Core;

/* core.c: the module's objects and interned names */
extern PyObject *np_empty, *np_contiguous, *dt_f64, *dt_i64, *dt_u8, *decision_type, *stage_codes, *empty_tuple;
extern PyObject *s_flows, *s_now, *s_capacity, *s_remaining, *s_tag, *s_kept, *s_progressed, *s_link_load,
    *s_link_load_in_use, *s_batch, *s_request, *s_deadline, *s_size, *s_links, *s_weights, *s_stage, *s_layer,
    *s_current_layer, *s_compute_done, *s_due, *s_explicit, *s_id, *s_timers;

/* core.c: Python values, and Core.decide */
PyObject *mfs_decide(Core *c, PyObject *snap);
int mfs_as_f64(PyObject *o, double *v);
int mfs_attr_f64(PyObject *o, PyObject *name, double *v);
int mfs_attr_true(PyObject *o, PyObject *name);
int mfs_get_buffer(PyObject *obj, char kind, Py_ssize_t count, Buf *b, const char *what);
void mfs_put_buffer(Buf *b);

/* core_tables.c: the tables, the methods of Core that read or change them, and the method table */
int mfs_reserve(void **p, int64_t *room, int64_t need, size_t elem);
int64_t mfs_admit(Core *c, PyObject *f, const double *capacity);
int mfs_ranks_hold(Core *c);
extern PyMethodDef mfs_methods[]; /* Core's methods */

/* core_step.c: the decision step */
int mfs_eligible(const Slot *x, int64_t tick);
void mfs_measure(Core *c, int64_t n, const double *remaining, double dt);
double mfs_step(Core *c, int64_t n, const double *remaining, const double *link_load, int clip, double now,
                int64_t tick, int64_t *level, int64_t *queue, uint8_t *dscp, int64_t *nn, int64_t *nb);
int64_t mfs_queue_of(const Core *c, const Slot *x, int scavenged);

#endif
