/*
 * laxflow_nccl_profiler.c -- NCCL profiler plugin that reports each
 * collective's start and stop to the laxflow node daemon.
 *
 * NCCL loads libnccl-profiler-laxflow.so (NCCL_PROFILER_PLUGIN=<path>, set by
 * `laxflow run` when the plugin is built), looks up ncclProfiler_v6 or
 * ncclProfiler_v5, calls init once per communicator, then startEvent /
 * stopEvent around every collective from the thread that enqueues it.  For a
 * collective (ncclProfileColl) the plugin pushes into the daemon's segment:
 *
 *   start: SUBMIT     stage 2 (collective), msg_id new, request_id = the
 *                     communicator id, layer = the collective's sequence
 *                     number in the communicator, bytes = count x element size
 *   stop:  COMPLETION same msg_id and fields
 *
 * so the daemon sees collective boundaries (the MFS stage-2 messages and
 * their timing) without any change to the serving job.  Fails open like the
 * shim: no segment, a wrong layout or any allocation failure leaves the
 * plugin inert and NCCL never sees an error (init still returns success so
 * NCCL keeps running; the README allows only init to fail).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "laxflow_shm.h"
#include "nccl_profiler_abi.h"

#define LXF_EXPORT __attribute__((visibility("default")))

struct lxf_prof_ctx {
    struct lxf_segment *seg; /* NULL: inert */
    uint64_t comm_id;
    uint32_t pid;
};

struct lxf_prof_event {
    struct lxf_prof_ctx *ctx;
    struct lxf_event ev; /* the SUBMIT, reused for the COMPLETION */
};

/* Bytes of one element from NCCL's datatype name; 0 when unknown. */
static uint64_t elem_bytes(const char *dt)
{
    if (!dt)
        return 0;
    if (strstr(dt, "Float8") || strstr(dt, "Int8") || strstr(dt, "Uint8") || !strcmp(dt, "ncclChar"))
        return 1;
    if (strstr(dt, "16"))
        return 2;
    if (strstr(dt, "32") || !strcmp(dt, "ncclInt") || !strcmp(dt, "ncclFloat"))
        return 4;
    if (strstr(dt, "64") || !strcmp(dt, "ncclDouble"))
        return 8;
    return 0;
}

static ncclResult_t lxf_init(void **context, uint64_t commId, int *eActivationMask, const char *commName, int nNodes,
                             int nranks, int rank, ncclDebugLogger_t logfn)
{
    (void)commName, (void)nNodes, (void)nranks, (void)rank, (void)logfn;
    struct lxf_prof_ctx *ctx = calloc(1, sizeof(*ctx));
    if (!ctx) {
        *context = NULL;
        *eActivationMask = 0;
        return ncclSuccess;
    }
    const char *name = getenv("LAXFLOW_SHM_NAME");
    int status = 0;
    ctx->seg = lxf_segment_attach(name && *name ? name : "/laxflow", &status);
    ctx->comm_id = commId;
    ctx->pid = (uint32_t)getpid();
    *context = ctx;
    *eActivationMask = ctx->seg ? ncclProfileColl : 0;
    return ncclSuccess;
}

static ncclResult_t lxf_start(void *context, void **eHandle, lxfNcclEventDescr_t *d)
{
    struct lxf_prof_ctx *ctx = context;
    *eHandle = NULL;
    if (!ctx || !ctx->seg || !d || d->type != ncclProfileColl)
        return ncclSuccess;
    struct lxf_prof_event *e = malloc(sizeof(*e));
    if (!e)
        return ncclSuccess;
    e->ctx = ctx;
    e->ev = (struct lxf_event){
        .kind = LXF_EV_SUBMIT,
        .pid = ctx->pid,
        .msg_id = lxf_msg_id_alloc(ctx->seg),
        .request_id = ctx->comm_id,
        .bytes = (uint64_t)d->coll.count * elem_bytes(d->coll.datatype),
        .t_ns = lxf_now_ns(),
        .stage = LXF_STAGE_COLLECTIVE,
        .layer = (uint32_t)d->coll.seqNumber,
        .handle = 0,
    };
    lxf_event_push(ctx->seg, &e->ev); /* a full ring is counted by the segment */
    *eHandle = e;
    return ncclSuccess;
}

static ncclResult_t lxf_stop(void *eHandle)
{
    struct lxf_prof_event *e = eHandle;
    if (!e)
        return ncclSuccess;
    e->ev.kind = LXF_EV_COMPLETION;
    e->ev.t_ns = lxf_now_ns();
    lxf_event_push(e->ctx->seg, &e->ev);
    free(e);
    return ncclSuccess;
}

static ncclResult_t lxf_record(void *eHandle, ncclProfilerEventState_t eState, void *eStateArgs)
{
    (void)eHandle, (void)eState, (void)eStateArgs;
    return ncclSuccess;
}

static ncclResult_t lxf_finalize(void *context)
{
    struct lxf_prof_ctx *ctx = context;
    if (ctx) {
        if (ctx->seg)
            lxf_segment_detach(ctx->seg);
        free(ctx);
    }
    return ncclSuccess;
}

/* v6 and v5 differ only in descriptor members laxflow never reads. */
LXF_EXPORT const lxfNcclProfiler_t ncclProfiler_v6 = {"laxflow", lxf_init, lxf_start, lxf_stop, lxf_record, lxf_finalize};
LXF_EXPORT const lxfNcclProfiler_t ncclProfiler_v5 = {"laxflow", lxf_init, lxf_start, lxf_stop, lxf_record, lxf_finalize};
