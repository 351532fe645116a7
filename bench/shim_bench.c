/*
 * shim_bench.c -- the timed loops of bench/shim.py (built by it with gcc).
 *
 *   shim_bench post N REPS     ns per ibv_post_send of a 1-WR chain
 *   shim_bench defer N REPS    ns per WR to post N WRs on a tagged QP whose gate
 *                              is closed, open the gate and have them released
 *                              (without the shim: the same posts, gate ignored)
 *   shim_bench open N REPS     ns per ibv_post_send of a 1-WR chain on a QP tagged
 *                              with a message whose gate is open
 *   shim_bench idle            open a device (the shim's progress thread starts),
 *                              print "ready", wait for stdin to close
 *   shim_bench ring P N        events/s through the event ring, P producer
 *                              threads, one C consumer thread
 * Prints one number per rep (or one for ring).  Runs against the fake
 * libibverbs of tests/native (recording off), with or without the shim.
 * The segment named by LAXFLOW_SHM_NAME is created by bench/shim.py, which
 * also beats its heartbeat.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "laxflow_shm.h"

static struct ibv_context *g_ctx;
static struct ibv_qp *g_qp;
static struct ibv_cq *g_cq;
static char g_buf[4096];

static void setup_verbs(void)
{
    int n;
    struct ibv_device **devs = ibv_get_device_list(&n);
    g_ctx = ibv_open_device(devs[0]);
    struct ibv_pd *pd = ibv_alloc_pd(g_ctx);
    g_cq = ibv_create_cq(g_ctx, 65536, NULL, NULL, 0);
    struct ibv_qp_init_attr ia = {.send_cq = g_cq, .recv_cq = g_cq, .qp_type = IBV_QPT_RC};
    g_qp = ibv_create_qp(pd, &ia);
}

static void drain_cq(void)
{
    struct ibv_wc wc[64];
    while (ibv_poll_cq(g_cq, 64, wc) > 0) {
    }
}

static void post_one(uint64_t i)
{
    struct ibv_sge sge = {.addr = (uintptr_t)g_buf, .length = 64, .lkey = 1};
    struct ibv_send_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = (i % 64 == 63) ? IBV_SEND_SIGNALED : 0};
    struct ibv_send_wr *bad;
    if (ibv_post_send(g_qp, &wr, &bad))
        abort();
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void bench_post(long n, int reps)
{
    setup_verbs();
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = lxf_now_ns();
        for (long i = 0; i < n; i++) {
            post_one((uint64_t)i);
            if (i % 4096 == 4095)
                drain_cq();
        }
        uint64_t t1 = lxf_now_ns();
        drain_cq();
        printf("%.3f\n", (double)(t1 - t0) / (double)n);
    }
}

static void bench_defer(long n, int reps)
{
    setup_verbs();
    int status;
    struct lxf_segment *seg = lxf_segment_attach(getenv("LAXFLOW_SHM_NAME"), &status);
    void (*progress)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "laxflow_shim_progress");
    if (!seg) {
        fprintf(stderr, "no segment (status %d)\n", status);
        exit(2);
    }
    struct lxf_event sink[8192];
    for (int r = 0; r < reps; r++) {
        struct lxf_tag_value tag = {.msg_id = lxf_msg_id_alloc(seg), .request_id = 1, .bytes = (uint64_t)n * 64,
                                    .stage = LXF_STAGE_P2D, .layer = (uint32_t)r, .dscp = -1};
        lxf_tag_write(seg, (uint32_t)getpid(), LXF_TAG_QP, g_qp->qp_num, &tag);
        uint64_t t0 = lxf_now_ns();
        for (long i = 0; i < n; i++)
            post_one((uint64_t)i);
        lxf_permit_set(seg, tag.msg_id, LXF_GATE_OPEN, 0, 0);
        if (progress)
            progress(); /* what an adapter calls after a permit opens */
        uint64_t t1 = lxf_now_ns();
        drain_cq();
        while (lxf_event_pop_batch(seg, sink, 8192) > 0) {
        }
        printf("%.3f\n", (double)(t1 - t0) / (double)n);
    }
}

static void bench_open(long n, int reps)
{
    setup_verbs();
    int status;
    struct lxf_segment *seg = lxf_segment_attach(getenv("LAXFLOW_SHM_NAME"), &status);
    if (!seg) {
        fprintf(stderr, "no segment (status %d)\n", status);
        exit(2);
    }
    /* bytes 0: the message never ends, every post belongs to it */
    struct lxf_tag_value tag = {.msg_id = lxf_msg_id_alloc(seg), .request_id = 1, .stage = LXF_STAGE_P2D,
                                .dscp = -1};
    lxf_permit_set(seg, tag.msg_id, LXF_GATE_OPEN, 0, 0);
    lxf_tag_write(seg, (uint32_t)getpid(), LXF_TAG_QP, g_qp->qp_num, &tag);
    struct lxf_event sink[8192];
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = lxf_now_ns();
        for (long i = 0; i < n; i++) {
            post_one((uint64_t)i);
            if (i % 4096 == 4095)
                drain_cq();
        }
        uint64_t t1 = lxf_now_ns();
        drain_cq();
        while (lxf_event_pop_batch(seg, sink, 8192) > 0) {
        }
        printf("%.3f\n", (double)(t1 - t0) / (double)n);
    }
}

static void idle(void)
{
    setup_verbs();
    printf("ready\n");
    fflush(stdout);
    char buf[64];
    while (fgets(buf, sizeof buf, stdin)) {
    }
}

/* ------------------------------------------------------------------ ring */

static struct lxf_segment *g_seg;
static long g_per_producer;
static int g_producers_left;

static void *ring_producer(void *arg)
{
    struct lxf_event ev = {.kind = LXF_EV_SUBMIT, .handle = (uint64_t)(long)arg};
    for (long i = 0; i < g_per_producer; i++) {
        ev.msg_id = (uint64_t)i;
        while (lxf_event_push(g_seg, &ev) != 0)
            sched_yield();
    }
    __atomic_fetch_sub(&g_producers_left, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void bench_ring(int producers, long total)
{
    int status;
    g_seg = lxf_segment_attach(getenv("LAXFLOW_SHM_NAME"), &status);
    if (!g_seg)
        exit(2);
    g_per_producer = total / producers;
    g_producers_left = producers;
    pthread_t th[16];
    struct lxf_event out[1024];
    long got = 0, want = g_per_producer * producers;
    uint64_t t0 = lxf_now_ns();
    for (long p = 0; p < producers; p++)
        pthread_create(&th[p], NULL, ring_producer, (void *)p);
    while (got < want) {
        int n = lxf_event_pop_batch(g_seg, out, 1024);
        got += n;
        if (n == 0)
            sched_yield();
    }
    uint64_t t1 = lxf_now_ns();
    for (int p = 0; p < producers; p++)
        pthread_join(th[p], NULL);
    printf("%.0f\n", (double)got * 1e9 / (double)(t1 - t0));
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "idle") == 0) {
        idle();
        return 0;
    }
    if (argc < 4)
        return 2;
    if (strcmp(argv[1], "open") == 0)
        bench_open(atol(argv[2]), atoi(argv[3]));
    else if (strcmp(argv[1], "post") == 0)
        bench_post(atol(argv[2]), atoi(argv[3]));
    else if (strcmp(argv[1], "defer") == 0)
        bench_defer(atol(argv[2]), atoi(argv[3]));
    else if (strcmp(argv[1], "ring") == 0)
        bench_ring(atoi(argv[2]), atol(argv[3]));
    else
        return 2;
    return 0;
}
