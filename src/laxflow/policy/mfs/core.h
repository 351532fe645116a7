/* The mfs policy's decision step in C: laxflow/policy/mfs/core.c.
 *
 * One call per decision (MfsPolicy.decide -> core.decide_native):
 * the explicit-load average, entry levels and promotions, arbitration keys,
 * dense levels and the period timer, over every live flow, with the float
 * operations of the reference (the vectorized MfsPolicy.decide) in the
 * same order, so state and decisions are bit-identical to it.  Admission (a new flow's static
 * facts, worked out in Python or in glue.c and written by
 * lxf_mfs_admit), RED order and pruning run before the call.
 *
 * Units: bytes, bytes/s, seconds.  Arrays are the policy's own NumPy
 * buffers (Rmlq's slot arrays, the per-batch rank, the per-request pruned
 * flags, the per-link averages), bound in struct lxf_mfs and re-bound by the
 * caller whenever one of them is replaced. */
#ifndef LAXFLOW_MFS_CORE_H
#define LAXFLOW_MFS_CORE_H

#include <stdint.h>

#define LXF_MFS_NEED_LOAD 1 /* an explicit flow's MLU is due: call again with link_load */
#define LXF_MFS_NO_MEMORY -1
#define LXF_MFS_BAD_INDEX -2 /* a slot, position or link out of range: nothing changed */

struct lxf_mfs {
    /* RMLQ slot arrays (laxflow.policy.rmlq.Rmlq), indexed by slot */
    int64_t *urgency;      /* MLU level or RLI, 0 most urgent */
    uint8_t *explicit_;    /* numpy bool */
    int8_t *stage;         /* LXF_STAGE_* of native/laxflow_shm.h (laxflow.stage) */
    double *target;        /* target layer, NaN if none */
    double *due;           /* due time (s), NaN if none */
    int64_t *bneck_link;
    double *bneck_rate;    /* bytes/s alone on the path */
    double *bneck_weight;  /* the flow's weight on that link */
    double *last_rem;      /* remaining bytes at the last decision */
    int64_t *batch;        /* batch index */
    int64_t *request;      /* request index */
    double *layer_at;      /* current layer when urgency was last set, -inf none */
    int64_t *tick_at;      /* period tick when urgency was last set */
    /* per batch, per request */
    const int64_t *rank;   /* RED rank of the batch */
    const uint8_t *pruned; /* numpy bool: the request is in the scavenger class */
    /* per link */
    double *explicit_load; /* moving average of explicit traffic (utilization) */
    double *finished_bytes; /* explicit bytes of flows done since the last decision */
    const double *capacity; /* bytes/s */
    int64_t num_links;
    /* constants (MfsConfig) */
    int64_t levels;        /* K */
    double period;         /* s */
    double load_window;    /* s */
    const double *thresholds; /* MLU level thresholds, ascending */
    int64_t num_thresholds;
    const uint8_t *dscp_codes; /* queue -> DSCP, index K = scavenger */
    int64_t slots;         /* the slot arrays' length */
    /* owned by C (lxf_mfs_free): per slot, the request progress last given */
    double *seen_layer;    /* current layer, NaN: none */
    char *seen_done;       /* compute ended */
    int64_t seen_room;
    /* scratch owned by C */
    double *sent;          /* per link */
    uint8_t *has_sent;     /* per link */
    int64_t *touched;      /* links in sent */
    int64_t *nonzero;      /* links whose explicit_load may not be 0.0 (the others stay 0.0 under decay) */
    uint8_t *in_nonzero;   /* per link: listed in nonzero */
    int64_t num_nonzero;
    int nonzero_valid;     /* 0: rebuild the list from explicit_load (set when the arrays are re-bound) */
    int64_t scratch_links;
    void *keys;            /* per flow: arbitration keys for the dense levels */
    uint8_t *is_new;       /* per flow */
    int64_t scratch_flows;
    /* lxf_mfs_decide_engine's arguments and outputs, set by the caller
     * (core.decide_tagged, at each incremental decision and whenever it
     * replaced one): the per-flow columns (tag: the RMLQ slots, the kept
     * flows' copied from the snapshot, the new ones' written at admission;
     * the snapshot's remaining; the level, queue and DSCP written), the
     * snapshot's unclipped link-load average, and where
     * the timer, the noted pairs, the infeasible positions and their counts
     * go (lxf_mfs_decide's out arguments, with room for the flows decided) */
    const int64_t *e_tag;
    const double *e_remaining;
    const double *e_link_load;
    int64_t *e_level;
    int64_t *e_queue;
    uint8_t *e_dscp;
    double *o_timer;
    int64_t *o_noted;
    int64_t *o_infeasible;
    int64_t *o_counts;
    int note_levels;       /* 0: no noted pairs (the owner reads no Flow.state: FlowPolicy.flow_notes) */
};

/* One decision over n live flows (positions 0..n-1 of the snapshot).
 * slot[n]: their RMLQ slots; new_pos[n_new]: positions admitted by this
 * decision (facts already set), or NULL: the last n_new positions.  Request
 * progress: current[n] (the current layer, NaN: none) and done[n] (compute
 * ended, 0 or 1) of every flow, or
 * NULL: then the values last given per slot, with new_current[n_new] and
 * new_done[n_new] those of the new flows (the owner changed no progress
 * since: the engine's reschedule contract).  remaining[n]: bytes left;
 * link_load[num_links]: the link-load average (NULL: not read yet), read
 * as it is or, with clip_load, clipped to [0, 1] as the engine's snapshot
 * gives it (the engine's own array: current on every link a live flow uses,
 * the only links the step reads; an idle link's is brought forward only
 * when read through the engine).
 * dt: seconds since the last decision (< 0: no interval, no measurement);
 * finished[n_finished]: links where finished_bytes is not 0.
 * Out: level[n], queue[n], dscp[n]; *timer (NaN: none); noted[2n] pairs
 * (position, RMLQ level) of flows whose level Flow.state must record (none
 * without m->note_levels), count in counts[0]; infeasible[n] positions with MLU > 1, count in counts[1].
 * Returns 0, LXF_MFS_NEED_LOAD (nothing changed but the progress kept:
 * call again with link_load), LXF_MFS_BAD_INDEX or LXF_MFS_NO_MEMORY. */
int lxf_mfs_decide(struct lxf_mfs *m, int64_t n, const int64_t *slot, const int64_t *new_pos, int64_t n_new,
                   const double *current, const char *done, const double *new_current, const char *new_done,
                   const double *remaining, const double *link_load, int clip_load, double now, double dt,
                   const int64_t *finished, int64_t n_finished, int64_t *level, int64_t *queue, uint8_t *dscp,
                   double *timer, int64_t *noted, int64_t *infeasible, int64_t *counts);

/* lxf_mfs_decide for an incremental snapshot (core.decide_tagged): over its
 * n flows, the last n_new of them new (their progress given at
 * lxf_mfs_admit), with the snapshot's columns and the outputs bound in m (e_*
 * and o_*; the link load clipped as the engine's snapshot would give it).
 * The same returns as lxf_mfs_decide but LXF_MFS_NEED_LOAD, which needs no
 * second call here. */
int lxf_mfs_decide_engine(struct lxf_mfs *m, int64_t n, int64_t n_new, const double *current, const char *done,
                          double now, double dt, const int64_t *finished, int64_t n_finished);

/* Request progress of k flows (slots slot[k]: current layer, NaN none;
 * compute ended) as lxf_mfs_decide keeps it per slot: what a decision with
 * current NULL reads for them (the owner named the flows whose progress it
 * changed).  Returns 0, LXF_MFS_BAD_INDEX (nothing written) or
 * LXF_MFS_NO_MEMORY. */
int lxf_mfs_progress(struct lxf_mfs *m, int64_t k, const int64_t *slot, const double *current, const char *done);

/* A new flow's static facts into slot s (core._admit_one's array
 * writes in one call; after its size and request progress (current layer,
 * NaN none; compute ended), as lxf_mfs_progress keeps it, the facts in
 * Rmlq.facts order).  The step reads them, and of them writes only
 * last_rem, at the end of each decision.  Returns 0, LXF_MFS_BAD_INDEX or
 * LXF_MFS_NO_MEMORY. */
int lxf_mfs_admit(struct lxf_mfs *m, int64_t s, double size, double current, int done, int explicit_, int stage,
                  int64_t bneck_link, double bneck_rate, double bneck_weight, int64_t batch, int64_t request,
                  double target, double due);

void lxf_mfs_free(struct lxf_mfs *m);

#endif
