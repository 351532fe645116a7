/* The network engine's rate allocation in C: the same algorithm as
 * laxflow/sim/network/allocator.py (strict priority across levels,
 * weighted max-min by rounds of local-minimum freezing inside one level,
 * saturation snapping), doing every float operation the NumPy code does in
 * the same order, so the rates are bit-identical (tests compare the paths).
 *
 * Called through cffi (laxflow.sim.network._allocate_native, built by
 * allocate_build.py at install) by allocator.allocate, on the caller's
 * thread; it keeps no state between calls.  Compiled with
 * -ffp-contract=off: a fused multiply-add would round differently.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "table_native.h"

/* np.maximum / np.minimum on doubles: NaN from either operand propagates. */
static inline double np_max(double a, double b) { return (a >= b || a != a) ? a : b; }
static inline double np_min(double a, double b) { return (a <= b || a != a) ? a : b; }

struct work {
    const int64_t *start;   /* per flow: first entry */
    const int64_t *count;   /* per flow: entries */
    const int32_t *loc;     /* per entry: local link index */
    const double *weight;   /* per entry */
    double *residual;       /* per local link */
    double *load;           /* per local link, scratch */
    double *share;          /* per local link, scratch */
    double *sum;            /* per local link, scratch */
    char *blocked;          /* per local link, scratch */
    int64_t *alive;         /* per flow, scratch */
    double *best;           /* per flow, scratch */
    char *freeze;           /* per flow, scratch */
    double below, above;    /* 1 - REL_EPS, 1 + REL_EPS */
    int64_t *stamp;         /* per local link: the round that last touched it (see water_fill) */
    int32_t *touched;       /* the local links a round touches, in first-touch order (scratch) */
    int64_t *round;         /* the last round number handed out (kept across calls) */
    const double *limit;    /* per local link: the residual below which it is saturated */
};

/* allocator.water_fill for the k flows ``flows`` (global indices, in order):
 * writes rates[flows[i]], lowers residual.  Returns 1 when it also did the
 * caller's _snap_saturated on the flows' links (one flow, or every flow
 * frozen in the first round: each link's residual then changes once, and
 * is snapped right after), 0 when the caller must. */
static int water_fill(struct work *w, int64_t k, const int64_t *flows, const double *cap, double *rates)
{
    const int64_t *start = w->start, *count = w->count;
    const int32_t *loc = w->loc;
    const double *weight = w->weight;
    double *residual = w->residual;
    const double *limit = w->limit;
    if (k == 0)
        return 1;
    if (k == 1) {
        int64_t f = flows[0], a = start[f], b = a + count[f];
        double share = residual[loc[a]] / weight[a];
        for (int64_t e = a + 1; e < b; e++)
            share = np_min(share, residual[loc[e]] / weight[e]);
        double c = cap[f];
        double m = (c < share) ? c : share;   /* Python min(share, c) */
        double r = (m > 0.0) ? m : 0.0;       /* Python max(0.0, m) */
        rates[f] = r;
        for (int64_t e = a; e < b; e++) {  /* a flow's links are distinct */
            double left = np_max(residual[loc[e]] - weight[e] * r, 0.0);
            residual[loc[e]] = left <= limit[loc[e]] ? 0.0 : left;
        }
        return 1;
    }
    int64_t *alive = w->alive;
    double *best = w->best, *load = w->load, *share = w->share, *sum = w->sum;
    char *blocked = w->blocked, *freeze = w->freeze;
    int capped = 0;
    for (int64_t i = 0; i < k; i++) {
        alive[i] = flows[i];
        if (isfinite(cap[flows[i]]))
            capped = 1;
    }
    int64_t *stamp = w->stamp;
    int64_t m = k;
    for (int first = 1;; first = 0) {
        /* np.bincount of the weights: in entry order, from 0.0 (0.0 + w is w,
         * so a link's first entry this round sets it), with the link's other
         * per-round scratch reset there too; and the residual clamped at 0
         * (np.maximum(residual, 0) before the rounds: a no-op once done). */
        int64_t round = ++*w->round, nt = 0;
        int32_t *touched = w->touched;
        for (int64_t i = 0; i < m; i++) {
            int64_t f = alive[i];
            for (int64_t e = start[f]; e < start[f] + count[f]; e++) {
                int32_t l = loc[e];
                if (stamp[l] != round) {
                    stamp[l] = round;
                    touched[nt++] = l;
                    load[l] = weight[e];
                    blocked[l] = 0;
                    sum[l] = 0.0;
                    residual[l] = np_max(residual[l], 0.0);
                } else {
                    load[l] += weight[e];
                }
            }
        }
        /* Each link's share, once per link (flows share links); load then
         * holds the share times 1 - REL_EPS, the bar a flow's best must
         * reach on the link not to block it. */
        double *bar = load;
        for (int64_t j = 0; j < nt; j++) {
            int32_t l = touched[j];
            share[l] = residual[l] / load[l];  /* load > 0: weights are > 0 */
            bar[l] = share[l] * w->below;
        }
        for (int64_t i = 0; i < m; i++) {  /* np.minimum.reduceat of the shares, then the cap */
            int64_t f = alive[i], a = start[f];
            double b = share[loc[a]];
            for (int64_t e = a + 1; e < a + count[f]; e++)
                b = np_min(b, share[loc[e]]);
            if (capped)
                b = np_min(b, cap[f]);
            best[i] = b;
        }
        for (int64_t i = 0; i < m; i++) {
            int64_t f = alive[i];
            for (int64_t e = start[f]; e < start[f] + count[f]; e++)
                if (best[i] < bar[loc[e]])
                    blocked[loc[e]] = 1;
        }
        int all = 1;
        for (int64_t i = 0; i < m; i++) {
            int64_t f = alive[i];
            char fr = 0;
            for (int64_t e = start[f]; e < start[f] + count[f]; e++)
                if (!blocked[loc[e]]) {
                    fr = 1;
                    break;
                }
            if (capped && cap[f] <= best[i] * w->above)
                fr = 1;
            freeze[i] = fr;
            if (!fr)
                all = 0;
        }
        for (int64_t i = 0; i < m; i++) {  /* np.bincount of the frozen entries' w * best */
            if (!freeze[i])
                continue;
            int64_t f = alive[i];
            rates[f] = best[i];
            for (int64_t e = start[f]; e < start[f] + count[f]; e++)
                sum[loc[e]] += weight[e] * best[i];
        }
        /* The residuals, once per link.  Over every link the round touched:
         * one no frozen flow crosses has sum 0 and a residual already >= 0
         * (or NaN), which this leaves as it is, and is never snapped (that
         * needs every flow frozen). */
        for (int64_t j = 0; j < nt; j++) {
            int32_t l = touched[j];
            double left = np_max(residual[l] - sum[l], 0.0);
            residual[l] = (first && all && left <= limit[l]) ? 0.0 : left;  /* snapped: see above */
        }
        if (all)
            return first;
        int64_t j = 0;
        for (int64_t i = 0; i < m; i++)
            if (!freeze[i])
                alive[j++] = alive[i];
        m = j;
    }
}

/* Buffers for an allocation of ``flows`` flows with ``entries`` entries
 * over ``links`` links, grown as needed; map stays all -1 between calls. */
int lxf_scratch_reserve(struct lxf_scratch *s, int64_t links, int64_t entries, int64_t flows)
{
    if (links < 1)
        links = 1;
    if (entries < 1)
        entries = 1;
    if (flows < 1)
        flows = 1;
    if (links > s->links) {
        int32_t *m = realloc(s->map, sizeof(int32_t) * (size_t)links);
        if (!m)
            return -1;
        memset(m, 0xff, sizeof(int32_t) * (size_t)links);
        s->map = m;
        s->links = links;
    }
    if (entries > s->stamps) {  /* one stamp per slot (slots <= entries), new ones never a round number */
        int64_t e = 2 * entries;
        int64_t *st = realloc(s->stamp, sizeof(int64_t) * (size_t)e);
        if (!st)
            return -1;
        memset(st + s->stamps, 0, sizeof(int64_t) * (size_t)(e - s->stamps));
        s->stamp = st;
        s->stamps = e;
    }
    if (entries > s->entries || flows > s->flows) {
        int64_t e = entries > s->entries ? 2 * entries : s->entries, f = flows > s->flows ? 2 * flows : s->flows;
        int32_t *loc = realloc(s->loc, sizeof(int32_t) * (size_t)e);
        if (loc)
            s->loc = loc;
        int64_t *used = realloc(s->used, sizeof(int64_t) * (size_t)e);
        if (used)
            s->used = used;
        double *dbl = realloc(s->dbl, sizeof(double) * (size_t)(5 * e + f + 1));
        if (dbl)
            s->dbl = dbl;
        char *chr = realloc(s->chr, (size_t)(e + f + 1));
        if (chr)
            s->chr = chr;
        int64_t *idx = realloc(s->idx, sizeof(int64_t) * (size_t)(3 * f + 1));
        if (idx)
            s->idx = idx;
        int32_t *touched = realloc(s->touched, sizeof(int32_t) * (size_t)e);
        if (touched)
            s->touched = touched;
        if (!loc || !used || !dbl || !chr || !idx || !touched)
            return -1;
        s->entries = e;
        s->flows = f;
    }
    return 0;
}

/* allocator.allocate: rates[n] of all flows.  from_level < 0 with
 * has_from = 0: recompute every level; prev_rate may be NULL.  Returns 0, or
 * -1 when out of memory or -2 for a link out of range (the caller then
 * takes the NumPy path, which raises for the latter). */
int lxf_allocate(int64_t n, const int64_t *ptr, const int64_t *link, const double *weight, const int64_t *level,
                 const double *cap, const double *capacity, int64_t num_links, int has_from, int64_t from_level,
                 const double *prev_rate, double rel_below, double rel_above, double sat_eps, double *rates)
{
    struct lxf_scratch s;
    memset(&s, 0, sizeof s);
    int rc = lxf_allocate_scratch(&s, n, ptr, link, weight, level, cap, capacity, num_links, has_from, from_level,
                                  prev_rate, rel_below, rel_above, sat_eps, rates);
    free(s.map);
    free(s.stamp);
    free(s.loc);
    free(s.used);
    free(s.dbl);
    free(s.chr);
    free(s.idx);
    free(s.touched);
    return rc;
}

/* lxf_allocate on the buffers of s (kept by the caller between calls). */
int lxf_allocate_scratch(struct lxf_scratch *s, int64_t n, const int64_t *ptr, const int64_t *link,
                         const double *weight, const int64_t *level, const double *cap, const double *capacity,
                         int64_t num_links, int has_from, int64_t from_level, const double *prev_rate,
                         double rel_below, double rel_above, double sat_eps, double *rates)
{
    int64_t nnz = ptr[n];
    if (n == 0)
        return 0;
    if (lxf_scratch_reserve(s, num_links, nnz, n))
        return -1;
    int32_t *map = s->map, *loc = s->loc;
    int64_t *used = s->used;
    int32_t nloc = 0;
    for (int64_t e = 0; e < nnz; e++) {
        int64_t l = link[e];
        if (l < 0 || l >= num_links) {  /* the NumPy path raises the IndexError */
            for (int32_t j = 0; j < nloc; j++)
                map[used[j]] = -1;
            return -2;
        }
        if (map[l] < 0) {
            map[l] = nloc;
            used[nloc++] = l;
        }
        loc[e] = map[l];
    }
    for (int32_t j = 0; j < nloc; j++)  /* map is all -1 again for the next call */
        map[used[j]] = -1;
    lxf_allocate_mapped(s, n, ptr, loc, weight, level, cap, capacity, used, NULL, nloc, nnz, has_from, from_level,
                        prev_rate, rel_below, rel_above, sat_eps, rates);
    return 0;
}

/* The allocation once every entry has its link's slot loc[e] in the
 * per-link scratch arrays (slot_room of them): the nslots slots in use are
 * slot[j] (NULL: j), holding link capidx[j].  s must have room for n flows,
 * slot_room slots and ptr[n] entries. */
void lxf_allocate_mapped(struct lxf_scratch *s, int64_t n, const int64_t *ptr, const int32_t *loc,
                         const double *weight, const int64_t *level, const double *cap, const double *capacity,
                         const int64_t *capidx, const int64_t *slot, int64_t nslots, int64_t slot_room, int has_from,
                         int64_t from_level, const double *prev_rate, double rel_below, double rel_above,
                         double sat_eps, double *rates)
{
    int64_t *idx = s->idx;
    double *dbl = s->dbl;
    char *chr = s->chr;
    int64_t m = slot_room;
    double *residual = dbl, *limit = dbl + m, *load = dbl + 2 * m, *share = dbl + 3 * m, *sum = dbl + 4 * m;
    double *best = dbl + 5 * m;
    int64_t *order = idx, *alive = idx + n, *count = idx + 2 * n;
    for (int64_t j = 0; j < nslots; j++) {
        int64_t l = slot ? slot[j] : j;
        residual[l] = capacity[capidx[j]];
        limit[l] = capacity[capidx[j]] * sat_eps;
    }
    for (int64_t i = 0; i < n; i++) {
        count[i] = ptr[i + 1] - ptr[i];
        rates[i] = 0.0;
    }
    struct work w = {ptr, count, loc, weight, residual, load, share, sum, chr, alive, best, chr + m,
                     rel_below, rel_above, s->stamp, s->touched, &s->round, limit};
    int64_t lowest = level[0], highest = level[0];
    for (int64_t i = 1; i < n; i++) {
        if (level[i] < lowest)
            lowest = level[i];
        if (level[i] > highest)
            highest = level[i];
    }
    if (has_from && from_level <= lowest)
        has_from = 0;
    /* Stable order by level (np.argsort kind="stable"): a counting sort when
     * the levels span at most n values (a policy's dense levels: mfs has a
     * few per decision), else a bottom-up merge sort; both give the one
     * stable order. */
    for (int64_t i = 0; i < n; i++)
        order[i] = i;
    if (lowest != highest && (uint64_t)highest - (uint64_t)lowest < (uint64_t)n) {
        int64_t span = highest - lowest + 1, *start_of = alive; /* (alive: n slots of scratch, span <= n) */
        memset(start_of, 0, sizeof(int64_t) * (size_t)span);
        for (int64_t i = 0; i < n; i++)
            start_of[level[i] - lowest]++;
        for (int64_t v = 0, at = 0; v < span; v++) {
            int64_t c = start_of[v];
            start_of[v] = at;
            at += c;
        }
        for (int64_t i = 0; i < n; i++)
            order[start_of[level[i] - lowest]++] = i;
    } else if (lowest != highest) {
        int64_t *src = order, *dst = alive;
        for (int64_t width = 1; width < n; width *= 2) {
            for (int64_t lo = 0; lo < n; lo += 2 * width) {
                int64_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
                int64_t p = lo, q = mid, o = lo;
                while (p < mid && q < hi)
                    dst[o++] = level[src[q]] < level[src[p]] ? src[q++] : src[p++];
                while (p < mid)
                    dst[o++] = src[p++];
                while (q < hi)
                    dst[o++] = src[q++];
            }
            int64_t *t = src;
            src = dst;
            dst = t;
        }
        if (src != order)
            memcpy(order, src, sizeof(int64_t) * (size_t)n);
    }
    int64_t first = 0;
    if (has_from && prev_rate) {
        for (int64_t j = 0; j < nslots; j++)
            sum[slot ? slot[j] : j] = 0.0;
        for (int64_t i = 0; i < n; i++) {  /* link_load of the kept levels, in entry order */
            double r = level[i] < from_level ? prev_rate[i] : 0.0;
            if (level[i] < from_level)
                rates[i] = prev_rate[i];
            for (int64_t e = ptr[i]; e < ptr[i + 1]; e++)
                sum[loc[e]] += weight[e] * r;
        }
        for (int64_t j = 0; j < nslots; j++) {
            int64_t l = slot ? slot[j] : j;
            residual[l] = residual[l] - sum[l];
            if (residual[l] <= limit[l])
                residual[l] = 0.0;
        }
        while (first < n && level[order[first]] < from_level)
            first++;
    }
    int64_t a = first;
    while (a < n) {
        int64_t b = a + 1;
        while (b < n && level[order[b]] == level[order[a]])
            b++;
        if (!water_fill(&w, b - a, order + a, cap, rates)) {
            for (int64_t i = a; i < b; i++) {  /* _snap_saturated on the level's links */
                int64_t f = order[i];
                for (int64_t e = ptr[f]; e < ptr[f + 1]; e++)
                    if (residual[loc[e]] <= limit[loc[e]])
                        residual[loc[e]] = 0.0;
            }
        }
        a = b;
    }
}
