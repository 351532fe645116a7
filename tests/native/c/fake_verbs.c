/*
 * fake_verbs.c -- a stand-in for libibverbs.so.1, built by tests/native.
 *
 * The tests run programs with LD_LIBRARY_PATH pointing at this library under
 * the soname libibverbs.so.1, so it is what a program linked with -libverbs
 * loads, what dlopen("libibverbs.so.1") would load, and what the shim's own
 * DT_NEEDED on libibverbs resolves to: the real production paths, with a
 * device that needs no RDMA hardware.  It exports the subset of the verbs API
 * the tests use, under the same IBVERBS_1.1 version node.
 *
 * The device: one "fake0".  Its context's ops table records every work
 * request handed to post_send (FAKEVERBS_LOG=path, one line per WR with its
 * SG list and data bytes), and completes signaled ones at once on the send
 * CQ.  FAKEVERBS_FAIL_WRID=n makes post_send refuse the WR with that wr_id;
 * FAKEVERBS_FAIL_ALL=1 makes it refuse every chain.
 *
 * The extended API is there too, laid out as rdma-core lays it out: the
 * context is the last member of a struct verbs_context (abi_compat marks it
 * extended) whose create_qp_ex / create_cq_ex the header's inline
 * ibv_create_qp_ex / ibv_create_cq_ex call; a QP created with send_ops_flags
 * embeds a struct ibv_qp_ex (ibv_qp_to_qp_ex returns it) whose wr_* builders
 * collect the batch that wr_complete posts as one post_send would (same log
 * lines); a CQ is a struct ibv_cq_ex whose start_poll / next_poll / end_poll
 * and read_* walk the same completion ring as poll_cq.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_CQ_DEPTH 65536

#define FAKE_BATCH 64

struct fake_cq {
    struct ibv_cq_ex cqx;     /* starts as struct ibv_cq does: ibv_cq_ex_to_cq is a cast */
    pthread_mutex_t lock;
    struct ibv_wc *ring;
    unsigned head, tail;
    struct ibv_wc cur;        /* the completion start_poll / next_poll point at */
};

struct fake_qp {
    struct ibv_qp_ex qpx;     /* qpx.qp_base is the struct ibv_qp */
    int sig_all;
    int is_ex;
    unsigned long long calls; /* post_send calls (and wr_complete batches) on this QP */
    int bn;                   /* WRs of the open wr_start batch */
    struct ibv_send_wr bwr[FAKE_BATCH];
    struct ibv_sge bsge[FAKE_BATCH][4];
    unsigned char binl[FAKE_BATCH][512];
};

static struct ibv_device g_dev;
static struct ibv_device *g_list[2];
static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *g_log;
static unsigned g_next_qp_num = 0x100;
static unsigned long long g_posted;
static long long g_fail_wrid = -1;
static int g_fail_all;

__attribute__((visibility("default"))) unsigned long long fakeverbs_posted(void)
{
    return __atomic_load_n(&g_posted, __ATOMIC_RELAXED);
}

static void log_open(void)
{
    const char *p = getenv("FAKEVERBS_LOG");
    if (p && !g_log)
        g_log = fopen(p, "a");
    const char *f = getenv("FAKEVERBS_FAIL_WRID");
    if (f)
        g_fail_wrid = atoll(f);
    g_fail_all = getenv("FAKEVERBS_FAIL_ALL") != NULL;
}

static void log_wr(struct fake_qp *q, unsigned long long call, int pos, const struct ibv_send_wr *w)
{
    if (!g_log)
        return;
    char line[8192];
    int n = snprintf(line, sizeof line, "POST qp=%u call=%llu pos=%d wr_id=%llu op=%d flags=%u imm=%u raddr=%llx rkey=%u nsge=%d",
                     q->qpx.qp_base.qp_num, call, pos, (unsigned long long)w->wr_id, w->opcode, w->send_flags,
                     w->imm_data, (unsigned long long)w->wr.rdma.remote_addr, w->wr.rdma.rkey, w->num_sge);
    for (int i = 0; i < w->num_sge && n < (int)sizeof line - 200; i++) {
        const struct ibv_sge *s = &w->sg_list[i];
        /* An inline SGE's address is wherever the bytes are held; only the
         * bytes themselves are part of what the device sends. */
        if (w->send_flags & IBV_SEND_INLINE)
            n += snprintf(line + n, sizeof line - n, " [inline len=%u data=", s->length);
        else
            n += snprintf(line + n, sizeof line - n, " [addr=%llx len=%u lkey=%u data=",
                          (unsigned long long)s->addr, s->length, s->lkey);
        const unsigned char *d = (const unsigned char *)(uintptr_t)s->addr;
        for (unsigned j = 0; j < s->length && j < 64; j++)
            n += snprintf(line + n, sizeof line - n, "%02x", d[j]);
        n += snprintf(line + n, sizeof line - n, "]");
    }
    pthread_mutex_lock(&g_log_lock);
    fprintf(g_log, "%s\n", line);
    fflush(g_log);
    pthread_mutex_unlock(&g_log_lock);
}

static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
    struct fake_qp *q = (struct fake_qp *)qp;
    struct fake_cq *cq = (struct fake_cq *)qp->send_cq;
    pthread_mutex_lock(&cq->lock); /* a provider serialises a QP's posts too */
    unsigned long long call = q->calls++;
    int pos = 0;
    for (struct ibv_send_wr *w = wr; w; w = w->next, pos++) {
        if ((long long)w->wr_id == g_fail_wrid || g_fail_all) {
            *bad_wr = w;
            pthread_mutex_unlock(&cq->lock);
            return EINVAL;
        }
        log_wr(q, call, pos, w);
        __atomic_fetch_add(&g_posted, 1, __ATOMIC_RELAXED);
        if ((q->sig_all || (w->send_flags & IBV_SEND_SIGNALED)) && cq->tail - cq->head < FAKE_CQ_DEPTH) {
            struct ibv_wc *wc = &cq->ring[cq->tail++ % FAKE_CQ_DEPTH];
            unsigned len = 0;
            for (int i = 0; i < w->num_sge; i++)
                len += w->sg_list[i].length;
            memset(wc, 0, sizeof(*wc));
            wc->wr_id = w->wr_id;
            wc->status = IBV_WC_SUCCESS;
            wc->opcode = w->opcode == IBV_WR_RDMA_WRITE || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RDMA_WRITE : IBV_WC_SEND;
            wc->qp_num = qp->qp_num;
            wc->byte_len = len;
        }
    }
    pthread_mutex_unlock(&cq->lock);
    return 0;
}

static int fake_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
    struct fake_cq *cq = (struct fake_cq *)ibcq;
    int got = 0;
    pthread_mutex_lock(&cq->lock);
    while (got < n && cq->head != cq->tail)
        wc[got++] = cq->ring[cq->head++ % FAKE_CQ_DEPTH];
    pthread_mutex_unlock(&cq->lock);
    return got;
}

static int fake_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    (void)qp; (void)wr; (void)bad;
    return 0;
}

/* ------------------------------------------------ extended send API (qp_ex) */

static struct fake_qp *qx(struct ibv_qp_ex *qpx) { return (struct fake_qp *)qpx; }

static struct ibv_send_wr *b_new(struct ibv_qp_ex *qpx, enum ibv_wr_opcode op)
{
    struct fake_qp *q = qx(qpx);
    if (q->bn == FAKE_BATCH)
        abort(); /* the tests never build batches this long */
    struct ibv_send_wr *w = &q->bwr[q->bn];
    memset(w, 0, sizeof(*w));
    w->wr_id = qpx->wr_id;
    w->send_flags = qpx->wr_flags;
    w->opcode = op;
    w->sg_list = q->bsge[q->bn];
    q->bn++;
    return w;
}

static struct ibv_send_wr *b_last(struct ibv_qp_ex *qpx) { return &qx(qpx)->bwr[qx(qpx)->bn - 1]; }

static void fx_start(struct ibv_qp_ex *qpx) { qx(qpx)->bn = 0; }
static void fx_abort(struct ibv_qp_ex *qpx) { qx(qpx)->bn = 0; }

static int fx_complete(struct ibv_qp_ex *qpx)
{
    struct fake_qp *q = qx(qpx);
    if (!q->bn)
        return 0;
    for (int i = 0; i < q->bn; i++)
        q->bwr[i].next = i + 1 < q->bn ? &q->bwr[i + 1] : NULL;
    struct ibv_send_wr *bad = NULL;
    int rc = fake_post_send(&qpx->qp_base, q->bwr, &bad);
    q->bn = 0;
    return rc;
}

static void fx_send(struct ibv_qp_ex *qpx) { b_new(qpx, IBV_WR_SEND); }
static void fx_send_imm(struct ibv_qp_ex *qpx, __be32 imm) { b_new(qpx, IBV_WR_SEND_WITH_IMM)->imm_data = imm; }

static void fx_rdma_write(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t raddr)
{
    struct ibv_send_wr *w = b_new(qpx, IBV_WR_RDMA_WRITE);
    w->wr.rdma.rkey = rkey;
    w->wr.rdma.remote_addr = raddr;
}

static void fx_rdma_write_imm(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t raddr, __be32 imm)
{
    struct ibv_send_wr *w = b_new(qpx, IBV_WR_RDMA_WRITE_WITH_IMM);
    w->wr.rdma.rkey = rkey;
    w->wr.rdma.remote_addr = raddr;
    w->imm_data = imm;
}

static void fx_set_sge(struct ibv_qp_ex *qpx, uint32_t lkey, uint64_t addr, uint32_t length)
{
    struct ibv_send_wr *w = b_last(qpx);
    w->sg_list[0] = (struct ibv_sge){.addr = addr, .length = length, .lkey = lkey};
    w->num_sge = 1;
}

static void fx_set_sge_list(struct ibv_qp_ex *qpx, size_t n, const struct ibv_sge *list)
{
    struct ibv_send_wr *w = b_last(qpx);
    for (size_t i = 0; i < n && i < 4; i++)
        w->sg_list[i] = list[i];
    w->num_sge = (int)(n < 4 ? n : 4);
}

/* Inline data is copied at the call, as a device copies it into the WQE. */
static void fx_set_inline_data_list(struct ibv_qp_ex *qpx, size_t n, const struct ibv_data_buf *bufs)
{
    struct fake_qp *q = qx(qpx);
    struct ibv_send_wr *w = b_last(qpx);
    unsigned char *dst = q->binl[q->bn - 1];
    size_t off = 0;
    w->num_sge = 0;
    for (size_t i = 0; i < n && i < 4 && off + bufs[i].length <= sizeof q->binl[0]; i++) {
        memcpy(dst + off, bufs[i].addr, bufs[i].length);
        w->sg_list[i] = (struct ibv_sge){.addr = (uintptr_t)(dst + off), .length = (uint32_t)bufs[i].length};
        off += bufs[i].length;
        w->num_sge++;
    }
    w->send_flags |= IBV_SEND_INLINE;
}

static void fx_set_inline_data(struct ibv_qp_ex *qpx, void *addr, size_t length)
{
    struct ibv_data_buf b = {.addr = addr, .length = length};
    fx_set_inline_data_list(qpx, 1, &b);
}

struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
    struct fake_qp *q = (struct fake_qp *)qp;
    return q->is_ex ? &q->qpx : NULL;
}

/* ----------------------------------------------- extended CQ polling (cq_ex) */

static struct fake_cq *cx(struct ibv_cq_ex *c) { return (struct fake_cq *)c; }

static int cq_take(struct fake_cq *cq)
{
    if (cq->head == cq->tail)
        return ENOENT;
    cq->cur = cq->ring[cq->head++ % FAKE_CQ_DEPTH];
    cq->cqx.wr_id = cq->cur.wr_id;
    cq->cqx.status = cq->cur.status;
    return 0;
}

/* A provider keeps its CQ locked from start_poll to end_poll, while the
 * device writes completions without that lock.  Here post_send writes them
 * under the CQ's lock, so the lock is taken per entry instead: holding it
 * across the poll would deadlock the fake where hardware cannot. */
static int fc_take_locked(struct ibv_cq_ex *c)
{
    pthread_mutex_lock(&cx(c)->lock);
    int rc = cq_take(cx(c));
    pthread_mutex_unlock(&cx(c)->lock);
    return rc;
}

static int fc_start_poll(struct ibv_cq_ex *c, struct ibv_poll_cq_attr *attr)
{
    (void)attr;
    return fc_take_locked(c);
}

static int fc_next_poll(struct ibv_cq_ex *c) { return fc_take_locked(c); }
static void fc_end_poll(struct ibv_cq_ex *c) { (void)c; }
static enum ibv_wc_opcode fc_read_opcode(struct ibv_cq_ex *c) { return cx(c)->cur.opcode; }
static uint32_t fc_read_vendor_err(struct ibv_cq_ex *c) { return cx(c)->cur.vendor_err; }
static uint32_t fc_read_byte_len(struct ibv_cq_ex *c) { return cx(c)->cur.byte_len; }
static __be32 fc_read_imm_data(struct ibv_cq_ex *c) { return cx(c)->cur.imm_data; }
static uint32_t fc_read_qp_num(struct ibv_cq_ex *c) { return cx(c)->cur.qp_num; }
static unsigned int fc_read_wc_flags(struct ibv_cq_ex *c) { return cx(c)->cur.wc_flags; }

static struct fake_cq *cq_new(struct ibv_context *ctx, int cqe, void *cq_context)
{
    struct fake_cq *cq = calloc(1, sizeof(*cq));
    cq->cqx.context = ctx;
    cq->cqx.cqe = cqe;
    cq->cqx.cq_context = cq_context;
    cq->ring = calloc(FAKE_CQ_DEPTH, sizeof(struct ibv_wc));
    pthread_mutex_init(&cq->lock, NULL);
    return cq;
}

static struct ibv_cq_ex *fake_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr)
{
    struct fake_cq *cq = cq_new(ctx, (int)attr->cqe, attr->cq_context);
    struct ibv_cq_ex *c = &cq->cqx;
    c->start_poll = fc_start_poll;
    c->next_poll = fc_next_poll;
    c->end_poll = fc_end_poll;
    c->read_opcode = fc_read_opcode;
    c->read_vendor_err = fc_read_vendor_err;
    c->read_byte_len = fc_read_byte_len;
    c->read_imm_data = fc_read_imm_data;
    c->read_qp_num = fc_read_qp_num;
    c->read_wc_flags = fc_read_wc_flags;
    return c;
}

static struct fake_qp *qp_new(struct ibv_pd *pd, struct ibv_cq *send_cq, struct ibv_cq *recv_cq,
                              enum ibv_qp_type type, int sig_all)
{
    struct fake_qp *q = calloc(1, sizeof(*q));
    q->qpx.qp_base.context = pd->context;
    q->qpx.qp_base.pd = pd;
    q->qpx.qp_base.send_cq = send_cq;
    q->qpx.qp_base.recv_cq = recv_cq;
    q->qpx.qp_base.qp_type = type;
    q->qpx.qp_base.state = IBV_QPS_RESET;
    q->qpx.qp_base.qp_num = __atomic_fetch_add(&g_next_qp_num, 1, __ATOMIC_RELAXED);
    q->sig_all = sig_all;
    return q;
}

static struct ibv_qp *fake_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr)
{
    (void)ctx;
    struct fake_qp *q = qp_new(attr->pd, attr->send_cq, attr->recv_cq, attr->qp_type, attr->sq_sig_all);
    if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
        struct ibv_qp_ex *x = &q->qpx;
        q->is_ex = 1;
        x->wr_start = fx_start;
        x->wr_complete = fx_complete;
        x->wr_abort = fx_abort;
        x->wr_send = fx_send;
        x->wr_send_imm = fx_send_imm;
        x->wr_rdma_write = fx_rdma_write;
        x->wr_rdma_write_imm = fx_rdma_write_imm;
        x->wr_set_sge = fx_set_sge;
        x->wr_set_sge_list = fx_set_sge_list;
        x->wr_set_inline_data = fx_set_inline_data;
        x->wr_set_inline_data_list = fx_set_inline_data_list;
    }
    return &q->qpx.qp_base;
}

/* ------------------------------------------------------------ entry points */

struct ibv_device **ibv_get_device_list(int *num)
{
    strcpy(g_dev.name, "fake0");
    strcpy(g_dev.dev_name, "fake0");
    g_list[0] = &g_dev;
    g_list[1] = NULL;
    if (num)
        *num = 1;
    return g_list;
}

void ibv_free_device_list(struct ibv_device **list) { (void)list; }

const char *ibv_get_device_name(struct ibv_device *dev) { return dev->name; }

struct ibv_context *ibv_open_device(struct ibv_device *dev)
{
    log_open();
    struct verbs_context *vctx = calloc(1, sizeof(*vctx));
    vctx->sz = sizeof(*vctx);
    vctx->create_qp_ex = fake_create_qp_ex;
    vctx->create_cq_ex = fake_create_cq_ex;
    struct ibv_context *ctx = &vctx->context;
    ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
    ctx->device = dev;
    ctx->ops.post_send = fake_post_send;
    ctx->ops.poll_cq = fake_poll_cq;
    ctx->ops.post_recv = fake_post_recv;
    ctx->cmd_fd = -1;
    ctx->async_fd = -1;
    pthread_mutex_init(&ctx->mutex, NULL);
    return ctx;
}

int ibv_close_device(struct ibv_context *ctx)
{
    /* Mimic rdma-core: a provider's ops must be its own again at close. */
    struct verbs_context *vctx = verbs_get_ctx(ctx);
    if (ctx->ops.post_send != fake_post_send || ctx->ops.poll_cq != fake_poll_cq ||
        vctx->create_qp_ex != fake_create_qp_ex || vctx->create_cq_ex != fake_create_cq_ex) {
        if (g_log) {
            fprintf(g_log, "CLOSE ops-not-restored\n");
            fflush(g_log);
        }
    }
    free(vctx);
    return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    pd->context = ctx;
    return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd) { free(pd); return 0; }

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                             struct ibv_comp_channel *channel, int comp_vector)
{
    (void)channel; (void)comp_vector;
    return ibv_cq_ex_to_cq(&cq_new(ctx, cqe, cq_context)->cqx);
}

int ibv_destroy_cq(struct ibv_cq *ibcq)
{
    struct fake_cq *cq = (struct fake_cq *)ibcq;
    free(cq->ring);
    free(cq);
    return 0;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    return &qp_new(pd, attr->send_cq, attr->recv_cq, attr->qp_type, attr->sq_sig_all)->qpx.qp_base;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
    if (mask & IBV_QP_STATE)
        qp->state = attr->qp_state;
    if (g_log && (mask & IBV_QP_AV)) {
        pthread_mutex_lock(&g_log_lock);
        fprintf(g_log, "MODIFY qp=%u is_global=%u traffic_class=%u\n", qp->qp_num,
                attr->ah_attr.is_global, attr->ah_attr.grh.traffic_class);
        fflush(g_log);
        pthread_mutex_unlock(&g_log_lock);
    }
    return 0;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
    free(qp);
    return 0;
}
