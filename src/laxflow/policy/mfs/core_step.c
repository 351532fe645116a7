/* The mfs core's decision step (see core.h): the reference Reference.decide's per-flow float
 * operations in its order, one flow at a time. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

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
int mfs_eligible(const Slot *x, int64_t tick)
{
    if (x->urgency <= 0)
        return 0;
    double cur = x->seen_layer != x->seen_layer ? -INFINITY : x->seen_layer;
    return cur > x->layer_at || (x->explicit_ && x->seen_done && tick > x->tick_at);
}

/* The explicit-traffic average per link after dt seconds (reference.explicit_load): utilization by the
 * bytes live explicit flows sent since the last decision, and those of flows done meanwhile, on each
 * one's bottleneck link; load <- u + (load - u) * exp(-dt / window), u clipped to [0, 1]. */
void mfs_measure(Core *c, int64_t n, const double *remaining, double dt)
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

int64_t mfs_queue_of(const Core *c, const Slot *x, int scavenged)
{
    if (scavenged)
        return c->levels;
    return x->explicit_ ? x->urgency : (x->urgency + 1 < c->levels - 1 ? x->urgency + 1 : c->levels - 1);
}

/* Entry levels of the new flows, promotions of the old ones, their arbitration keys, queues and DSCP,
 * and their bytes left for the next measurement, in position order; then the dense levels.  The timer
 * (NaN: none); noted and bad counts in *nn, *nb. */
double mfs_step(Core *c, int64_t n, const double *remaining, const double *link_load, int clip, double now,
                   int64_t tick, int64_t *level, int64_t *queue, uint8_t *dscp, int64_t *nn, int64_t *nb)
{
    int64_t k = c->levels;
    double timer = NAN;
    *nn = *nb = 0;
    for (int64_t i = 0; i < n; i++) {
        Slot *x = &c->slots[c->pos_slot[i]];
        if (c->is_new[i] || mfs_eligible(x, tick)) {
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
                c->noted[2 * *nn + 1] = mfs_queue_of(c, x, 0);
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
            key->q = mfs_queue_of(c, x, 0);
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
