/*
 * verbs_client.c -- a verbs user as NCCL or Mooncake is one, for tests/native.
 *
 *   verbs_client MODE NQPS NCHAINS NPHASES [--wait] [--sig-all] [--tpq K] [--poll] [--poll-timeout S] [--hold-poll]
 *                [--shim-stats]
 *
 * MODE direct: calls ibv_* as a program linked with -libverbs (Mooncake).
 * MODE dlopen: dlopen("libibverbs.so.1") and dlvsym(h, name, "IBVERBS_1.1")
 *              for every entry point (NCCL's ibvwrap).
 * MODE ex:     as direct, but CQs from ibv_create_cq_ex, QPs from
 *              ibv_create_qp_ex with send_ops_flags, every chain posted as one
 *              ibv_wr_start .. ibv_wr_* .. ibv_wr_complete batch (inline data
 *              with ibv_wr_set_inline_data(_list)), completions read with
 *              ibv_start_poll / ibv_next_poll / ibv_end_poll.
 * K threads per QP (default 1; NQPS * K <= 8 threads posting concurrently).  Each thread posts
 * NPHASES phases of NCHAINS chains: chains of 1-3 WRs, SEND / WRITE / WRITE
 * with immediate, 1-3 SGEs into a fixed buffer, some inline (from a stack
 * buffer overwritten right after the post returns), every 4th WR signaled.
 * ibv_post_send and ibv_poll_cq are the header's inline calls through
 * ctx->ops, as in both libraries.
 *
 * Protocol on stdout/stdin (for the test driving it as the daemon would):
 *   prints "QPS pid qpnum..." and "PLAN qp phase bytes" lines, then
 *   with --wait reads a line before each phase; prints "POSTED phase" after
 *   each; finally polls until every signaled WR completed (or 30 s) and
 *   prints "DONE completions=N errors=E".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct api {
    struct ibv_device **(*get_device_list)(int *);
    struct ibv_context *(*open_device)(struct ibv_device *);
    int (*close_device)(struct ibv_context *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
    int (*destroy_qp)(struct ibv_qp *);
};

static struct api A;
static int g_ex;
static struct ibv_qp_ex **g_qpx;
static struct ibv_cq_ex **g_cqx;
static pthread_mutex_t g_qp_lock[8]; /* a qp_ex batch is one thread's at a time */
static int g_nqps, g_nchains, g_nphases, g_wait, g_sig_all, g_tpq = 1, g_nthreads, g_poll_timeout = 30, g_hold_poll, g_shim_stats;
static struct ibv_qp **g_qp;
static struct ibv_cq **g_cq;
static unsigned char g_buf[8][4096];
static pthread_barrier_t g_start, g_end;
static int g_expected[8];
/* signaled[t][seq]: whether thread t's WR seq was signaled (errors of
 * unsignaled WRs are reported too, and counted apart) */
static unsigned char *g_signaled[8];

static void *must(void *p, const char *what)
{
    if (!p) {
        fprintf(stderr, "verbs_client: %s failed\n", what);
        exit(2);
    }
    return p;
}

static void load_api(const char *mode)
{
    if (strcmp(mode, "direct") == 0) {
        A.get_device_list = ibv_get_device_list;
        A.open_device = ibv_open_device;
        A.close_device = ibv_close_device;
        A.alloc_pd = ibv_alloc_pd;
        A.create_cq = ibv_create_cq;
        A.create_qp = ibv_create_qp;
        A.modify_qp = ibv_modify_qp;
        A.destroy_qp = ibv_destroy_qp;
        return;
    }
    void *h = must(dlopen("libibverbs.so.1", RTLD_NOW), "dlopen(libibverbs.so.1)");
    /* What NCCL's ibvwrap does: one versioned lookup per entry point. */
#define SYM(field, name) A.field = must(dlvsym(h, name, "IBVERBS_1.1"), "dlvsym(" name ")")
    SYM(get_device_list, "ibv_get_device_list");
    SYM(open_device, "ibv_open_device");
    SYM(close_device, "ibv_close_device");
    SYM(alloc_pd, "ibv_alloc_pd");
    SYM(create_cq, "ibv_create_cq");
    SYM(create_qp, "ibv_create_qp");
    SYM(modify_qp, "ibv_modify_qp");
    SYM(destroy_qp, "ibv_destroy_qp");
    printf("HANDLE shim=%d\n", dlsym(h, "laxflow_shim_active") != NULL);
}

/* Deterministic plan of thread t, phase p, chain c, WR k. */
static int chain_len(int t, int p, int c) { return 1 + (t + p + c) % 3; }
static int wr_nsge(int t, int c, int k) { return 1 + (t + c + k) % 3; }
static int wr_inline(int t, int c, int k) { return (t + c * 3 + k) % 5 == 0; }
static unsigned sge_len(int c, int k, int i) { return 8 + ((c * 7 + k * 3 + i * 5) % 24); }

static unsigned long long phase_bytes(int t, int p)
{
    unsigned long long b = 0;
    for (int c = 0; c < g_nchains; c++)
        for (int k = 0; k < chain_len(t, p, c); k++)
            for (int i = 0; i < wr_nsge(t, c, k); i++)
                b += sge_len(c, k, i);
    return b;
}

/* The same chain through the extended send API. */
static int post_ex(int q, struct ibv_send_wr *wr)
{
    struct ibv_qp_ex *x = g_qpx[q];
    pthread_mutex_lock(&g_qp_lock[q]);
    ibv_wr_start(x);
    for (struct ibv_send_wr *w = wr; w; w = w->next) {
        x->wr_id = w->wr_id;
        x->wr_flags = w->send_flags & ~IBV_SEND_INLINE;
        switch (w->opcode) {
        case IBV_WR_SEND: ibv_wr_send(x); break;
        case IBV_WR_SEND_WITH_IMM: ibv_wr_send_imm(x, w->imm_data); break;
        case IBV_WR_RDMA_WRITE: ibv_wr_rdma_write(x, w->wr.rdma.rkey, w->wr.rdma.remote_addr); break;
        default: ibv_wr_rdma_write_imm(x, w->wr.rdma.rkey, w->wr.rdma.remote_addr, w->imm_data); break;
        }
        if (w->send_flags & IBV_SEND_INLINE) {
            struct ibv_data_buf bufs[3];
            for (int i = 0; i < w->num_sge; i++)
                bufs[i] = (struct ibv_data_buf){(void *)(uintptr_t)w->sg_list[i].addr, w->sg_list[i].length};
            if (w->num_sge == 1)
                ibv_wr_set_inline_data(x, bufs[0].addr, bufs[0].length);
            else
                ibv_wr_set_inline_data_list(x, (size_t)w->num_sge, bufs);
        } else if (w->num_sge == 1) {
            ibv_wr_set_sge(x, w->sg_list[0].lkey, w->sg_list[0].addr, w->sg_list[0].length);
        } else {
            ibv_wr_set_sge_list(x, (size_t)w->num_sge, w->sg_list);
        }
    }
    int rc = ibv_wr_complete(x);
    pthread_mutex_unlock(&g_qp_lock[q]);
    return rc;
}

/* Up to max completions of CQ q: (wr_id, status) pairs. */
static int poll_ex(int q, int max, struct ibv_wc *wc)
{
    struct ibv_cq_ex *c = g_cqx[q];
    struct ibv_poll_cq_attr attr = {0};
    int n = 0;
    if (ibv_start_poll(c, &attr) != 0)
        return 0;
    do {
        wc[n].wr_id = c->wr_id;
        wc[n].status = c->status;
        wc[n].vendor_err = ibv_wc_read_vendor_err(c);
        wc[n].qp_num = ibv_wc_read_qp_num(c);
        n++;
    } while (n < max && ibv_next_poll(c) == 0);
    ibv_end_poll(c);
    return n;
}

static int poll_any(int q, int max, struct ibv_wc *wc)
{
    return g_ex ? poll_ex(q, max, wc) : ibv_poll_cq(g_cq[q], max, wc);
}

/* Completions seen so far; one polling thread at a time. */
static int completions, errors, uerrors, g_poll, g_stop_poll;

static void poll_count(int q)
{
    struct ibv_wc wc[16];
    int n = poll_any(q, 16, wc);
    for (int i = 0; i < n; i++) {
        unsigned t = (unsigned)(wc[i].wr_id >> 32), seq = (unsigned)wc[i].wr_id;
        if (wc[i].status == IBV_WC_SUCCESS)
            completions++;
        else if (t < 8 && g_signaled[t] && !__atomic_load_n(&g_signaled[t][seq], __ATOMIC_RELAXED))
            uerrors++;
        else
            errors++;
    }
}

/* --poll: completions are reaped while the posters post (releases, posts and
 * completions interleave in the shim). */
static void *poller(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&g_stop_poll, __ATOMIC_RELAXED)) {
        for (int q = 0; q < g_nqps; q++)
            poll_count(q);
        usleep(50);
    }
    return NULL;
}

static void *poster(void *arg)
{
    int t = (int)(long)arg;
    unsigned long long seq = 0;
    int n_wr_total = 0;
    for (int p = 0; p < g_nphases; p++) {
        pthread_barrier_wait(&g_start);
        for (int c = 0; c < g_nchains; c++) {
            struct ibv_send_wr wrs[3];
            struct ibv_sge sges[3][3];
            unsigned char inl[3][96];
            int n = chain_len(t, p, c);
            memset(wrs, 0, sizeof wrs);
            for (int k = 0; k < n; k++) {
                struct ibv_send_wr *w = &wrs[k];
                int inline_ = wr_inline(t, c, k);
                unsigned off = 0;
                w->wr_id = ((unsigned long long)t << 32) | seq++;
                w->num_sge = wr_nsge(t, c, k);
                w->sg_list = sges[k];
                for (int i = 0; i < w->num_sge; i++) {
                    unsigned len = sge_len(c, k, i);
                    if (inline_) {
                        for (unsigned j = 0; j < len; j++)
                            inl[k][off + j] = (unsigned char)(seq * 31 + j + i);
                        sges[k][i].addr = (uintptr_t)&inl[k][off];
                        sges[k][i].lkey = 0;
                    } else {
                        sges[k][i].addr = (uintptr_t)&g_buf[t][(c * 97 + k * 13 + i * 331) % 3000];
                        sges[k][i].lkey = 0x1000 + t;
                    }
                    sges[k][i].length = len;
                    off += len;
                }
                switch ((c + k) % 4) {
                case 0: w->opcode = IBV_WR_SEND; break;
                case 1: w->opcode = IBV_WR_RDMA_WRITE; break;
                case 2: w->opcode = IBV_WR_RDMA_WRITE_WITH_IMM; w->imm_data = (uint32_t)seq; break;
                default: w->opcode = IBV_WR_SEND_WITH_IMM; w->imm_data = (uint32_t)(seq * 3); break;
                }
                w->wr.rdma.remote_addr = 0x7f0000000000ULL + seq * 4096;
                w->wr.rdma.rkey = 0x2000 + t;
                n_wr_total++;
                int last = p == g_nphases - 1 && c == g_nchains - 1 && k == n - 1;
                w->send_flags = (inline_ ? IBV_SEND_INLINE : 0) |
                                ((n_wr_total % 4 == 0 || last) ? IBV_SEND_SIGNALED : 0);
                if (g_sig_all || (w->send_flags & IBV_SEND_SIGNALED)) {
                    g_expected[t]++;
                    __atomic_store_n(&g_signaled[t][seq - 1], 1, __ATOMIC_RELAXED); /* the poller reads it */
                }
                w->next = k + 1 < n ? &wrs[k + 1] : NULL;
            }
            struct ibv_send_wr *bad = NULL;
            int rc = g_ex ? post_ex(t % g_nqps, wrs) : ibv_post_send(g_qp[t % g_nqps], wrs, &bad);
            if (rc)
                fprintf(stderr, "post_send rc=%d\n", rc);
            /* Inline data may be reused once post_send returns. */
            memset(inl, 0xEE, sizeof inl);
        }
        pthread_barrier_wait(&g_end);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: verbs_client direct|dlopen NQPS NCHAINS NPHASES [--wait] [--sig-all]\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_nqps = atoi(argv[2]);
    g_nchains = atoi(argv[3]);
    g_nphases = atoi(argv[4]);
    for (int i = 5; i < argc; i++) {
        g_wait |= strcmp(argv[i], "--wait") == 0;
        g_poll |= strcmp(argv[i], "--poll") == 0;
        g_sig_all |= strcmp(argv[i], "--sig-all") == 0;
        if (strcmp(argv[i], "--tpq") == 0 && i + 1 < argc)
            g_tpq = atoi(argv[++i]);
        g_hold_poll |= strcmp(argv[i], "--hold-poll") == 0;
        g_shim_stats |= strcmp(argv[i], "--shim-stats") == 0;
        if (strcmp(argv[i], "--poll-timeout") == 0 && i + 1 < argc)
            g_poll_timeout = atoi(argv[++i]);
    }
    g_nthreads = g_nqps * g_tpq;
    if (g_nqps < 1 || g_tpq < 1 || g_nthreads > 8)
        return 2;
    g_ex = strcmp(argv[1], "ex") == 0;
    load_api(g_ex ? "direct" : argv[1]);
    for (int t = 0; t < 8; t++)
        for (int i = 0; i < 4096; i++)
            g_buf[t][i] = (unsigned char)(t * 41 + i * 7);

    int ndev = 0;
    struct ibv_device **devs = must(A.get_device_list(&ndev), "ibv_get_device_list");
    if (ndev < 1)
        must(NULL, "a device");
    struct ibv_context *ctx = must(A.open_device(devs[0]), "ibv_open_device");
    struct ibv_pd *pd = must(A.alloc_pd(ctx), "ibv_alloc_pd");
    g_qp = calloc(g_nqps, sizeof(*g_qp));
    g_cq = calloc(g_nqps, sizeof(*g_cq));
    g_qpx = calloc(g_nqps, sizeof(*g_qpx));
    g_cqx = calloc(g_nqps, sizeof(*g_cqx));
    printf("QPS %d", (int)getpid());
    for (int t = 0; t < g_nqps; t++) {
        pthread_mutex_init(&g_qp_lock[t], NULL);
        if (g_ex) {
            struct ibv_cq_init_attr_ex ca = {.cqe = 4096, .wc_flags = IBV_WC_EX_WITH_QP_NUM};
            g_cqx[t] = must(ibv_create_cq_ex(ctx, &ca), "ibv_create_cq_ex");
            g_cq[t] = ibv_cq_ex_to_cq(g_cqx[t]);
            struct ibv_qp_init_attr_ex ia = {
                .send_cq = g_cq[t], .recv_cq = g_cq[t], .qp_type = IBV_QPT_RC, .sq_sig_all = g_sig_all,
                .cap = {.max_send_wr = 1024, .max_send_sge = 3, .max_inline_data = 256},
                .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd,
                .send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
                                  IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM};
            g_qp[t] = must(ibv_create_qp_ex(ctx, &ia), "ibv_create_qp_ex");
            g_qpx[t] = must(ibv_qp_to_qp_ex(g_qp[t]), "ibv_qp_to_qp_ex");
        } else {
            g_cq[t] = must(A.create_cq(ctx, 4096, NULL, NULL, 0), "ibv_create_cq");
            struct ibv_qp_init_attr ia = {.send_cq = g_cq[t], .recv_cq = g_cq[t], .qp_type = IBV_QPT_RC,
                                          .sq_sig_all = g_sig_all, .cap = {.max_send_wr = 1024, .max_send_sge = 3}};
            g_qp[t] = must(A.create_qp(pd, &ia), "ibv_create_qp");
        }
        printf(" %u", g_qp[t]->qp_num);
    }
    printf("\n");
    for (int q = 0; q < g_nqps; q++)
        for (int p = 0; p < g_nphases; p++) {
            unsigned long long b = 0;
            for (int t = q; t < g_nthreads; t += g_nqps)
                b += phase_bytes(t, p);
            printf("PLAN %u %d %llu\n", g_qp[q]->qp_num, p, b);
        }

    char line[64];
    if (g_wait && !fgets(line, sizeof line, stdin))
        return 2;
    /* RTR with a global route: traffic class 0x15 = DSCP 5, ECN 01. */
    for (int t = 0; t < g_nqps; t++) {
        struct ibv_qp_attr at = {.qp_state = IBV_QPS_RTR};
        at.ah_attr.is_global = 1;
        at.ah_attr.grh.traffic_class = 0x15;
        at.ah_attr.grh.hop_limit = 64;
        at.ah_attr.port_num = 1;
        if (A.modify_qp(g_qp[t], &at, IBV_QP_STATE | IBV_QP_AV))
            must(NULL, "ibv_modify_qp");
        if (at.ah_attr.grh.traffic_class != 0x15)
            must(NULL, "ibv_modify_qp left the caller's attr alone");
    }

    pthread_barrier_init(&g_start, NULL, g_nthreads + 1);
    pthread_barrier_init(&g_end, NULL, g_nthreads + 1);
    pthread_t th[8], poller_th;
    for (int t = 0; t < g_nthreads; t++)
        g_signaled[t] = calloc((size_t)g_nphases * g_nchains * 3 + 1, 1);
    for (int t = 0; t < g_nthreads; t++)
        pthread_create(&th[t], NULL, poster, (void *)(long)t);
    if (g_poll)
        pthread_create(&poller_th, NULL, poller, NULL);
    for (int p = 0; p < g_nphases; p++) {
        if (g_wait && p > 0 && !fgets(line, sizeof line, stdin))
            return 2;
        pthread_barrier_wait(&g_start);
        pthread_barrier_wait(&g_end);
        printf("POSTED %d\n", p);
    }
    for (int t = 0; t < g_nthreads; t++)
        pthread_join(th[t], NULL);

    if (g_poll) {
        __atomic_store_n(&g_stop_poll, 1, __ATOMIC_RELAXED);
        pthread_join(poller_th, NULL);
    }
    if (g_hold_poll && !fgets(line, sizeof line, stdin)) /* the test says when */
        return 2;
    int expected = 0;
    for (int t = 0; t < g_nthreads; t++)
        expected += g_expected[t];
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (completions + errors < expected) {
        for (int q = 0; q < g_nqps; q++)
            poll_count(q);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > g_poll_timeout)
            break;
        usleep(100);
    }
    /* error completions of unsignaled WRs still on their way */
    for (int k = 0; k < 20; k++) {
        for (int q = 0; q < g_nqps; q++)
            poll_count(q);
        usleep(1000);
    }
    /* --shim-stats, under the shim: how often it was refused the daemon's segment (permissions). */
    unsigned long long (*denied)(void) = (unsigned long long (*)(void))dlsym(RTLD_DEFAULT, "laxflow_shim_attach_denied");
    if (g_shim_stats && denied)
        printf("SHIM attach_denied=%llu\n", denied());
    printf("DONE completions=%d errors=%d unsignaled_errors=%d expected=%d\n", completions, errors, uerrors,
           expected);
    for (int t = 0; t < g_nqps; t++)
        A.destroy_qp(g_qp[t]);
    A.close_device(ctx);
    return completions + errors == expected ? 0 : 3;
}
