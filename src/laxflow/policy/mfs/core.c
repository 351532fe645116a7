/* The mfs policy's decision step (see core.h): the reference
 * MfsPolicy.decide in C, one flow at a time.  Every float operation is the
 * reference's, in its order (NumPy's per-element rules spelled out where NaN
 * or -0.0 could tell them apart). */
#include "core.h"
#include "laxflow_shm.h" /* the one stage table: LXF_STAGE_* (laxflow.stage reads the same header) */

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct key {
    int64_t q, e, u, r; /* arbitration.engine_levels' key: queue, explicit, RLI, RED rank */
    int64_t pos;
};

/* *p resized to bytes (kept as it was when that fails); 0 or -1. */
static int resize(void **p, size_t bytes)
{
    void *q = realloc(*p, bytes);
    if (!q)
        return -1;
    *p = q;
    return 0;
}

static int grow_links(struct lxf_mfs *m)
{
    if (m->scratch_links >= m->num_links)
        return 0;
    size_t n = (size_t)m->num_links;
    if (resize((void **)&m->sent, sizeof(double) * n) || resize((void **)&m->has_sent, n)
        || resize((void **)&m->touched, sizeof(int64_t) * n) || resize((void **)&m->nonzero, sizeof(int64_t) * n)
        || resize((void **)&m->in_nonzero, n))
        return -1;
    memset(m->has_sent, 0, n);
    m->scratch_links = m->num_links;
    m->nonzero_valid = 0;
    return 0;
}

/* The list of links whose average is not 0.0, from the array (after a re-bind). */
static void list_nonzero(struct lxf_mfs *m)
{
    m->num_nonzero = 0;
    for (int64_t l = 0; l < m->num_links; l++) {
        m->in_nonzero[l] = m->explicit_load[l] != 0.0;
        if (m->in_nonzero[l])
            m->nonzero[m->num_nonzero++] = l;
    }
    m->nonzero_valid = 1;
}

static int grow_flows(struct lxf_mfs *m, int64_t n)
{
    if (m->scratch_flows >= n)
        return 0;
    int64_t room = n > 2 * m->scratch_flows ? n : 2 * m->scratch_flows;
    if (resize(&m->keys, sizeof(struct key) * (size_t)room) || resize((void **)&m->is_new, (size_t)room))
        return -1;
    m->scratch_flows = room;
    return 0;
}

/* The per-slot progress arrays cover the slot arrays (new slots: no layer, not done). */
static int grow_seen(struct lxf_mfs *m)
{
    if (m->seen_room >= m->slots)
        return 0;
    if (resize((void **)&m->seen_layer, sizeof(double) * (size_t)m->slots)
        || resize((void **)&m->seen_done, (size_t)m->slots))
        return -1;
    for (int64_t s = m->seen_room; s < m->slots; s++) {
        m->seen_layer[s] = NAN;
        m->seen_done[s] = 0;
    }
    m->seen_room = m->slots;
    return 0;
}

void lxf_mfs_free(struct lxf_mfs *m)
{
    free(m->seen_layer);
    free(m->seen_done);
    m->seen_layer = NULL;
    m->seen_done = NULL;
    m->seen_room = 0;
    free(m->sent);
    free(m->has_sent);
    free(m->touched);
    free(m->nonzero);
    free(m->in_nonzero);
    free(m->keys);
    free(m->is_new);
    m->sent = NULL;
    m->has_sent = NULL;
    m->touched = NULL;
    m->nonzero = NULL;
    m->in_nonzero = NULL;
    m->keys = NULL;
    m->is_new = NULL;
    m->scratch_links = m->scratch_flows = 0;
}

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

/* Python's max(a, b) and min(a, b) for two floats: the first unless the
 * second compares strictly beyond it (NaN first stays). */
static double py_max(double a, double b) { return b > a ? b : a; }
static double py_min(double a, double b) { return b < a ? b : a; }

/* MfsPolicy._candidates for one flow: the urgency flow i (slot s) would have now. */
static int64_t candidate(const struct lxf_mfs *m, int64_t s, double current, double remaining,
                         const double *link_load, int clip_load, double now, int *infeasible)
{
    int64_t k = m->levels;
    if (!m->explicit_[s]) {
        if (m->stage[s] == LXF_STAGE_COLLECTIVE)
            return 0;
        if (m->stage[s] == LXF_STAGE_P2D)
            return k - 1;
        double diff = m->target[s] - current;
        if (isnan(diff))
            return k - 1;
        double x = py_min(py_max(diff, 0.0), (double)(k - 1));
        return (int64_t)x;
    }
    int64_t link = m->bneck_link[s];
    double load = link_load[link];
    if (clip_load) { /* as the engine's snapshot column: [0, 1], NaN kept (lxf_table_load_clipped) */
        load = (load >= 0.0 || load != load) ? load : 0.0;
        load = (load <= 1.0 || load != load) ? load : 1.0;
    }
    double rho = load - m->explicit_load[link];
    rho = py_min(py_max(rho, 0.0), 1.0);
    double residual = (m->due[s] - now) * m->bneck_rate[s] * (1.0 - rho);
    double mlu = residual > 0 ? remaining / residual : INFINITY;
    if (mlu > 1.0)
        *infeasible = 1;
    return m->num_thresholds - bisect_right(m->thresholds, m->num_thresholds, mlu);
}

static int64_t queue_of_one(int64_t u, int explicit_, int64_t k) { return explicit_ ? u : (u + 1 < k - 1 ? u + 1 : k - 1); }

/* Whether flow i (slot s, not new) may change level now: rmlq.eligible. */
static int eligible(const struct lxf_mfs *m, int64_t s, double current, int done, int64_t tick)
{
    if (m->urgency[s] <= 0)
        return 0;
    double cur = current != current ? -INFINITY : current;
    return cur > m->layer_at[s] || (m->explicit_[s] && done && tick > m->tick_at[s]);
}

/* MfsPolicy._measure_explicit_load: the moving average of explicit traffic, from the bytes live explicit flows moved. */
static void measure(struct lxf_mfs *m, int64_t n, const int64_t *slot, const double *remaining, double dt,
                    const int64_t *finished, int64_t n_finished)
{
    double *sent = m->sent, *load = m->explicit_load, *done = m->finished_bytes;
    uint8_t *has = m->has_sent;
    int64_t nt = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = slot[i];
        if (!m->explicit_[s] || m->is_new[i])
            continue;
        int64_t link = m->bneck_link[s];
        double prev = 0.0;
        if (has[link])
            prev = sent[link];
        else {
            has[link] = 1;
            m->touched[nt++] = link;
        }
        sent[link] = prev + (m->last_rem[s] - remaining[i]) * m->bneck_weight[s];
    }
    double decay = exp(-dt / m->load_window);
    for (int64_t j = 0; j < n_finished; j++) { /* the union: finished links not in sent, moved 0.0 + done */
        int64_t link = finished[j];
        if (!has[link]) {
            has[link] = 1;
            sent[link] = 0.0;
            m->touched[nt++] = link;
        }
    }
    for (int64_t j = 0; j < nt; j++) { /* the new value of each link that moved, from its old average */
        int64_t link = m->touched[j];
        double moved = n_finished ? sent[link] + done[link] : sent[link];
        double span = m->capacity[link] * dt;
        double util;
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
    /* load *= decay on every link: 0.0 (or -0.0) stays as it is, so only the
     * listed links; one that reaches 0.0 leaves the list. */
    if (!m->nonzero_valid)
        list_nonzero(m);
    for (int64_t j = 0; j < m->num_nonzero;) {
        int64_t l = m->nonzero[j];
        load[l] *= decay;
        if (load[l] == 0.0) {
            m->in_nonzero[l] = 0;
            m->nonzero[j] = m->nonzero[--m->num_nonzero];
        } else
            j++;
    }
    for (int64_t j = 0; j < nt; j++) {
        int64_t link = m->touched[j];
        load[link] = sent[link];
        has[link] = 0;
        if (load[link] != 0.0 && !m->in_nonzero[link]) {
            m->in_nonzero[link] = 1;
            m->nonzero[m->num_nonzero++] = link;
        }
    }
    for (int64_t j = 0; j < n_finished; j++)
        done[finished[j]] = 0.0;
}

/* A key packed into one word where its fields fit (q, u < 256, e in {0, 1},
 * 0 <= r < 2^46): the words order as the keys do. */
struct pkey {
    uint64_t k;
    int64_t pos;
};

#define PK_R_BITS 46

static void pkey_insertion(struct pkey *a, int64_t n)
{
    for (int64_t j = 1; j < n; j++) {
        struct pkey x = a[j];
        int64_t i = j - 1;
        while (i >= 0 && a[i].k > x.k) {
            a[i + 1] = a[i];
            i--;
        }
        a[i + 1] = x;
    }
}

/* Quicksort by k (Hoare partition: runs of equal keys split evenly), the
 * smaller side first so the stack stays O(log n); not stable (equal keys
 * get equal levels whatever their order). */
static void pkey_sort(struct pkey *a, int64_t n)
{
    while (n > 24) {
        uint64_t x = a[0].k, y = a[n / 2].k, z = a[n - 1].k; /* median of three */
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
            struct pkey t = a[i];
            a[i] = a[j];
            a[j] = t;
        }
        int64_t left = j + 1; /* a[0..j] <= pivot <= a[j+1..n) */
        if (left < n - left) {
            pkey_sort(a, left);
            a += left;
            n -= left;
        } else {
            pkey_sort(a + left, n - left);
            n = left;
        }
    }
    pkey_insertion(a, n);
}

static int key_cmp(const void *pa, const void *pb)
{
    const struct key *a = pa, *b = pb;
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

/* level[pos] = the dense rank of each flow's key (equal keys, equal levels). */
static void dense_levels(struct key *keys, int64_t n, int64_t *level)
{
    if (n <= 64) { /* (a serving run's decisions see a few dozen flows: insertion sort) */
        for (int64_t j = 1; j < n; j++) {
            struct key x = keys[j];
            int64_t i = j - 1;
            while (i >= 0 && key_cmp(&keys[i], &x) > 0) {
                keys[i + 1] = keys[i];
                i--;
            }
            keys[i + 1] = x;
        }
    } else
        qsort(keys, (size_t)n, sizeof(struct key), key_cmp);
    int64_t dense = -1;
    for (int64_t j = 0; j < n; j++) {
        if (j == 0 || key_cmp(&keys[j], &keys[j - 1]))
            dense++;
        level[keys[j].pos] = dense;
    }
}

/* dense_levels with each key packed into one word, when every key's fields
 * fit (fewer than 256 levels: always in practice); 0, nothing done,
 * otherwise.  The words go into the keys' own buffer (16 of each key's 40
 * bytes). */
static int dense_levels_packed(struct key *keys, int64_t n, int64_t *level)
{
    for (int64_t i = 0; i < n; i++)
        if (keys[i].q < 0 || keys[i].q >= 256 || keys[i].u < 0 || keys[i].u >= 256 || keys[i].r < 0 ||
            keys[i].r >= ((int64_t)1 << PK_R_BITS))
            return 0;
    struct pkey *pk = (struct pkey *)keys;
    for (int64_t i = 0; i < n; i++) {
        const struct key *key = &keys[i]; /* (read before pk[i], which it overlaps, is written) */
        uint64_t w = ((uint64_t)key->q << (PK_R_BITS + 9)) | ((uint64_t)key->e << (PK_R_BITS + 8)) |
                     ((uint64_t)key->u << PK_R_BITS) | (uint64_t)key->r;
        int64_t pos = key->pos;
        pk[i].k = w;
        pk[i].pos = pos;
    }
    pkey_sort(pk, n);
    int64_t dense = -1;
    for (int64_t j = 0; j < n; j++) {
        if (j == 0 || pk[j].k != pk[j - 1].k)
            dense++;
        level[pk[j].pos] = dense;
    }
    return 1;
}

/* The j-th new flow's position: new_pos[j], or without new_pos the last n_new positions. */
#define NEW_AT(j) (new_pos ? new_pos[j] : n - n_new + (j))

int lxf_mfs_decide(struct lxf_mfs *m, int64_t n, const int64_t *slot, const int64_t *new_pos, int64_t n_new,
                   const double *current_in, const char *done_in, const double *new_current, const char *new_done,
                   const double *remaining, const double *link_load, int clip_load, double now, double dt,
                   const int64_t *finished, int64_t n_finished, int64_t *level, int64_t *queue, uint8_t *dscp,
                   double *timer, int64_t *noted, int64_t *infeasible, int64_t *counts)
{
    for (int64_t i = 0; i < n; i++) /* (the caller's indices: checked before anything is written) */
        if (slot[i] < 0 || slot[i] >= m->slots || m->bneck_link[slot[i]] < 0 || m->bneck_link[slot[i]] >= m->num_links)
            return LXF_MFS_BAD_INDEX;
    if (n_new < 0 || n_new > n)
        return LXF_MFS_BAD_INDEX;
    for (int64_t j = 0; new_pos && j < n_new; j++)
        if (new_pos[j] < 0 || new_pos[j] >= n)
            return LXF_MFS_BAD_INDEX;
    for (int64_t j = 0; j < n_finished; j++)
        if (finished[j] < 0 || finished[j] >= m->num_links)
            return LXF_MFS_BAD_INDEX;
    if (grow_flows(m, n) || grow_links(m) || grow_seen(m))
        return LXF_MFS_NO_MEMORY;
    int64_t k = m->levels;
    int64_t tick = (int64_t)floor(now / m->period + 1e-9);
    if (current_in)
        for (int64_t i = 0; i < n; i++) {
            m->seen_layer[slot[i]] = current_in[i];
            m->seen_done[slot[i]] = done_in[i];
        }
    else if (new_current)
        for (int64_t j = 0; j < n_new; j++) {
            m->seen_layer[slot[NEW_AT(j)]] = new_current[j];
            m->seen_done[slot[NEW_AT(j)]] = new_done[j];
        }
    const double *layer = m->seen_layer;
    const char *done = m->seen_done;
    memset(m->is_new, 0, (size_t)n);
    for (int64_t j = 0; j < n_new; j++)
        m->is_new[NEW_AT(j)] = 1;
    if (!link_load) { /* will an explicit flow's MLU be evaluated? (before anything changes) */
        for (int64_t i = 0; i < n; i++) {
            int64_t s = slot[i];
            if (m->explicit_[s] && (m->is_new[i] || eligible(m, s, layer[s], done[s], tick)))
                return LXF_MFS_NEED_LOAD;
        }
    }
    if (dt >= 0)
        measure(m, n, slot, remaining, dt, finished, n_finished);

    /* One pass in position order: a new flow's entry level or an old one's
     * promotion, then its arbitration key (arbitration.engine_levels), its
     * queue and DSCP, and its bytes left for the next measurement (measure
     * above has read them).  A flow's key reads only its own urgency. */
    int64_t nn = 0, ni = 0;
    struct key *keys = m->keys;
    *timer = NAN;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = slot[i];
        if (m->is_new[i] || eligible(m, s, layer[s], done[s], tick)) {
            int64_t urgency = m->urgency[s];
            int bad = 0;
            int64_t c = candidate(m, s, layer[s], remaining[i], link_load, clip_load, now, &bad);
            if (bad)
                infeasible[ni++] = i;
            int64_t u = m->is_new[i] || c < urgency ? c : urgency;
            m->urgency[s] = u;
            m->layer_at[s] = layer[s] != layer[s] ? -INFINITY : layer[s];
            m->tick_at[s] = tick;
            if ((m->is_new[i] || u < urgency) && m->note_levels) {
                noted[2 * nn] = i;
                noted[2 * nn + 1] = queue_of_one(u, m->explicit_[s], k);
                nn++;
            }
        }
        int64_t u = m->urgency[s];
        struct key *key = &keys[i];
        key->pos = i;
        if (m->pruned[m->request[s]] && m->stage[s] != LXF_STAGE_COLLECTIVE) {
            key->q = k; /* the scavenger is one level */
            key->e = key->u = key->r = 0;
        } else if (m->explicit_[s]) {
            key->q = u;
            key->e = 1;
            key->u = key->r = 0;
            if (isnan(*timer) && u > 0 && done[s])
                *timer = (double)(tick + 1) * m->period;
        } else {
            key->q = u + 1 < k - 1 ? u + 1 : k - 1;
            key->e = 0;
            key->u = u;
            key->r = m->rank[m->batch[s]];
        }
        queue[i] = key->q;
        dscp[i] = m->dscp_codes[key->q];
        m->last_rem[s] = remaining[i];
    }
    if (!dense_levels_packed(keys, n, level))
        dense_levels(keys, n, level);
    counts[0] = nn;
    counts[1] = ni;
    return 0;
}

int lxf_mfs_decide_engine(struct lxf_mfs *m, int64_t n, int64_t n_new, const double *current, const char *done,
                          double now, double dt, const int64_t *finished, int64_t n_finished)
{
    return lxf_mfs_decide(m, n, m->e_tag, NULL, n_new, current, done, NULL, NULL, m->e_remaining,
                          m->e_link_load, 1, now, dt, finished, n_finished, m->e_level, m->e_queue, m->e_dscp,
                          m->o_timer, m->o_noted, m->o_infeasible, m->o_counts);
}

int lxf_mfs_progress(struct lxf_mfs *m, int64_t k, const int64_t *slot, const double *current, const char *done)
{
    for (int64_t j = 0; j < k; j++) /* (checked before anything is written) */
        if (slot[j] < 0 || slot[j] >= m->slots)
            return LXF_MFS_BAD_INDEX;
    if (grow_seen(m))
        return LXF_MFS_NO_MEMORY;
    for (int64_t j = 0; j < k; j++) {
        m->seen_layer[slot[j]] = current[j];
        m->seen_done[slot[j]] = done[j];
    }
    return 0;
}

int lxf_mfs_admit(struct lxf_mfs *m, int64_t s, double size, double current, int done, int explicit_, int stage,
                  int64_t bneck_link, double bneck_rate, double bneck_weight, int64_t batch, int64_t request,
                  double target, double due)
{
    if (s < 0 || s >= m->slots)
        return LXF_MFS_BAD_INDEX;
    if (grow_seen(m))
        return LXF_MFS_NO_MEMORY;
    m->seen_layer[s] = current;
    m->seen_done[s] = (char)(done != 0);
    m->bneck_link[s] = bneck_link;
    m->bneck_rate[s] = bneck_rate;
    m->bneck_weight[s] = bneck_weight;
    m->last_rem[s] = size;
    m->explicit_[s] = (uint8_t)(explicit_ != 0);
    m->stage[s] = (int8_t)stage;
    m->target[s] = target;
    m->due[s] = due;
    m->batch[s] = batch;
    m->request[s] = request;
    return 0;
}
