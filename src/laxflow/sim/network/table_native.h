/* The live-flow table of the network engine (table_native.c) and the
 * allocation scratch it shares with allocate_native.c.  Also the cffi
 * declarations of the module (allocate_build.py reads this file): keep it to
 * plain declarations and integer #defines. */
#ifndef LAXFLOW_TABLE_NATIVE_H
#define LAXFLOW_TABLE_NATIVE_H
#include <stdint.h>

/* lxf_table_decide's answers for a decision that breaks the contract. */
#define LXF_BAD_LEVEL (-3)
#define LXF_BAD_CAP (-4)
#define LXF_BAD_QUEUE (-5)
#define LXF_BAD_DSCP (-6)

/* Allocation buffers kept between calls; map is all -1 between calls. */
struct lxf_scratch {
    int64_t links, entries, flows;  /* sizes the buffers hold */
    int32_t *map;                   /* per link: local index or -1 */
    int32_t *loc;                   /* per entry */
    int64_t *used;                  /* per local link: its link */
    double *dbl;                    /* 5 * entries + flows + 1 */
    char *chr;                      /* entries + flows + 1 */
    int64_t *idx;                   /* 3 * flows + 1 */
    int64_t *stamp;                 /* stamps slots: per slot, the last water-filling round that used it */
    int32_t *touched;               /* entries: the slots one water-filling round touches */
    int64_t stamps, round;          /* stamps' size; the last round number handed out */
};

struct lxf_table {
    int64_t n, room;                /* flows (live, and dead until compacted); columns' room */
    int64_t nnz_room;
    double *remaining, *rate, *size, *arrival, *bneck, *cap;
    int64_t *level, *queue, *dscp;  /* the last decision (-1 / inf / -1 / 0 before the first) */
    int64_t *tag;                   /* the policy's own number for the flow (Decision.tag, handed back as Snapshot.tag), -1 until set */
    int8_t *stage;
    uint8_t *dead;
    int64_t *ptr;                   /* n + 1: CSR of the usage vectors */
    int64_t *link;
    double *weight;
    int32_t *loc;                   /* per entry: its link as the allocation's slot */
    int64_t *refs;                  /* num_links: live flows using each link */
    int64_t *used, *used_pos;       /* the links with refs > 0 (nused, any order), each one's place there */
    int64_t nused;
    double *acc;                    /* num_links, scratch of lxf_table_util */
    double delivered[4];            /* bytes delivered per stage code (LXF_STAGE_*: checked in table_native.c) */
    int64_t num_links;
    double *capacity;
    double load_window;
    int track, load_idle;
    int odd_weight;                 /* a flow ever added had a weight that is not finite (lxf_table_util) */
    double *load;                   /* num_links: the link-load average, as of load_t */
    double *load_t;                 /* num_links: the time load holds at (< clock: idle since, utilization 0) */
    double clock;                   /* the time of the last lxf_table_advance */
    int64_t nutil, util_room;       /* links in use and their utilization at the last allocation */
    int64_t *util_link;
    double *util;
    int64_t removed_min;            /* lowest level a completion touched since the last decision, -1 none */
    double *rates;
    int64_t rates_room;
    struct lxf_scratch scratch;
};

int lxf_allocate_scratch(struct lxf_scratch *s, int64_t n, const int64_t *ptr, const int64_t *link,
                         const double *weight, const int64_t *level, const double *cap, const double *capacity,
                         int64_t num_links, int has_from, int64_t from_level, const double *prev_rate,
                         double rel_below, double rel_above, double sat_eps, double *rates);
void lxf_allocate_mapped(struct lxf_scratch *s, int64_t n, const int64_t *ptr, const int32_t *loc,
                         const double *weight, const int64_t *level, const double *cap, const double *capacity,
                         const int64_t *capidx, const int64_t *slot, int64_t nslots, int64_t slot_room, int has_from,
                         int64_t from_level, const double *prev_rate, double rel_below, double rel_above,
                         double sat_eps, double *rates);
int lxf_scratch_reserve(struct lxf_scratch *s, int64_t links, int64_t entries, int64_t flows);
struct lxf_table *lxf_table_new(int64_t num_links, const double *capacity, int track, double load_window);
void lxf_table_free(struct lxf_table *t);
int lxf_table_util(struct lxf_table *t);
int lxf_table_add(struct lxf_table *t, double size, double arrival, int stage, double bneck, int64_t nnz,
                  const int64_t *link, const double *weight);
void lxf_table_advance(struct lxf_table *t, double dt, double now);
int64_t lxf_table_complete(struct lxf_table *t, double now, double rel_eps, double time_eps, int64_t *out,
                           int64_t *low);
void lxf_table_compact(struct lxf_table *t);
double lxf_table_next(const struct lxf_table *t);
void lxf_table_idle(struct lxf_table *t);
void lxf_table_load_clipped(const struct lxf_table *t, double *out);
void lxf_table_load_now(const struct lxf_table *t, double *out);
int lxf_table_decide(struct lxf_table *t, int64_t kept, const int64_t *level, const double *cap,
                     const int64_t *queue, const uint8_t *dscp, int64_t *changed, int64_t *out);
int lxf_table_apply(struct lxf_table *t, int64_t kept, const int64_t *level, const double *cap, const int64_t *queue,
                    const uint8_t *dscp, int64_t *changed, int64_t *out, int native, double rel_below,
                    double rel_above, double sat_eps, double *next);
int lxf_table_allocate(struct lxf_table *t, int64_t from_level, double rel_below, double rel_above, double sat_eps);
int lxf_allocate(int64_t n, const int64_t *ptr, const int64_t *link, const double *weight, const int64_t *level,
                 const double *cap, const double *capacity, int64_t num_links, int has_from, int64_t from_level,
                 const double *prev_rate, double rel_below, double rel_above, double sat_eps, double *rates);

#endif
