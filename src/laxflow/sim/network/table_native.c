/* The network engine's live-flow table in C: every per-flow number the
 * engine keeps between events (bytes left, rate, the last decision, the
 * usage vectors as one CSR), and the passes over them that run at every
 * event: accounting the bytes sent since the last event and the link-load
 * average, finding the flows that finished, the next completion time,
 * applying a decision (what moved, from which level rates must be
 * recomputed) and the rate allocation itself.
 *
 * engine.py (FluidNetwork) owns one table per network and calls these
 * functions through cffi on its own thread; the Flow objects, callbacks and
 * events stay in Python.  Every float operation is the one the engine's
 * Python code did before (and allocate_native.c's allocation), in the same
 * order, so runs are bit-identical (bench/sim_digest.py checks it).
 * Compiled with -ffp-contract=off (see allocate_build.py).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "laxflow_shm.h" /* the one stage table: LXF_STAGE_* */
#include "table_native.h"

#define NUM_CODES (LXF_STAGE_P2D + 1) /* stage codes 0..LXF_STAGE_P2D */
_Static_assert(sizeof(((struct lxf_table *)0)->delivered) == NUM_CODES * sizeof(double),
               "table_native.h's delivered[] must have one entry per LXF_STAGE_* code");

static int grow(void **p, int64_t *room, int64_t need, size_t elem)
{
    if (need <= *room)
        return 0;
    int64_t r = *room > 0 ? *room : 16;
    while (r < need)
        r *= 2;
    void *q = realloc(*p, (size_t)r * elem);
    if (!q)
        return -1;
    *p = q;
    *room = r;
    return 0;
}

/* Room for n flows and nnz entries in every column. */
static int reserve(struct lxf_table *t, int64_t n, int64_t nnz)
{
    if (n > t->room) {
        int64_t r = t->room > 0 ? t->room : 16;
        while (r < n)
            r *= 2;
        double **dcols[] = {&t->remaining, &t->rate, &t->size, &t->arrival, &t->bneck, &t->cap};
        for (size_t i = 0; i < sizeof dcols / sizeof *dcols; i++) {
            double *q = realloc(*dcols[i], (size_t)r * sizeof(double));
            if (!q)
                return -1;
            *dcols[i] = q;
        }
        int64_t **icols[] = {&t->level, &t->queue, &t->dscp, &t->tag};
        for (size_t i = 0; i < sizeof icols / sizeof *icols; i++) {
            int64_t *q = realloc(*icols[i], (size_t)r * sizeof(int64_t));
            if (!q)
                return -1;
            *icols[i] = q;
        }
        int8_t *st = realloc(t->stage, (size_t)r);
        if (!st)
            return -1;
        t->stage = st;
        uint8_t *dd = realloc(t->dead, (size_t)r);
        if (!dd)
            return -1;
        t->dead = dd;
        int64_t *pp = realloc(t->ptr, (size_t)(r + 1) * sizeof(int64_t));
        if (!pp)
            return -1;
        t->ptr = pp;
        t->room = r;
    }
    if (nnz > t->nnz_room) {
        int64_t r = t->nnz_room, r1 = r, r2 = r;
        if (grow((void **)&t->link, &r, nnz, sizeof(int64_t)) || grow((void **)&t->weight, &r1, nnz, sizeof(double))
            || grow((void **)&t->loc, &r2, nnz, sizeof(int32_t)))
            return -1;
        t->nnz_room = r < r1 ? (r < r2 ? r : r2) : (r1 < r2 ? r1 : r2);
    }
    return 0;
}

struct lxf_table *lxf_table_new(int64_t num_links, const double *capacity, int track, double load_window)
{
    struct lxf_table *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->num_links = num_links;
    t->track = track;
    t->load_window = load_window;
    t->load_idle = 1;
    t->removed_min = -1;
    size_t links = (size_t)(num_links > 0 ? num_links : 1);
    t->capacity = malloc(sizeof(double) * links);
    t->load = calloc(links, sizeof(double));
    t->load_t = calloc(links, sizeof(double));
    t->refs = calloc(links, sizeof(int64_t));
    t->used = malloc(sizeof(int64_t) * links);
    t->used_pos = malloc(sizeof(int64_t) * links);
    t->acc = malloc(sizeof(double) * links);
    if (num_links > INT32_MAX || !t->capacity || !t->load || !t->load_t || !t->refs || !t->used || !t->used_pos
        || !t->acc || reserve(t, 16, 64)) {
        lxf_table_free(t);
        return NULL;
    }
    memcpy(t->capacity, capacity, sizeof(double) * (size_t)num_links);
    t->ptr[0] = 0;
    return t;
}

void lxf_table_free(struct lxf_table *t)
{
    if (!t)
        return;
    void *cols[] = {t->remaining, t->rate, t->size, t->arrival, t->bneck, t->cap, t->level, t->queue, t->dscp, t->tag,
                    t->stage, t->dead, t->ptr, t->link, t->weight, t->loc, t->refs, t->used, t->used_pos, t->acc,
                    t->capacity, t->load, t->load_t, t->util_link, t->util, t->rates, t->scratch.map, t->scratch.loc,
                    t->scratch.used, t->scratch.dbl, t->scratch.chr, t->scratch.idx, t->scratch.stamp,
                    t->scratch.touched};
    for (size_t i = 0; i < sizeof cols / sizeof *cols; i++)
        free(cols[i]);
    free(t);
}

/* Link l's average at time at (>= load_t[l]): an idle link (no utilization
 * since load_t[l]) decays over the whole span at once,
 * u + (load - u) exp(-dt / window) with u = 0; load_t[l] == at: as it is. */
static inline double load_at(const struct lxf_table *t, int64_t l, double at)
{
    double v = t->load[l];
    if (t->load_t[l] == at || v == 0.0)
        return v;
    return v * exp(-(at - t->load_t[l]) / t->load_window);
}

/* Append a flow (nothing sent, rate 0, no decision yet).  Its entries must
 * be merged (distinct links, weights > 0) and in range: the engine checks. */
int lxf_table_add(struct lxf_table *t, double size, double arrival, int stage, double bneck, int64_t nnz,
                  const int64_t *link, const double *weight)
{
    int64_t n = t->n, e0 = t->ptr[n];
    if (reserve(t, n + 1, e0 + nnz))
        return -1;
    t->remaining[n] = size;
    t->size[n] = size;
    t->rate[n] = 0.0;
    t->arrival[n] = arrival;
    t->stage[n] = (int8_t)stage;
    t->bneck[n] = bneck;
    t->dead[n] = 0;
    t->level[n] = -1;
    t->cap[n] = INFINITY;
    t->queue[n] = -1;
    t->dscp[n] = 0;
    t->tag[n] = -1;
    memcpy(t->link + e0, link, sizeof(int64_t) * (size_t)nnz);
    memcpy(t->weight + e0, weight, sizeof(double) * (size_t)nnz);
    for (int64_t e = 0; e < nnz; e++) {
        int64_t l = link[e];
        if (!isfinite(weight[e]))
            t->odd_weight = 1;
        if (t->track) { /* an idle link's average brought up to now: the links in use hold theirs at clock */
            t->load[l] = load_at(t, l, t->clock);
            t->load_t[l] = t->clock;
        }
        t->loc[e0 + e] = (int32_t)l;
        if (t->refs[l]++ == 0) {
            t->used_pos[l] = t->nused;
            t->used[t->nused++] = l;
        }
    }
    t->ptr[n + 1] = e0 + nnz;
    t->n = n + 1;
    return 0;
}

/* Bytes sent from the last event over dt seconds: sent = min(rate * dt,
 * remaining) per flow, summed per stage in flow order from 0.0 and added to
 * delivered; then the link-load average (module doc of engine.py). */
void lxf_table_advance(struct lxf_table *t, double dt, double now)
{
    if (!(dt > 0))
        return;
    double before = t->clock;
    t->clock = now;
    int64_t n = t->n;
    if (n) {
        double by_stage[NUM_CODES] = {0.0};
        double *remaining = t->remaining, *rate = t->rate;
        for (int64_t i = 0; i < n; i++) {
            double left = remaining[i], sent = rate[i] * dt;
            if (!(sent <= left))
                sent = left;
            remaining[i] = left - sent;
            by_stage[t->stage[i]] += sent;
        }
        for (int c = 0; c < NUM_CODES; c++)
            t->delivered[c] += by_stage[c];
    }
    if (t->load_idle || !t->track)
        return;
    /* load <- util + (load - util) * decay on the links in use at the last
     * allocation (each once); the others are idle and keep their value and
     * time until read (load_at), or until a flow arrives on one. */
    double decay = exp(-dt / t->load_window);
    int64_t m = t->nutil;
    double *load = t->load;
    for (int64_t e = 0; e < m; e++) {
        int64_t l = t->util_link[e];
        double old = load_at(t, l, before), u = t->util[e];
        load[l] = u + (old - u) * decay;
        t->load_t[l] = now;
    }
}

/* The live flows whose last bytes are in at now: their remaining bytes are
 * delivered, their rate set to 0 and they are marked dead (compacted out
 * later).  Writes their positions to out (room for n) and returns how many;
 * *low gets the lowest level among them (-1 before any decision). */
int64_t lxf_table_complete(struct lxf_table *t, double now, double rel_eps, double time_eps, int64_t *out,
                           int64_t *low)
{
    double scale = fabs(now) > 1.0 ? fabs(now) : 1.0;
    int64_t k = 0;
    for (int64_t i = 0; i < t->n; i++) {
        double left = t->remaining[i];
        if (!t->dead[i] && (left <= t->size[i] * rel_eps || left <= t->rate[i] * time_eps * scale))
            out[k++] = i;
    }
    if (!k)
        return 0;
    double by_stage[NUM_CODES] = {0.0};
    int64_t lo = INT64_MAX;
    for (int64_t j = 0; j < k; j++) {
        int64_t i = out[j];
        by_stage[t->stage[i]] += t->remaining[i];
        t->remaining[i] = 0.0;
        t->rate[i] = 0.0;
        t->dead[i] = 1;
        if (t->level[i] < lo)
            lo = t->level[i];
    }
    for (int c = 0; c < NUM_CODES; c++)
        t->delivered[c] += by_stage[c];
    if (lo >= 0)
        t->removed_min = (t->removed_min < 0 || lo < t->removed_min) ? lo : t->removed_min;
    *low = lo;
    return k;
}

/* Drop the dead flows, keeping the order of the rest. */
void lxf_table_compact(struct lxf_table *t)
{
    int64_t j = 0, e = 0;
    for (int64_t i = 0; i < t->n; i++) {
        if (t->dead[i]) {
            for (int64_t e = t->ptr[i]; e < t->ptr[i + 1]; e++) {
                int64_t l = t->link[e];
                if (--t->refs[l] == 0) {  /* out of the used links: the last one takes its place */
                    int64_t p = t->used_pos[l], last = t->used[--t->nused];
                    t->used[p] = last;
                    t->used_pos[last] = p;
                }
            }
            continue;
        }
        int64_t a = t->ptr[i], b = t->ptr[i + 1];
        if (j != i) {
            t->remaining[j] = t->remaining[i];
            t->rate[j] = t->rate[i];
            t->size[j] = t->size[i];
            t->arrival[j] = t->arrival[i];
            t->bneck[j] = t->bneck[i];
            t->cap[j] = t->cap[i];
            t->level[j] = t->level[i];
            t->queue[j] = t->queue[i];
            t->dscp[j] = t->dscp[i];
            t->tag[j] = t->tag[i];
            t->stage[j] = t->stage[i];
            t->dead[j] = 0;
        }
        if (e != a) {
            memmove(t->link + e, t->link + a, sizeof(int64_t) * (size_t)(b - a));
            memmove(t->weight + e, t->weight + a, sizeof(double) * (size_t)(b - a));
            memmove(t->loc + e, t->loc + a, sizeof(int32_t) * (size_t)(b - a));
        }
        t->ptr[j] = e;
        e += b - a;
        j++;
    }
    t->ptr[j] = e;
    t->n = j;
}

/* Time from now to the next completion: min(remaining / rate) over the
 * flows that move; -1 when none does. */
double lxf_table_next(const struct lxf_table *t)
{
    double best = -1.0;
    int any = 0;
    for (int64_t i = 0; i < t->n; i++) {
        double r = t->rate[i];
        if (r > 0) {
            double d = t->remaining[i] / r;
            if (!any || d < best) {
                best = d;
                any = 1;
            }
        }
    }
    return best;
}

/* No live flow: the utilization is all 0 and no removal is pending. */
void lxf_table_idle(struct lxf_table *t)
{
    t->nutil = 0;
    t->removed_min = -1;
}

/* Take a decision for the n live flows (the first ``kept`` had one before):
 * checks it (returns LXF_BAD_LEVEL/CAP/QUEUE/DSCP), stores it, and says
 * what changed, for the Flow objects: the positions whose level changed in
 * changed[0..out[0]), whose cap changed in changed[n..n+out[2]), whose queue
 * or DSCP changed in changed[2n..2n+out[3]) (new flows in all three); and
 * in out[1] the level from which rates must be recomputed (-1: none, rates
 * stay).  cap NULL: no caps.  Rates are then set by lxf_table_allocate (or
 * by the caller). */
int lxf_table_decide(struct lxf_table *t, int64_t kept, const int64_t *level, const double *cap,
                     const int64_t *queue, const uint8_t *dscp, int64_t *changed, int64_t *out)
{
    int64_t n = t->n;
    for (int64_t i = 0; i < n; i++) {
        if (level[i] < 0)
            return LXF_BAD_LEVEL;
        if (cap && !(cap[i] >= 0))
            return LXF_BAD_CAP;
        if (queue[i] < 0)
            return LXF_BAD_QUEUE;
        if (dscp[i] > 63)
            return LXF_BAD_DSCP;
    }
    int64_t touched = INT64_MAX, nl = 0, nc = 0, nq = 0;
    int64_t *lv = changed, *cp = changed + n, *qd = changed + 2 * n;
    for (int64_t i = 0; i < n; i++) {
        double c = cap ? cap[i] : INFINITY;
        int64_t old = t->level[i];
        int fresh = i >= kept, level_moved = fresh || level[i] != old, cap_moved = fresh || c != t->cap[i];
        if (level_moved || cap_moved) {
            if (level[i] < touched)
                touched = level[i];
            if (old >= 0 && old < touched)
                touched = old;
        }
        if (level_moved)
            lv[nl++] = i;
        if (cap_moved)
            cp[nc++] = i;
        if (fresh || queue[i] != t->queue[i] || (int64_t)dscp[i] != t->dscp[i])
            qd[nq++] = i;
        t->level[i] = level[i];
        t->cap[i] = c;
        t->queue[i] = queue[i];
        t->dscp[i] = dscp[i];
    }
    if (t->removed_min >= 0 && t->removed_min < touched)
        touched = t->removed_min;
    t->removed_min = -1;
    out[0] = nl;
    out[1] = touched == INT64_MAX ? -1 : touched;
    out[2] = nc;
    out[3] = nq;
    return 0;
}

/* Rates of the live flows for the decision just taken, recomputed from
 * from_level on (allocator.allocate), then the entries' utilization for the
 * link-load average when it is kept. */
int lxf_table_allocate(struct lxf_table *t, int64_t from_level, double rel_below, double rel_above, double sat_eps)
{
    int64_t n = t->n;
    int64_t room = t->rates_room;
    if (grow((void **)&t->rates, &room, n, sizeof(double)))
        return -1;
    t->rates_room = room;
    if (n == 0)
        return 0;
    /* Each link is its own slot in the per-link scratch (no map per call). */
    int64_t nnz = t->ptr[n], slots = nnz > t->num_links ? nnz : t->num_links;
    if (lxf_scratch_reserve(&t->scratch, 1, slots, n))
        return -1;
    lxf_allocate_mapped(&t->scratch, n, t->ptr, t->loc, t->weight, t->level, t->cap, t->capacity, t->used, t->used,
                        t->nused, t->num_links, 1, from_level, t->rate, rel_below, rel_above, sat_eps, t->rates);
    memcpy(t->rate, t->rates, sizeof(double) * (size_t)n);
    return lxf_table_util(t);
}

/* The utilization of the links in use at the current rates (Usage.link_load(rate)[link] /
 * capacity[link]), kept for the link-load average; nothing when the average is not kept. */
int lxf_table_util(struct lxf_table *t)
{
    if (!t->track)
        return 0;
    int64_t n = t->n, m = t->nused;
    int64_t r1 = t->util_room, r2 = t->util_room;
    if (grow((void **)&t->util_link, &r1, m, sizeof(int64_t)) || grow((void **)&t->util, &r2, m, sizeof(double)))
        return -1;
    t->util_room = r1 < r2 ? r1 : r2;
    /* Per link the sum of weight * rate in entry order from 0.0 (np.bincount).
     * A flow at rate 0 adds w * 0 = +-0.0 to each of its links, which leaves
     * every sum as it is (a sum from 0.0 is never -0.0), so it is skipped,
     * unless some weight is not finite (inf * 0 is NaN): strict priority
     * leaves many flows at rate 0. */
    double *acc = t->acc;
    const double *rate = t->rate;
    for (int64_t j = 0; j < m; j++)
        acc[t->used[j]] = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (rate[i] == 0.0 && !t->odd_weight)
            continue;
        for (int64_t e = t->ptr[i]; e < t->ptr[i + 1]; e++)
            acc[t->link[e]] += t->weight[e] * rate[i];
    }
    /* Once per link in use (its entries would repeat the same value). */
    for (int64_t j = 0; j < m; j++) {
        int64_t l = t->used[j];
        t->util_link[j] = l;
        t->util[j] = acc[l] / t->capacity[l];
    }
    t->nutil = m;
    t->load_idle = 0;
    return 0;
}

/* One recompute after the policy's decision, in one call: lxf_table_decide,
 * then (native) lxf_table_allocate when some level must be recomputed, then
 * lxf_table_next.  changed[] (room 3n) and out[4] as lxf_table_decide
 * gives them; *next: lxf_table_next, or -1 without native (the caller
 * allocates first, then asks). */
int lxf_table_apply(struct lxf_table *t, int64_t kept, const int64_t *level, const double *cap, const int64_t *queue,
                    const uint8_t *dscp, int64_t *changed, int64_t *out, int native, double rel_below,
                    double rel_above, double sat_eps, double *next)
{
    int rc = lxf_table_decide(t, kept, level, cap, queue, dscp, changed, out);
    *next = -1.0;
    if (rc || !native)
        return rc;
    if (out[1] >= 0 && (rc = lxf_table_allocate(t, out[1], rel_below, rel_above, sat_eps)))
        return rc;
    *next = lxf_table_next(t);
    return 0;
}

/* The link-load average clipped to [0, 1] (np.minimum(np.maximum(load, 0), 1):
 * NaN stays NaN), into out[num_links]. */
void lxf_table_load_clipped(const struct lxf_table *t, double *out)
{
    for (int64_t l = 0; l < t->num_links; l++) {
        double v = load_at(t, l, t->clock);
        v = (v >= 0.0 || v != v) ? v : 0.0;
        out[l] = (v <= 1.0 || v != v) ? v : 1.0;
    }
}

/* The link-load average now (at the last advance), as it is, into out[num_links]. */
void lxf_table_load_now(const struct lxf_table *t, double *out)
{
    for (int64_t l = 0; l < t->num_links; l++)
        out[l] = load_at(t, l, t->clock);
}
