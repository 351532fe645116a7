/*
 * shim_verbs_ex.c -- the extended verbs API: QPs from ibv_create_qp_ex with
 * send_ops_flags (posted with ibv_wr_start / ibv_wr_* / ibv_wr_complete on
 * their struct ibv_qp_ex) and CQs from ibv_create_cq_ex (read with
 * ibv_start_poll / ibv_next_poll / ibv_end_poll).
 *
 * All of these are inline calls through function pointers in provider
 * memory: ibv_create_qp_ex / ibv_create_cq_ex call verbs_context's
 * create_qp_ex / create_cq_ex (shim_verbs.c wraps those two at
 * ibv_open_device), and every wr_* / *_poll / read_* is a pointer in the QP's
 * or CQ's struct.  The wrappers installed here replace those pointers.
 *
 * Send side: wr_start decides per batch.  On a QP that is untagged and has no
 * state, the batch goes to the provider untouched (every builder forwards).
 * Otherwise the batch is recorded as the ibv_send_wr chain it describes and
 * handed to lxf_qp_post at wr_complete, so it is tagged, gated, deferred,
 * released and tracked exactly as an ibv_post_send chain (mixing the two
 * APIs on one QP is allowed by verbs).  A batch longer than LXF_EX_WRS is
 * handed over in chunks; wr_atomic_write, which has no ibv_send_wr form,
 * releases the QP's queue (fail open) and sends the rest of its batch
 * through the provider.
 *
 * Completion side: completions of tracked QPs are reported as poll_cq's are,
 * and the error completions made up for refused deferred WRs are served
 * first, read_* answering for them.
 *
 * Threads: a qp_ex batch and a cq_ex poll are one thread's at a time (verbs
 * requires it), so per-QP and per-CQ state needs no lock of its own.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim_internal.h"

#define LXF_MAX_EX 1024        /* power of two */
#define LXF_EX_WRS 64
#define LXF_EX_SGES 512
#define LXF_EX_INLINE 32768

struct lxf_qpx {
    struct ibv_qp_ex *qpx;
    struct ibv_qp_ex real;     /* the provider's function pointers */
    int recording;             /* this batch goes through lxf_qp_post */
    int rc;                    /* first error of the batch's chunks */
    uint32_t n_wr, n_sge, n_inl;
    struct ibv_send_wr wr[LXF_EX_WRS];
    struct ibv_sge sge[LXF_EX_SGES];
    unsigned char inl[LXF_EX_INLINE];
};

struct lxf_cqx {
    struct ibv_cq_ex *cqx;
    struct ibv_cq_ex real;
    struct ibv_poll_cq_attr attr;
    int injected;              /* the current entry is one of ours */
    int provider_open;         /* the provider's start_poll succeeded: end_poll is owed */
    struct ibv_wc cur;
};

static struct lxf_qpx *g_qpx[LXF_MAX_EX];
static struct lxf_cqx *g_cqx[LXF_MAX_EX];
static pthread_mutex_t g_ex_lock = PTHREAD_MUTEX_INITIALIZER;

/* ------------------------------------------------------------------ tables */

static uint32_t ptr_hash(const void *p)
{
    uint64_t k = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ULL;
    return (uint32_t)(k >> 40) & (LXF_MAX_EX - 1);
}

/* Open addressing over pointers to states whose first member is the key;
 * lookups are lock-free, inserts under g_ex_lock, states are never freed
 * while their QP or CQ lives. */
static void **table_find(void **table, const void *key)
{
    uint32_t h = ptr_hash(key);
    for (uint32_t i = 0; i < LXF_MAX_EX; i++) {
        void **slot = &table[(h + i) & (LXF_MAX_EX - 1)];
        void *st = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
        if (!st)
            return NULL;
        if (*(void **)st == key)
            return slot;
    }
    return NULL;
}

static struct lxf_qpx *qpx_find(struct ibv_qp_ex *qpx)
{
    void **slot = table_find((void **)g_qpx, qpx);
    return slot ? *slot : NULL;
}

static struct lxf_cqx *cqx_find(struct ibv_cq_ex *cqx)
{
    void **slot = table_find((void **)g_cqx, cqx);
    return slot ? *slot : NULL;
}

/* Insert st (key first); a state already there for the same key (an address
 * reused after a destroy) is replaced.  0, or -1 when the table is full. */
static int table_put(void **table, void *st)
{
    void *key = *(void **)st;
    uint32_t h = ptr_hash(key);
    pthread_mutex_lock(&g_ex_lock);
    void **slot = table_find(table, key);
    for (uint32_t i = 0; !slot && i < LXF_MAX_EX; i++)
        if (!table[(h + i) & (LXF_MAX_EX - 1)])
            slot = &table[(h + i) & (LXF_MAX_EX - 1)];
    if (slot) {
        void *old = *slot;
        __atomic_store_n(slot, st, __ATOMIC_RELEASE);
        free(old); /* its QP or CQ was destroyed: nobody can reach it */
    }
    pthread_mutex_unlock(&g_ex_lock);
    return slot ? 0 : -1;
}

/* ------------------------------------------------------------ send batches */

static struct lxf_qpx *st_of(struct ibv_qp_ex *qpx)
{
    return qpx_find(qpx);
}

/* Hand the recorded chain to the post path (gating, deferral, tracking). */
static void flush(struct lxf_qpx *st, uint32_t n)
{
    if (!n)
        return;
    for (uint32_t i = 0; i < n; i++)
        st->wr[i].next = i + 1 < n ? &st->wr[i + 1] : NULL;
    struct ibv_qp *qp = &st->qpx->qp_base;
    lxf_post_send_fn real = lxf_real_post_send(qp->context);
    struct ibv_send_wr *bad = NULL;
    lxf_in_shim++;
    struct lxf_qp_state *qs = lxf_qp_find(qp->context, qp->qp_num);
    if (!qs && lxf_gating())
        qs = lxf_qp_claim(qp);
    int rc = qs ? lxf_qp_post(qs, st->wr, &bad, real) : real(qp, st->wr, &bad);
    lxf_in_shim--;
    if (rc && !st->rc)
        st->rc = rc;
}

/* Make room: post every recorded WR but the one being built, which moves to
 * the front (its SG list and inline data are not written yet). */
static void flush_all_but_last(struct lxf_qpx *st)
{
    if (st->n_wr > 1) {
        struct ibv_send_wr last = st->wr[st->n_wr - 1];
        flush(st, st->n_wr - 1);
        st->wr[0] = last;
        st->n_wr = 1;
    }
    st->n_sge = 0;
    st->n_inl = 0;
}

static struct ibv_send_wr *new_wr(struct lxf_qpx *st, enum ibv_wr_opcode op)
{
    if (st->n_wr == LXF_EX_WRS) {
        flush(st, st->n_wr);
        st->n_wr = st->n_sge = st->n_inl = 0;
    }
    struct ibv_send_wr *w = &st->wr[st->n_wr++];
    memset(w, 0, sizeof(*w));
    w->wr_id = st->qpx->wr_id;
    w->send_flags = st->qpx->wr_flags;
    w->opcode = op;
    return w;
}

static struct ibv_send_wr *last_wr(struct lxf_qpx *st)
{
    return st->n_wr ? &st->wr[st->n_wr - 1] : NULL;
}

static int should_record(struct ibv_qp *qp)
{
    if (lxf_in_shim)
        return 0;
    if (__atomic_load_n(&lxf_n_tracked, __ATOMIC_RELAXED) && lxf_qp_find(qp->context, qp->qp_num))
        return 1; /* it may hold deferred work: nothing may overtake it */
    if (!lxf_gating())
        return 0;
    if (lxf_cfg.default_stage)
        return 1; /* untagged QPs carry the default stage's message */
    struct lxf_tag_value tag;
    return lxf_tag_read(lxf_segment(), lxf_self_pid(), LXF_TAG_QP, qp->qp_num, &tag) && tag.msg_id;
}

static void x_wr_start(struct ibv_qp_ex *qpx)
{
    struct lxf_qpx *st = st_of(qpx);
    st->recording = should_record(&qpx->qp_base);
    if (!st->recording) {
        st->real.wr_start(qpx);
        return;
    }
    st->n_wr = st->n_sge = st->n_inl = 0;
    st->rc = 0;
}

static int x_wr_complete(struct ibv_qp_ex *qpx)
{
    struct lxf_qpx *st = st_of(qpx);
    if (!st->recording)
        return st->real.wr_complete(qpx);
    flush(st, st->n_wr);
    st->n_wr = 0;
    st->recording = 0;
    return st->rc;
}

static void x_wr_abort(struct ibv_qp_ex *qpx)
{
    struct lxf_qpx *st = st_of(qpx);
    if (!st->recording) {
        st->real.wr_abort(qpx);
        return;
    }
    st->n_wr = 0; /* chunks already handed over (batches > LXF_EX_WRS) stay posted */
    st->recording = 0;
}

/* Builders: forward, or record the WR they describe. */
#define BUILDER(name, op, params, args, fill)      \
    static void x_##name params                    \
    {                                              \
        struct lxf_qpx *st = st_of(qpx);           \
        if (!st->recording) {                      \
            st->real.name args;                    \
            return;                                \
        }                                          \
        struct ibv_send_wr *w = new_wr(st, op);    \
        fill;                                      \
    }

BUILDER(wr_send, IBV_WR_SEND, (struct ibv_qp_ex * qpx), (qpx), (void)w)
BUILDER(wr_send_imm, IBV_WR_SEND_WITH_IMM, (struct ibv_qp_ex * qpx, __be32 imm), (qpx, imm), w->imm_data = imm)
BUILDER(wr_send_inv, IBV_WR_SEND_WITH_INV, (struct ibv_qp_ex * qpx, uint32_t rkey), (qpx, rkey),
        w->invalidate_rkey = rkey)
BUILDER(wr_rdma_write, IBV_WR_RDMA_WRITE, (struct ibv_qp_ex * qpx, uint32_t rkey, uint64_t raddr), (qpx, rkey, raddr),
        (w->wr.rdma.rkey = rkey, w->wr.rdma.remote_addr = raddr))
BUILDER(wr_rdma_write_imm, IBV_WR_RDMA_WRITE_WITH_IMM,
        (struct ibv_qp_ex * qpx, uint32_t rkey, uint64_t raddr, __be32 imm), (qpx, rkey, raddr, imm),
        (w->wr.rdma.rkey = rkey, w->wr.rdma.remote_addr = raddr, w->imm_data = imm))
BUILDER(wr_rdma_read, IBV_WR_RDMA_READ, (struct ibv_qp_ex * qpx, uint32_t rkey, uint64_t raddr), (qpx, rkey, raddr),
        (w->wr.rdma.rkey = rkey, w->wr.rdma.remote_addr = raddr))
BUILDER(wr_atomic_cmp_swp, IBV_WR_ATOMIC_CMP_AND_SWP,
        (struct ibv_qp_ex * qpx, uint32_t rkey, uint64_t raddr, uint64_t compare, uint64_t swap),
        (qpx, rkey, raddr, compare, swap),
        (w->wr.atomic.rkey = rkey, w->wr.atomic.remote_addr = raddr, w->wr.atomic.compare_add = compare,
         w->wr.atomic.swap = swap))
BUILDER(wr_atomic_fetch_add, IBV_WR_ATOMIC_FETCH_AND_ADD,
        (struct ibv_qp_ex * qpx, uint32_t rkey, uint64_t raddr, uint64_t add), (qpx, rkey, raddr, add),
        (w->wr.atomic.rkey = rkey, w->wr.atomic.remote_addr = raddr, w->wr.atomic.compare_add = add))
BUILDER(wr_bind_mw, IBV_WR_BIND_MW,
        (struct ibv_qp_ex * qpx, struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info *info),
        (qpx, mw, rkey, info), (w->bind_mw.mw = mw, w->bind_mw.rkey = rkey, w->bind_mw.bind_info = *info))
BUILDER(wr_local_inv, IBV_WR_LOCAL_INV, (struct ibv_qp_ex * qpx, uint32_t rkey), (qpx, rkey),
        w->invalidate_rkey = rkey)

/* TSO: the header is read at the call, so it is copied with the batch. */
static void x_wr_send_tso(struct ibv_qp_ex *qpx, void *hdr, uint16_t hdr_sz, uint16_t mss)
{
    struct lxf_qpx *st = st_of(qpx);
    if (!st->recording) {
        st->real.wr_send_tso(qpx, hdr, hdr_sz, mss);
        return;
    }
    struct ibv_send_wr *w = new_wr(st, IBV_WR_TSO);
    if (st->n_inl + hdr_sz > LXF_EX_INLINE)
        flush_all_but_last(st), w = last_wr(st);
    memcpy(st->inl + st->n_inl, hdr, hdr_sz);
    w->tso.hdr = st->inl + st->n_inl;
    w->tso.hdr_sz = hdr_sz;
    w->tso.mss = mss;
    st->n_inl += hdr_sz;
}

static void x_wr_set_ud_addr(struct ibv_qp_ex *qpx, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey)
{
    struct lxf_qpx *st = st_of(qpx);
    struct ibv_send_wr *w = st->recording ? last_wr(st) : NULL;
    if (!st->recording)
        st->real.wr_set_ud_addr(qpx, ah, qpn, qkey);
    else if (w)
        w->wr.ud.ah = ah, w->wr.ud.remote_qpn = qpn, w->wr.ud.remote_qkey = qkey;
}

static void x_wr_set_xrc_srqn(struct ibv_qp_ex *qpx, uint32_t srqn)
{
    struct lxf_qpx *st = st_of(qpx);
    struct ibv_send_wr *w = st->recording ? last_wr(st) : NULL;
    if (!st->recording)
        st->real.wr_set_xrc_srqn(qpx, srqn);
    else if (w)
        w->qp_type.xrc.remote_srqn = srqn;
}

static void x_wr_set_sge_list(struct ibv_qp_ex *qpx, size_t n, const struct ibv_sge *list)
{
    struct lxf_qpx *st = st_of(qpx);
    if (!st->recording) {
        st->real.wr_set_sge_list(qpx, n, list);
        return;
    }
    if (!last_wr(st) || n > LXF_EX_SGES)
        return; /* a builder must come first; a provider refuses this many too */
    if (st->n_sge + n > LXF_EX_SGES)
        flush_all_but_last(st);
    struct ibv_send_wr *w = last_wr(st);
    memcpy(&st->sge[st->n_sge], list, n * sizeof(*list));
    w->sg_list = &st->sge[st->n_sge];
    w->num_sge = (int)n;
    st->n_sge += (uint32_t)n;
}

static void x_wr_set_sge(struct ibv_qp_ex *qpx, uint32_t lkey, uint64_t addr, uint32_t length)
{
    struct lxf_qpx *st = st_of(qpx);
    if (!st->recording) {
        st->real.wr_set_sge(qpx, lkey, addr, length);
        return;
    }
    struct ibv_sge sge = {.addr = addr, .length = length, .lkey = lkey};
    x_wr_set_sge_list(qpx, 1, &sge);
}

/* Inline data is read at the call (the caller may reuse it at once): the
 * bytes are copied with the batch, and the WR becomes an IBV_SEND_INLINE one. */
static void x_wr_set_inline_data_list(struct ibv_qp_ex *qpx, size_t n, const struct ibv_data_buf *bufs)
{
    struct lxf_qpx *st = st_of(qpx);
    if (!st->recording) {
        st->real.wr_set_inline_data_list(qpx, n, bufs);
        return;
    }
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += bufs[i].length;
    if (!last_wr(st) || n > LXF_EX_SGES || bytes > LXF_EX_INLINE) {
        st->rc = st->rc ? st->rc : EINVAL; /* as a device refuses inline data past its limit */
        return;
    }
    if (st->n_sge + n > LXF_EX_SGES || st->n_inl + bytes > LXF_EX_INLINE)
        flush_all_but_last(st);
    struct ibv_send_wr *w = last_wr(st);
    w->sg_list = &st->sge[st->n_sge];
    w->num_sge = (int)n;
    w->send_flags |= IBV_SEND_INLINE;
    for (size_t i = 0; i < n; i++) {
        memcpy(st->inl + st->n_inl, bufs[i].addr, bufs[i].length);
        st->sge[st->n_sge++] = (struct ibv_sge){.addr = (uint64_t)(uintptr_t)(st->inl + st->n_inl),
                                                .length = (uint32_t)bufs[i].length};
        st->n_inl += (uint32_t)bufs[i].length;
    }
}

static void x_wr_set_inline_data(struct ibv_qp_ex *qpx, void *addr, size_t length)
{
    struct lxf_qpx *st = st_of(qpx);
    if (!st->recording) {
        st->real.wr_set_inline_data(qpx, addr, length);
        return;
    }
    struct ibv_data_buf b = {.addr = addr, .length = length};
    x_wr_set_inline_data_list(qpx, 1, &b);
}

/* No ibv_send_wr form: fail open for the rest of this batch.  What the QP
 * holds and what was recorded go to the device now, in order, and the
 * provider builds the remainder itself. */
static void x_wr_atomic_write(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t raddr, const void *wr)
{
    struct lxf_qpx *st = st_of(qpx);
    if (st->recording) {
        flush(st, st->n_wr);
        st->n_wr = 0;
        struct ibv_qp *qp = &qpx->qp_base;
        struct lxf_qp_state *qs = lxf_qp_find(qp->context, qp->qp_num);
        if (qs)
            lxf_qp_release_all(qs);
        st->recording = 0;
        st->real.wr_start(qpx);
    }
    st->real.wr_atomic_write(qpx, rkey, raddr, wr);
}

/* Called by the wrapped create_qp_ex for a QP created with send_ops_flags. */
void lxf_qpx_install(struct ibv_qp_ex *qpx)
{
    struct lxf_qpx *st = calloc(1, sizeof(*st));
    if (!st)
        return; /* its batches pass through untagged */
    st->qpx = qpx;
    st->real = *qpx;
    if (table_put((void **)g_qpx, st) != 0) {
        free(st);
        return;
    }
    /* Only the pointers the provider set: an operation it lacks stays NULL. */
#define WRAP(f) if (qpx->f) qpx->f = x_##f
    WRAP(wr_send); WRAP(wr_send_imm); WRAP(wr_send_inv); WRAP(wr_send_tso);
    WRAP(wr_rdma_write); WRAP(wr_rdma_write_imm); WRAP(wr_rdma_read);
    WRAP(wr_atomic_cmp_swp); WRAP(wr_atomic_fetch_add); WRAP(wr_atomic_write);
    WRAP(wr_bind_mw); WRAP(wr_local_inv); WRAP(wr_set_ud_addr); WRAP(wr_set_xrc_srqn);
    WRAP(wr_set_sge); WRAP(wr_set_sge_list); WRAP(wr_set_inline_data); WRAP(wr_set_inline_data_list);
    /* start / complete / abort last: a batch begun before is the provider's */
    WRAP(wr_abort); WRAP(wr_complete); WRAP(wr_start);
#undef WRAP
}

/* ------------------------------------------------------------ cq_ex polling */

static void report(struct lxf_cqx *st, struct ibv_cq_ex *cq)
{
    if (!__atomic_load_n(&lxf_n_tracked, __ATOMIC_RELAXED))
        return;
    struct ibv_wc wc = {.wr_id = cq->wr_id, .status = cq->status};
    wc.opcode = st->real.read_opcode ? st->real.read_opcode(cq) : IBV_WC_SEND;
    wc.qp_num = st->real.read_qp_num ? st->real.read_qp_num(cq) : 0;
    lxf_in_shim++;
    lxf_qp_on_completions(ibv_cq_ex_to_cq(cq), &wc, 1);
    lxf_in_shim--;
}

static int take_injected(struct lxf_cqx *st, struct ibv_cq_ex *cq)
{
    if (!__atomic_load_n(&lxf_n_injected, __ATOMIC_RELAXED) ||
        lxf_take_injected(ibv_cq_ex_to_cq(cq), 1, &st->cur) != 1)
        return 0;
    st->injected = 1;
    cq->wr_id = st->cur.wr_id;
    cq->status = st->cur.status;
    return 1;
}

static int provider_start(struct lxf_cqx *st, struct ibv_cq_ex *cq)
{
    int rc = st->real.start_poll(cq, &st->attr);
    st->provider_open = rc == 0;
    if (rc == 0)
        report(st, cq);
    return rc;
}

static int x_start_poll(struct ibv_cq_ex *cq, struct ibv_poll_cq_attr *attr)
{
    struct lxf_cqx *st = cqx_find(cq);
    st->injected = 0;
    st->attr = attr ? *attr : (struct ibv_poll_cq_attr){0};
    if (take_injected(st, cq)) {
        st->provider_open = 0;
        return 0;
    }
    return provider_start(st, cq);
}

static int x_next_poll(struct ibv_cq_ex *cq)
{
    struct lxf_cqx *st = cqx_find(cq);
    if (st->injected) {
        if (take_injected(st, cq))
            return 0;
        st->injected = 0;
        if (!st->provider_open)
            return provider_start(st, cq);
    }
    int rc = st->real.next_poll(cq);
    if (rc == 0)
        report(st, cq);
    return rc;
}

static void x_end_poll(struct ibv_cq_ex *cq)
{
    struct lxf_cqx *st = cqx_find(cq);
    if (st->provider_open)
        st->real.end_poll(cq);
    st->provider_open = st->injected = 0;
    /* the caller's next call moves deferred work along, as poll_cq's does */
    if (__atomic_load_n(&lxf_n_deferred, __ATOMIC_RELAXED) && !lxf_in_shim) {
        lxf_in_shim++;
        lxf_release_ready_all(0);
        lxf_in_shim--;
    }
}

#define READER(name, type, field)                              \
    static type x_##name(struct ibv_cq_ex *cq)                 \
    {                                                          \
        struct lxf_cqx *st = cqx_find(cq);                     \
        return st->injected ? (type)st->cur.field : st->real.name(cq); \
    }

READER(read_opcode, enum ibv_wc_opcode, opcode)
READER(read_vendor_err, uint32_t, vendor_err)
READER(read_byte_len, uint32_t, byte_len)
READER(read_imm_data, __be32, imm_data)
READER(read_qp_num, uint32_t, qp_num)
READER(read_src_qp, uint32_t, src_qp)
READER(read_wc_flags, unsigned int, wc_flags)

/* Called by the wrapped create_cq_ex. */
void lxf_cqx_install(struct ibv_cq_ex *cq)
{
    if (!cq->start_poll || !cq->next_poll || !cq->end_poll)
        return;
    struct lxf_cqx *st = calloc(1, sizeof(*st));
    if (!st)
        return;
    st->cqx = cq;
    st->real = *cq;
    if (table_put((void **)g_cqx, st) != 0) {
        free(st);
        return;
    }
#define WRAP(f) if (cq->f) cq->f = x_##f
    WRAP(read_opcode); WRAP(read_vendor_err); WRAP(read_byte_len); WRAP(read_imm_data);
    WRAP(read_qp_num); WRAP(read_src_qp); WRAP(read_wc_flags);
    WRAP(end_poll); WRAP(next_poll); WRAP(start_poll);
#undef WRAP
}
