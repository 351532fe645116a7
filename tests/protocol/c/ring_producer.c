/*
 * ring_producer.c -- C producers of shim events, for tests/protocol and bench.
 *
 *   ring_producer NAME NTHREADS NEVENTS [--no-retry]
 *
 * Attaches to segment NAME and has NTHREADS threads each push NEVENTS events
 * (handle = thread index, msg_id = 1..NEVENTS, request_id = pid), retrying
 * while the ring is full unless --no-retry.  Prints
 * "done pushed=P dropped=D ns=ELAPSED".  Built from native/shm.c: the code
 * the shim pushes with.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "laxflow_shm.h"

static struct lxf_segment *g_seg;
static long g_n;
static int g_retry = 1;
static unsigned long long g_pushed, g_dropped;
static pthread_barrier_t g_go;

static void *producer(void *arg)
{
    unsigned long long t = (unsigned long long)(long)arg, pushed = 0, dropped = 0;
    struct lxf_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = LXF_EV_SUBMIT;
    ev.pid = (uint32_t)getpid();
    ev.request_id = (uint64_t)getpid();
    ev.handle = t;
    ev.stage = LXF_STAGE_P2D;
    pthread_barrier_wait(&g_go);
    for (long i = 1; i <= g_n; i++) {
        ev.msg_id = (uint64_t)i;
        ev.bytes = (uint64_t)i * 64;
        ev.layer = (uint32_t)(i % 80);
        while (lxf_event_push(g_seg, &ev) != 0) {
            if (!g_retry) {
                dropped++;
                goto next;
            }
            sched_yield();
        }
        pushed++;
    next:;
    }
    __atomic_fetch_add(&g_pushed, pushed, __ATOMIC_RELAXED);
    __atomic_fetch_add(&g_dropped, dropped, __ATOMIC_RELAXED);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    int status;
    g_seg = lxf_segment_attach(argv[1], &status);
    if (!g_seg) {
        fprintf(stderr, "attach %s: status %d\n", argv[1], status);
        return 2;
    }
    int nthreads = atoi(argv[2]);
    g_n = atol(argv[3]);
    g_retry = !(argc > 4 && strcmp(argv[4], "--no-retry") == 0);
    pthread_t th[64];
    pthread_barrier_init(&g_go, NULL, nthreads + 1);
    for (long t = 0; t < nthreads; t++)
        pthread_create(&th[t], NULL, producer, (void *)t);
    uint64_t t0 = lxf_now_ns();
    pthread_barrier_wait(&g_go);
    for (int t = 0; t < nthreads; t++)
        pthread_join(th[t], NULL);
    printf("done pushed=%llu dropped=%llu ns=%llu\n", g_pushed, g_dropped,
           (unsigned long long)(lxf_now_ns() - t0));
    return 0;
}
