/*
 * shim_defer.c -- per-QP state of tagged QPs: deferral queues, release,
 * completion tracking, injected error completions and the progress thread.
 *
 * A QP gets state the first time a work request is posted on it while its
 * flow tag names a message.  From then on every post on it goes through
 * lxf_qp_post under the QP's lock: if the message's gate is closed, or
 * earlier work is still queued, the whole chain is deep-copied (WRs, SG
 * lists, inline payload, TSO header) and queued in FIFO order; otherwise it
 * goes to the provider at once.  Queued chains are posted, in order and each
 * exactly once, when their gate opens -- by the progress thread or by the
 * application's next post_send / poll_cq -- or at once when the daemon's
 * heartbeat goes stale (fail open).
 *
 * Completions: each WR really posted gets a per-QP sequence number; signaled
 * ones are remembered (wr_id, seq) as marks.  Send completions of an RC QP
 * arrive in order, so a completion for mark seq s means every WR up to s is
 * done: each message whose last WR is <= s and that is fully posted is
 * reported to the daemon as one LXF_EV_COMPLETION.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shim_internal.h"

#define LXF_MAX_QPS 1024     /* power of two */
#define LXF_MARKS 128        /* power of two */
#define LXF_OPEN_MSGS 16     /* power of two */
#define LXF_MAX_INJECTED 256
#define LXF_VENDOR_ERR 0x1af10e /* vendor_err of completions the shim makes up */

uint32_t lxf_n_tracked;
uint32_t lxf_n_deferred;
uint32_t lxf_n_injected;

/* One deferred ibv_post_send call: its chain, deep-copied into one block. */
struct lxf_chain {
    struct lxf_chain *next;
    uint64_t msg_id;
    uint64_t queued_ns;     /* when deferred: released past lxf_cfg.max_defer_ns */
    uint32_t n_wr;
    uint32_t gen;           /* segment generation: a chain of a replaced segment goes at once */
    int ungated;            /* queued only to keep order: goes when it reaches the head */
    struct ibv_send_wr *wr;
};

struct lxf_mark {
    uint64_t wr_id;
    uint64_t seq;
};

struct lxf_open_msg {
    struct lxf_tag_value tag;
    uint64_t last_seq;      /* seq of its last WR posted so far */
    uint64_t bytes_posted;
    int posted_any;
    int closed;             /* no more WRs of it will come on this QP */
    int submitted;          /* the daemon was told: it gets the completion too */
    uint32_t gen;           /* segment generation it was submitted to */
};

struct lxf_qp_state {
    uint32_t state;                 /* 0 never used, 1 live, 2 freed */
    uint32_t qp_num;
    struct ibv_context *ctx;
    struct ibv_qp *qp;
    int sig_all;
    int lock;
    struct lxf_chain *head, *tail;  /* deferred chains, FIFO */
    uint32_t n_deferred;            /* WRs in the queue */
    uint64_t cur_msg;               /* message of the last post (submit once per message) */
    uint32_t cur_gen;               /* segment generation of cur_msg and of the open messages */
    uint64_t dflt_msg;              /* LAXFLOW_DEFAULT_STAGE: this untagged QP's stream message */
    uint32_t dflt_gen;              /* segment generation dflt_msg was allocated in */
    uint64_t post_seq;              /* WRs handed to the provider */
    struct lxf_mark marks[LXF_MARKS];
    uint32_t mk_head, mk_tail;
    struct lxf_open_msg msgs[LXF_OPEN_MSGS];
    uint32_t om_head, om_tail;
};

static struct lxf_qp_state g_qps[LXF_MAX_QPS];
static pthread_mutex_t g_qps_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_any_claimed;

struct lxf_sig_all {
    struct ibv_context *ctx;
    uint32_t qp_num;
};
static struct lxf_sig_all g_sig_all[LXF_MAX_QPS];
static uint32_t g_n_sig_all;

struct lxf_injected {
    struct ibv_cq *cq;
    struct ibv_wc wc;
};
static struct lxf_injected g_injected[LXF_MAX_INJECTED];
static int g_injected_lock;

static pthread_once_t g_progress_once = PTHREAD_ONCE_INIT;

/* ------------------------------------------------------------ small locks */

static void spin_lock(int *l)
{
    for (int spins = 0; __atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE); spins++) {
        while (__atomic_load_n(l, __ATOMIC_RELAXED)) {
            if (++spins > 200)
                sched_yield();
            else
                __builtin_ia32_pause();
        }
    }
}

static int spin_trylock(int *l)
{
    return !__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE);
}

static void spin_unlock(int *l)
{
    __atomic_store_n(l, 0, __ATOMIC_RELEASE);
}

/* ---------------------------------------------------------------- lookup */

static uint32_t qp_hash(struct ibv_context *ctx, uint32_t qp_num)
{
    uint64_t k = (uint64_t)(uintptr_t)ctx ^ ((uint64_t)qp_num * 0x9E3779B97F4A7C15ULL);
    k ^= k >> 29;
    return (uint32_t)k & (LXF_MAX_QPS - 1);
}

/* Lock-free; called on every post of every QP once any QP is tracked. */
struct lxf_qp_state *lxf_qp_find(struct ibv_context *ctx, uint32_t qp_num)
{
    uint32_t h = qp_hash(ctx, qp_num);
    for (uint32_t i = 0; i < LXF_MAX_QPS; i++) {
        struct lxf_qp_state *qs = &g_qps[(h + i) & (LXF_MAX_QPS - 1)];
        uint32_t st = __atomic_load_n(&qs->state, __ATOMIC_ACQUIRE);
        if (st == 0)
            return NULL;
        if (st == 1 && qs->ctx == ctx && qs->qp_num == qp_num)
            return qs;
    }
    return NULL;
}

void lxf_qp_set_sig_all(struct ibv_qp *qp)
{
    pthread_mutex_lock(&g_qps_lock);
    if (g_n_sig_all < LXF_MAX_QPS)
        g_sig_all[g_n_sig_all++] = (struct lxf_sig_all){qp->context, qp->qp_num};
    pthread_mutex_unlock(&g_qps_lock);
}

static int sig_all_take(struct ibv_context *ctx, uint32_t qp_num)
{
    for (uint32_t i = 0; i < g_n_sig_all; i++)
        if (g_sig_all[i].ctx == ctx && g_sig_all[i].qp_num == qp_num) {
            g_sig_all[i] = g_sig_all[--g_n_sig_all];
            return 1;
        }
    return 0;
}

/* Called from wrap_post_send the first time a tagged QP posts. */
struct lxf_qp_state *lxf_qp_claim(struct ibv_qp *qp)
{
    pthread_mutex_lock(&g_qps_lock);
    struct lxf_qp_state *qs = lxf_qp_find(qp->context, qp->qp_num);
    if (!qs) {
        uint32_t h = qp_hash(qp->context, qp->qp_num);
        for (uint32_t i = 0; i < LXF_MAX_QPS && !qs; i++) {
            struct lxf_qp_state *c = &g_qps[(h + i) & (LXF_MAX_QPS - 1)];
            if (__atomic_load_n(&c->state, __ATOMIC_RELAXED) != 1)
                qs = c;
        }
        if (qs) {
            /* Everything but state, which lock-free lookups read: a freed
             * slot must stay "freed" (probe on), never look "never used". */
            size_t keep = offsetof(struct lxf_qp_state, qp_num);
            memset((char *)qs + keep, 0, sizeof(*qs) - keep);
            qs->ctx = qp->context;
            qs->qp_num = qp->qp_num;
            qs->qp = qp;
            qs->sig_all = sig_all_take(qp->context, qp->qp_num);
            qs->cur_gen = lxf_generation();
            g_any_claimed = 1;
            __atomic_store_n(&qs->state, 1, __ATOMIC_RELEASE);
            __atomic_fetch_add(&lxf_n_tracked, 1, __ATOMIC_RELAXED);
        }
    }
    pthread_mutex_unlock(&g_qps_lock);
    return qs;
}

/* --------------------------------------------------------------- permits */

static int gate_open(uint64_t msg_id)
{
    struct lxf_segment *seg = lxf_segment();
    struct lxf_permit_view v;
    if (!seg || msg_id == 0)
        return 1;
    return lxf_permit_get(seg, msg_id, &v) && v.gate == LXF_GATE_OPEN;
}

/* -------------------------------------------------------------- messages */

static struct lxf_open_msg *open_msg_find(struct lxf_qp_state *qs, uint64_t msg_id)
{
    for (uint32_t i = qs->om_head; i != qs->om_tail; i++) {
        struct lxf_open_msg *om = &qs->msgs[i & (LXF_OPEN_MSGS - 1)];
        if (om->tag.msg_id == msg_id)
            return om;
    }
    return NULL;
}

static void retire_message(struct lxf_qp_state *qs, struct lxf_open_msg *om)
{
    /* A message of a replaced segment: its daemon is gone, the new one
     * never heard of it. */
    struct lxf_segment *seg = om->submitted ? lxf_segment_of(om->gen) : NULL;
    if (seg)
        lxf_emit_to(seg, LXF_EV_COMPLETION, om->tag.msg_id, &om->tag, qs->qp_num);
    qs->om_head++;
}

/* A new message starts on this QP: the previous one is fully posted. */
static void begin_message(struct lxf_qp_state *qs, struct lxf_segment *seg, uint32_t gen,
                          const struct lxf_tag_value *tag, int live)
{
    if (qs->cur_msg) {
        struct lxf_open_msg *prev = open_msg_find(qs, qs->cur_msg);
        if (prev)
            prev->closed = 1;
    }
    qs->cur_msg = tag ? tag->msg_id : 0;
    if (!tag)
        return;
    if (qs->om_tail - qs->om_head == LXF_OPEN_MSGS) {
        /* Too many messages in flight on one QP: report the oldest now
         * rather than lose it (counted: it is a tracking error). */
        LXF_COUNT(shim_internal_errors, 1);
        retire_message(qs, &qs->msgs[qs->om_head & (LXF_OPEN_MSGS - 1)]);
    }
    struct lxf_open_msg *om = &qs->msgs[qs->om_tail++ & (LXF_OPEN_MSGS - 1)];
    memset(om, 0, sizeof(*om));
    om->tag = *tag;
    om->gen = gen;
    /* A message the daemon never heard of would never get a permit: if the
     * submit cannot be pushed (ring full), the message goes ungated.  It is
     * pushed into the segment its tag came from: should the shim have moved
     * to a new daemon meanwhile, the old id never reaches the new daemon. */
    om->submitted = live && lxf_emit_to(seg, LXF_EV_SUBMIT, tag->msg_id, tag, qs->qp_num) == 0;
}

static uint64_t wr_bytes(const struct ibv_send_wr *w)
{
    uint64_t b = 0;
    for (int i = 0; i < w->num_sge; i++)
        b += w->sg_list[i].length;
    return b;
}

/* Account the WRs from wr up to (not including) stop as handed to the
 * provider, as part of message msg_id. */
static void account(struct lxf_qp_state *qs, struct ibv_send_wr *wr, struct ibv_send_wr *stop, uint64_t msg_id)
{
    struct lxf_open_msg *om = msg_id ? open_msg_find(qs, msg_id) : NULL;
    for (struct ibv_send_wr *w = wr; w && w != stop; w = w->next) {
        qs->post_seq++;
        if (om) {
            om->bytes_posted += wr_bytes(w);
            om->last_seq = qs->post_seq;
            om->posted_any = 1;
        }
        if (qs->sig_all || (w->send_flags & IBV_SEND_SIGNALED)) {
            if (qs->mk_tail - qs->mk_head == LXF_MARKS)
                qs->mk_head++; /* oldest mark lost: its message completes at a later one */
            qs->marks[qs->mk_tail++ & (LXF_MARKS - 1)] = (struct lxf_mark){w->wr_id, qs->post_seq};
        }
    }
    if (om && om->tag.bytes && om->bytes_posted >= om->tag.bytes)
        om->closed = 1;
}

/* Hand a chain to the provider; on failure *bad_wr as the provider set it. */
static int post_locked(struct lxf_qp_state *qs, lxf_post_send_fn real, struct ibv_send_wr *wr,
                       struct ibv_send_wr **bad_wr, uint64_t msg_id)
{
    struct ibv_send_wr *bad = NULL;
    int rc = real(qs->qp, wr, &bad);
    account(qs, wr, rc ? (bad ? bad : wr) : NULL, msg_id);
    if (rc && bad_wr)
        *bad_wr = bad;
    return rc;
}

/* ------------------------------------------------------ deep copy / queue */

static struct lxf_chain *chain_copy(const struct ibv_send_wr *wr, uint64_t msg_id, uint32_t gen)
{
    size_t n_wr = 0, n_sge = 0, extra = 0;
    for (const struct ibv_send_wr *w = wr; w; w = w->next) {
        if (w->num_sge < 0 || (w->num_sge > 0 && !w->sg_list))
            return NULL;
        n_wr++;
        n_sge += (size_t)w->num_sge;
        if (w->send_flags & IBV_SEND_INLINE)
            for (int i = 0; i < w->num_sge; i++)
                extra += w->sg_list[i].length;
        if (w->opcode == IBV_WR_TSO && w->tso.hdr)
            extra += w->tso.hdr_sz;
    }
    size_t bytes = sizeof(struct lxf_chain) + n_wr * sizeof(struct ibv_send_wr) +
                   n_sge * sizeof(struct ibv_sge) + extra;
    char *block = malloc(bytes);
    if (!block)
        return NULL;
    struct lxf_chain *c = (struct lxf_chain *)block;
    struct ibv_send_wr *wrs = (struct ibv_send_wr *)(c + 1);
    struct ibv_sge *sges = (struct ibv_sge *)(wrs + n_wr);
    char *data = (char *)(sges + n_sge);
    c->next = NULL;
    c->msg_id = msg_id;
    c->queued_ns = lxf_now_ns();
    c->gen = gen;
    c->n_wr = (uint32_t)n_wr;
    c->ungated = 0;
    c->wr = wrs;
    size_t k = 0;
    for (const struct ibv_send_wr *w = wr; w; w = w->next, k++) {
        struct ibv_send_wr *d = &wrs[k];
        *d = *w;
        d->next = k + 1 < n_wr ? &wrs[k + 1] : NULL;
        d->sg_list = w->num_sge ? sges : NULL;
        for (int i = 0; i < w->num_sge; i++) {
            sges[i] = w->sg_list[i];
            /* Inline data is read at post time and the caller may reuse the
             * buffer as soon as we return: carry the bytes with the copy. */
            if (w->send_flags & IBV_SEND_INLINE) {
                memcpy(data, (const void *)(uintptr_t)w->sg_list[i].addr, w->sg_list[i].length);
                sges[i].addr = (uint64_t)(uintptr_t)data;
                data += w->sg_list[i].length;
            }
        }
        sges += w->num_sge;
        if (w->opcode == IBV_WR_TSO && w->tso.hdr) {
            memcpy(data, w->tso.hdr, w->tso.hdr_sz);
            d->tso.hdr = data;
            data += w->tso.hdr_sz;
        }
    }
    return c;
}

/* A WR the device refused at release.  Verbs reports a failed WR with a
 * completion whether it was signaled or not (errors are always reported),
 * so every refused WR gets one.  One that does not fit is counted. */
static void inject_error(struct lxf_qp_state *qs, const struct ibv_send_wr *w)
{
    struct ibv_wc wc;
    memset(&wc, 0, sizeof(wc));
    wc.wr_id = w->wr_id;
    wc.status = IBV_WC_GENERAL_ERR;
    wc.vendor_err = LXF_VENDOR_ERR;
    wc.qp_num = qs->qp_num;
    spin_lock(&g_injected_lock);
    if (lxf_n_injected < LXF_MAX_INJECTED) {
        g_injected[lxf_n_injected].cq = qs->qp->send_cq;
        g_injected[lxf_n_injected].wc = wc;
        __atomic_store_n(&lxf_n_injected, lxf_n_injected + 1, __ATOMIC_RELEASE);
        spin_unlock(&g_injected_lock);
        return;
    }
    spin_unlock(&g_injected_lock);
    LXF_COUNT(injected_dropped, 1);
}

/* Called by wrap_poll_cq: hand out the errors made up for cq, oldest first. */
int lxf_take_injected(struct ibv_cq *cq, int max, struct ibv_wc *wc)
{
    int got = 0;
    spin_lock(&g_injected_lock);
    uint32_t keep = 0;
    for (uint32_t i = 0; i < lxf_n_injected; i++) {
        if (g_injected[i].cq == cq && got < max)
            wc[got++] = g_injected[i].wc;
        else
            g_injected[keep++] = g_injected[i];
    }
    __atomic_store_n(&lxf_n_injected, keep, __ATOMIC_RELEASE);
    spin_unlock(&g_injected_lock);
    return got;
}

/* Post the head chain of the queue and free it.  A WR the provider refuses
 * at this point cannot be refused to the caller any more: signaled ones come
 * back as error completions instead. */
enum { REL_PERMIT, REL_FAILOPEN, REL_TIMEOUT };

static void post_head(struct lxf_qp_state *qs, lxf_post_send_fn real, int why)
{
    struct lxf_chain *c = qs->head;
    /* head is peeked without the lock by lxf_release_ready_all */
    __atomic_store_n(&qs->head, c->next, __ATOMIC_RELAXED);
    if (!qs->head)
        qs->tail = NULL;
    struct ibv_send_wr *bad = NULL;
    /* a chain of a replaced segment belongs to no message we still track */
    int rc = post_locked(qs, real, c->wr, &bad, c->gen == qs->cur_gen ? c->msg_id : 0);
    struct lxf_segment *seg = lxf_segment();
    if (rc) {
        uint64_t failed = 0;
        for (struct ibv_send_wr *w = bad ? bad : c->wr; w; w = w->next, failed++)
            inject_error(qs, w);
        if (seg)
            LXF_COUNT(wr_post_errors, failed);
    }
    if (seg) {
        LXF_COUNT(wr_released, c->n_wr);
        if (why != REL_PERMIT)
            LXF_COUNT(wr_failopen, c->n_wr);
        if (why == REL_TIMEOUT)
            LXF_COUNT(wr_defer_timeouts, c->n_wr);
    }
    qs->n_deferred -= c->n_wr;
    __atomic_fetch_sub(&lxf_n_deferred, c->n_wr, __ATOMIC_RELAXED);
    free(c);
}

/* Post the queue's head chains that may go: all of them (fail open), or
 * while the head is ungated, its gate open, its segment replaced (fail open)
 * or it has waited longer than the maximum deferral age (fail open). */
static void release_locked(struct lxf_qp_state *qs, lxf_post_send_fn real, int all)
{
    uint64_t now = 0;
    uint32_t gen = lxf_generation();
    while (qs->head) {
        struct lxf_chain *c = qs->head;
        int why;
        if (all || c->gen != gen)
            why = REL_FAILOPEN;
        else if (c->ungated || gate_open(c->msg_id))
            why = REL_PERMIT;
        else if ((now ? now : (now = lxf_now_ns())) - c->queued_ns > lxf_cfg.max_defer_ns)
            why = REL_TIMEOUT;
        else
            break;
        post_head(qs, real, why);
    }
}

/* ------------------------------------------------------------- post path */

/* Called by wrap_post_send for every post on a QP with state, on the
 * application's posting thread. */
int lxf_qp_post(struct lxf_qp_state *qs, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr,
                lxf_post_send_fn real)
{
    struct lxf_segment *seg;
    struct lxf_tag_value tag;
    int tagged, live, rc;
    uint32_t gen;

    /* The segment and the flow tag are read outside the QP's lock (a tag
     * read touches shared memory); the generation read before them and
     * again under the lock tells whether the shim moved to a restarted
     * daemon in between (try_reattach: odd while moving).  If it did, read
     * them again: a tag of the old segment must not open a message under
     * the new generation.  Bounded: after a few moves in a row, the post
     * goes as if untagged (fail open). */
    for (int tries = 0;; tries++) {
        uint32_t before = lxf_generation();
        seg = lxf_segment();
        tagged = seg && lxf_tag_read(seg, lxf_self_pid(), LXF_TAG_QP, qs->qp_num, &tag) && tag.msg_id;
        if (LXF_UNLIKELY(lxf_cfg.test_pause_post[0]))
            lxf_test_pause_post();
        live = lxf_gating() && lxf_daemon_live();
        spin_lock(&qs->lock);
        /* Seqlock reader: the reads above complete before the re-check. */
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        gen = lxf_generation();
        if (LXF_LIKELY(gen == before && !(gen & 1)))
            break;
        spin_unlock(&qs->lock);
        if (tries == 3) {
            spin_lock(&qs->lock);
            gen = lxf_generation();
            seg = NULL;
            tagged = live = 0;
            break;
        }
    }
    if (!tagged && seg && lxf_cfg.default_stage) {
        /* LAXFLOW_DEFAULT_STAGE: the untagged QP is one open-ended message of
         * that stage (bytes 0: it ends when the QP goes), submitted once per
         * daemon; its permit gates it like any other. */
        if (!qs->dflt_msg || qs->dflt_gen != gen) {
            qs->dflt_msg = lxf_msg_id_alloc(seg);
            qs->dflt_gen = gen;
        }
        tag = (struct lxf_tag_value){.msg_id = qs->dflt_msg, .stage = lxf_cfg.default_stage, .dscp = -1};
        tagged = qs->dflt_msg != 0;
    }
    uint64_t msg = tagged ? tag.msg_id : 0;
    if (LXF_UNLIKELY(qs->cur_gen != gen)) {
        /* The daemon was replaced: its messages are nobody's now (and the
         * new daemon's ids may reuse theirs). */
        qs->om_head = qs->om_tail;
        qs->cur_msg = 0;
        qs->cur_gen = gen;
    }
    if (msg != qs->cur_msg)
        begin_message(qs, seg, gen, tagged ? &tag : NULL, live);
    if (qs->head)
        release_locked(qs, real, !live);
    struct lxf_open_msg *om = msg ? open_msg_find(qs, msg) : NULL;
    int gated = live && om && om->submitted && om->gen == lxf_generation() && !gate_open(msg);
    if (!qs->head && !gated) {
        rc = post_locked(qs, real, wr, bad_wr, msg);
    } else {
        struct lxf_chain *c = chain_copy(wr, msg, gen);
        if (!c) {
            /* Cannot hold it: fail open, keeping the QP's order. */
            if (seg)
                LXF_COUNT(shim_internal_errors, 1);
            release_locked(qs, real, 1);
            rc = post_locked(qs, real, wr, bad_wr, msg);
        } else {
            c->ungated = !gated;
            if (qs->tail)
                qs->tail->next = c;
            else
                __atomic_store_n(&qs->head, c, __ATOMIC_RELAXED);
            qs->tail = c;
            qs->n_deferred += c->n_wr;
            __atomic_fetch_add(&lxf_n_deferred, c->n_wr, __ATOMIC_RELAXED);
            LXF_COUNT(wr_deferred, c->n_wr);
            rc = 0;
        }
    }
    spin_unlock(&qs->lock);
    return rc;
}

/* -------------------------------------------------------- completion path */

static int take_mark(struct lxf_qp_state *qs, uint64_t wr_id, uint64_t *seq)
{
    /* In-order completion: normally the oldest mark.  Look a little further
     * in case a mark was dropped; never pop what does not match. */
    for (uint32_t i = qs->mk_head, n = 0; i != qs->mk_tail && n < 8; i++, n++) {
        if (qs->marks[i & (LXF_MARKS - 1)].wr_id == wr_id) {
            *seq = qs->marks[i & (LXF_MARKS - 1)].seq;
            qs->mk_head = i + 1;
            return 1;
        }
    }
    return 0;
}

static void on_completion(struct lxf_qp_state *qs, const struct ibv_wc *wc)
{
    uint64_t done;
    spin_lock(&qs->lock);
    if (take_mark(qs, wc->wr_id, &done)) {
        while (qs->om_head != qs->om_tail) {
            struct lxf_open_msg *om = &qs->msgs[qs->om_head & (LXF_OPEN_MSGS - 1)];
            if (!om->closed && !om->tag.bytes && om->tag.msg_id != qs->cur_msg)
                om->closed = 1;
            if (!om->closed || !om->posted_any || om->last_seq > done)
                break;
            retire_message(qs, om);
        }
    }
    spin_unlock(&qs->lock);
}

/* Called by wrap_poll_cq with the completions the provider returned. */
void lxf_qp_on_completions(struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
    for (int i = 0; i < n; i++) {
        if (wc[i].status == IBV_WC_SUCCESS && (wc[i].opcode & IBV_WC_RECV))
            continue;
        struct lxf_qp_state *qs = lxf_qp_find(cq->context, wc[i].qp_num);
        if (qs)
            on_completion(qs, &wc[i]);
    }
}

/* ------------------------------------------------------ release / forget */

/* Progress thread and the callers' next calls.  force: post everything now
 * (daemon gone, pass-through ordered, or the daemon said release all). */
void lxf_release_ready_all(int force)
{
    if (!__atomic_load_n(&lxf_n_deferred, __ATOMIC_RELAXED))
        return;
    int live = lxf_gating() && lxf_daemon_live();
    for (uint32_t i = 0; i < LXF_MAX_QPS; i++) {
        struct lxf_qp_state *qs = &g_qps[i];
        if (__atomic_load_n(&qs->state, __ATOMIC_ACQUIRE) != 1 || !__atomic_load_n(&qs->head, __ATOMIC_RELAXED))
            continue; /* a peek: re-checked under the lock */
        if (force || !live)
            spin_lock(&qs->lock);
        else if (!spin_trylock(&qs->lock))
            continue; /* its owner is posting and releases it itself */
        if (qs->head)
            release_locked(qs, lxf_real_post_send(qs->ctx), force || !live);
        spin_unlock(&qs->lock);
    }
}

/* Post everything qs holds now, in order (fail open).  Called by the
 * extended-API wrappers when a batch cannot be recorded. */
void lxf_qp_release_all(struct lxf_qp_state *qs)
{
    spin_lock(&qs->lock);
    release_locked(qs, lxf_real_post_send(qs->ctx), 1);
    spin_unlock(&qs->lock);
}

/* Called by ibv_destroy_qp before the provider destroys the QP: what is
 * still queued is posted (the device flushes it with errors as it would
 * have), and the state is freed. */
void lxf_qp_forget(struct ibv_qp *qp)
{
    pthread_mutex_lock(&g_qps_lock);
    sig_all_take(qp->context, qp->qp_num);
    struct lxf_qp_state *qs = lxf_qp_find(qp->context, qp->qp_num);
    if (qs) {
        spin_lock(&qs->lock);
        release_locked(qs, lxf_real_post_send(qs->ctx), 1);
        __atomic_store_n(&qs->state, 2, __ATOMIC_RELEASE);
        spin_unlock(&qs->lock);
        __atomic_fetch_sub(&lxf_n_tracked, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&g_qps_lock);
}

/* ------------------------------------------------------- progress thread */

static void handle_commands(void)
{
    struct lxf_proc *proc = lxf_proc();
    if (!proc)
        return;
    struct lxf_command cmds[16];
    int n = lxf_cmd_pop_batch(proc, cmds, 16);
    for (int i = 0; i < n; i++) {
        switch (cmds[i].kind) {
        case LXF_CMD_KICK:
            lxf_release_ready_all(0);
            break;
        case LXF_CMD_RELEASE_ALL:
            lxf_release_ready_all(1);
            break;
        case LXF_CMD_PASS_THROUGH:
            lxf_set_pass_through(1);
            lxf_release_ready_all(1);
            break;
        case LXF_CMD_ENFORCE:
            lxf_set_pass_through(0);
            break;
        default:
            break; /* unknown commands from a newer daemon are ignored */
        }
    }
}

static void sleep_us(uint32_t us)
{
    struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static void *progress_main(void *arg)
{
    (void)arg;
    /* Never run the application's signal handlers on this thread. */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    lxf_in_shim = 1;
    for (;;) {
        lxf_maintain(); /* late attach, daemon restarts */
        lxf_refresh_live();
        if (!lxf_segment()) {
            sleep_us(10000);
            continue;
        }
        handle_commands();
        lxf_release_ready_all(0);
        sleep_us(__atomic_load_n(&lxf_n_deferred, __ATOMIC_RELAXED) ? lxf_cfg.progress_us : 1000);
    }
    return NULL;
}

static void progress_spawn(void)
{
    pthread_attr_t attr;
    pthread_t tid;
    if (pthread_attr_init(&attr) != 0)
        return;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024); /* room for sanitizer builds */
    pthread_create(&tid, &attr, progress_main, NULL); /* on failure: callers' next calls release */
    pthread_attr_destroy(&attr);
}

/* Called by ibv_open_device: verbs users get the thread, others never. */
void lxf_progress_start(void)
{
    pthread_once(&g_progress_once, progress_spawn);
}

void lxf_defer_atfork_child(void)
{
    /* The parent's QPs, queues and thread are not the child's.  The queued
     * copies stay allocated in the child's heap copy (the child never posts
     * them); the parent still owns and releases the originals. */
    if (g_any_claimed) /* spare an untouched 3 MB of BSS the page copies */
        memset(g_qps, 0, sizeof(g_qps));
    g_n_sig_all = 0;
    g_injected_lock = 0;
    lxf_n_injected = 0;
    lxf_n_tracked = 0;
    lxf_n_deferred = 0;
    pthread_mutex_init(&g_qps_lock, NULL);
    g_progress_once = PTHREAD_ONCE_INIT; /* the child's next ibv_open_device starts its own */
}
