/*
 * nccl_profiler_abi.h -- the part of NCCL's profiler plugin ABI laxflow uses,
 * written from NCCL's documented, versioned interface (NCCL 2.30.7:
 * plugins/profiler/README.md, "Struct versioning" and "API"; the struct
 * layouts of plugins/profiler/example/nccl/profiler_v5.h and profiler_v6.h,
 * and the event-type bits of plugins/profiler/example/nccl/profiler.h).
 * The NCCL wheels (nvidia-nccl-cu12) ship nccl.h but no profiler headers,
 * so a plugin carries its own copy of the definitions it implements, as the
 * README advises ("plugins should copy the ncclProfiler_vX definitions they
 * support to their internal includes").
 *
 * Only what laxflow reads is spelled out; the descriptor union is sized by
 * its largest v6 member (ceColl) so NCCL may write any member.  v5 and v6
 * share the header fields and the layout of the `coll` member.
 */
#ifndef LAXFLOW_NCCL_PROFILER_ABI_H
#define LAXFLOW_NCCL_PROFILER_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum { ncclSuccess = 0, ncclSystemError = 2, ncclInternalError = 3 } ncclResult_t;

typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char *file, int line, const char *fmt, ...);

/* event-type bits (profiler.h) */
enum {
    ncclProfileGroup = 1 << 0,
    ncclProfileColl = 1 << 1, /* one collective of a communicator */
    ncclProfileP2p = 1 << 2,
    ncclProfileCollApi = 1 << 9,
};

typedef int ncclProfilerEventState_t; /* states: unused by laxflow */

typedef struct {
    uint64_t type;   /* ncclProfile* bit of this event */
    void *parentObj; /* handle of the parent event, or NULL */
    int rank;        /* originating rank */
    union {
        struct {
            uint64_t seqNumber; /* collective's sequence number in its communicator */
            const char *func;   /* "AllReduce", "AllToAll", ... */
            void const *sendBuff;
            void *recvBuff;
            size_t count;         /* elements */
            int root;
            const char *datatype; /* "ncclFloat32", ... */
            uint8_t nChannels;
            uint8_t nWarps;
            const char *algo;
            const char *proto;
            void *parentGroup;
        } coll;
        /* v6 ceColl, the largest member: reserves the union's full size */
        struct {
            uint64_t seqNumber;
            const char *func;
            void const *sendBuff;
            void *recvBuff;
            size_t count;
            int root;
            const char *datatype;
            const char *syncStrategy;
            bool intraBatchSync;
            uint32_t batchSize;
            uint32_t numBatches;
            uint32_t ceSeqNum;
            void *stream;
        } ceColl;
    };
} lxfNcclEventDescr_t;

/* ncclProfiler_v5_t and ncclProfiler_v6_t have this shape. */
typedef struct {
    const char *name;
    ncclResult_t (*init)(void **context, uint64_t commId, int *eActivationMask, const char *commName, int nNodes,
                         int nranks, int rank, ncclDebugLogger_t logfn);
    ncclResult_t (*startEvent)(void *context, void **eHandle, lxfNcclEventDescr_t *eDescr);
    ncclResult_t (*stopEvent)(void *eHandle);
    ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_t eState, void *eStateArgs);
    ncclResult_t (*finalize)(void *context);
} lxfNcclProfiler_t;

#endif
