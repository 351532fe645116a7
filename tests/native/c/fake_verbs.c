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
 * CQ.  FAKEVERBS_FAIL_WRID=n makes post_send refuse the WR with that wr_id.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_CQ_DEPTH 65536

struct fake_cq {
    struct ibv_cq cq;
    pthread_mutex_t lock;
    struct ibv_wc *ring;
    unsigned head, tail;
};

struct fake_qp {
    struct ibv_qp qp;
    int sig_all;
    unsigned long long calls; /* post_send calls on this QP */
};

static struct ibv_device g_dev;
static struct ibv_device *g_list[2];
static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *g_log;
static unsigned g_next_qp_num = 0x100;
static unsigned long long g_posted;
static long long g_fail_wrid = -1;

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
}

static void log_wr(struct fake_qp *q, unsigned long long call, int pos, const struct ibv_send_wr *w)
{
    if (!g_log)
        return;
    char line[8192];
    int n = snprintf(line, sizeof line, "POST qp=%u call=%llu pos=%d wr_id=%llu op=%d flags=%u imm=%u raddr=%llx rkey=%u nsge=%d",
                     q->qp.qp_num, call, pos, (unsigned long long)w->wr_id, w->opcode, w->send_flags,
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
        if ((long long)w->wr_id == g_fail_wrid) {
            *bad_wr = w;
            pthread_mutex_unlock(&cq->lock);
            return EINVAL;
        }
        log_wr(q, call, pos, w);
        __atomic_fetch_add(&g_posted, 1, __ATOMIC_RELAXED);
        if ((q->sig_all || (w->send_flags & IBV_SEND_SIGNALED)) && cq->tail - cq->head < FAKE_CQ_DEPTH) {
            struct ibv_wc *wc = &cq->ring[cq->tail++ % FAKE_CQ_DEPTH];
            memset(wc, 0, sizeof(*wc));
            wc->wr_id = w->wr_id;
            wc->status = IBV_WC_SUCCESS;
            wc->opcode = w->opcode == IBV_WR_RDMA_WRITE || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RDMA_WRITE : IBV_WC_SEND;
            wc->qp_num = qp->qp_num;
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
    struct ibv_context *ctx = calloc(1, sizeof(*ctx));
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
    if (ctx->ops.post_send != fake_post_send || ctx->ops.poll_cq != fake_poll_cq) {
        if (g_log) {
            fprintf(g_log, "CLOSE ops-not-restored\n");
            fflush(g_log);
        }
    }
    free(ctx);
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
    struct fake_cq *cq = calloc(1, sizeof(*cq));
    cq->cq.context = ctx;
    cq->cq.cqe = cqe;
    cq->cq.cq_context = cq_context;
    cq->ring = calloc(FAKE_CQ_DEPTH, sizeof(struct ibv_wc));
    pthread_mutex_init(&cq->lock, NULL);
    return &cq->cq;
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
    struct fake_qp *q = calloc(1, sizeof(*q));
    q->qp.context = pd->context;
    q->qp.pd = pd;
    q->qp.send_cq = attr->send_cq;
    q->qp.recv_cq = attr->recv_cq;
    q->qp.qp_type = attr->qp_type;
    q->qp.state = IBV_QPS_RESET;
    q->qp.qp_num = __atomic_fetch_add(&g_next_qp_num, 1, __ATOMIC_RELAXED);
    q->sig_all = attr->sq_sig_all;
    return &q->qp;
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
