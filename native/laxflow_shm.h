/*
 * laxflow_shm.h -- the shared-memory layout between the native shim (C, one
 * per process under LD_PRELOAD) and the node daemon (Python through cffi).
 *
 * This header is the single source of truth for the layout.  The part between
 * the LAXFLOW_CDEF_BEGIN and LAXFLOW_CDEF_END markers is handed verbatim to
 * cffi's cdef() by src/laxflow/protocol/shm_build.py, so it may contain only
 * what cffi parses: integer #defines, plain structs of fixed-width integers,
 * fixed-size arrays and prototypes.  No attributes, no _Atomic: every shared
 * word is accessed with __atomic builtins in shm.c, which both the shim and
 * the cffi module compile, so C and Python run the same ring code.
 *
 * One segment per node (POSIX shm, name configurable, mode 0600, or 0660 and
 * the daemon's configured group), created and owned by the daemon:
 *
 *   header     magic, layout version, daemon heartbeat, message-id allocator
 *   counters   drops and shim activity, for the daemon's metrics
 *   events     MPSC ring, shims and adapters -> daemon (submit, completion,
 *              layer boundary); a message is a layer's transfer or one
 *              collective, never a single work request
 *   procs      one slot per attached process, each with an MPSC command ring
 *              daemon -> shim
 *   permits    per message: gate open/closed, level, DSCP (written by the
 *              daemon, read lock-free by shims on the post path)
 *   tags       flow-tag registry written by adapters: which QP or socket of
 *              which process carries which message (request, stage, layer)
 *
 * Sections are padded to 64-byte cache lines by explicit pad fields so that C
 * and cffi agree without compiler attributes; tests/protocol checks it.
 */
#ifndef LAXFLOW_SHM_H
#define LAXFLOW_SHM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* LAXFLOW_CDEF_BEGIN */

#define LXF_SHM_MAGIC 0x4C58464C4F57534D
#define LXF_SHM_VERSION 3

#define LXF_EVENT_RING_SLOTS 65536
#define LXF_CMD_RING_SLOTS 256
#define LXF_MAX_PROCS 64
#define LXF_PERMIT_SLOTS 65536
#define LXF_TAG_SLOTS 4096
#define LXF_TAG_PROBES 16

/* default staleness of the daemon heartbeat, used when header.stale_ns is 0 */
#define LXF_DEFAULT_STALE_NS 100000000

/* A push gives up (dropped, counted) after this many failed tries: a corrupt
 * slot or a wedged ring never holds a posting thread. */
#define LXF_RING_PUSH_TRIES 4096
/* The consumer skips (counts) a slot claimed but not published for longer
 * than this: its producer died between claim and publish. */
#define LXF_RING_SKIP_NS 50000000

/* lxf_event.kind */
#define LXF_EV_SUBMIT 1
#define LXF_EV_COMPLETION 2
#define LXF_EV_LAYER_BOUNDARY 3

/* lxf_event.layer of a LAYER_BOUNDARY that says "the request's prefill
 * compute ended" (its stage-3 flows then promote on the period) */
#define LXF_LAYER_COMPUTE_DONE 0xFFFFFFFF

/* lxf_event.stage and lxf_tag_value.stage (DESIGN.md: the three stages) */
#define LXF_STAGE_NONE 0
#define LXF_STAGE_REUSE 1
#define LXF_STAGE_COLLECTIVE 2
#define LXF_STAGE_P2D 3

/* lxf_command.kind, daemon -> one process */
#define LXF_CMD_KICK 1
#define LXF_CMD_RELEASE_ALL 2
#define LXF_CMD_PASS_THROUGH 3
#define LXF_CMD_ENFORCE 4

/* permit gate */
#define LXF_GATE_CLOSED 0
#define LXF_GATE_OPEN 1

/* flow-tag kinds: what the handle of a tag is */
#define LXF_TAG_QP 1
#define LXF_TAG_SOCKET 2

/* lxf_segment_attach() status */
#define LXF_ATTACH_OK 0
#define LXF_ATTACH_NOENT 1
#define LXF_ATTACH_SHORT 2
#define LXF_ATTACH_BADMAGIC 3
#define LXF_ATTACH_BADVERSION 4
#define LXF_ATTACH_ERROR 5
#define LXF_ATTACH_DENIED 6 /* shm_open: EACCES, the segment is not shared with this user (daemon's group) */

/* permit word: msg_id (40 bits) << 24 | gate << 16 | dscp << 8 | level */
#define LXF_MSG_ID_BITS 40

struct lxf_header {
    uint64_t magic;          /* LXF_SHM_MAGIC, stored last by the creator */
    uint32_t version;        /* LXF_SHM_VERSION; shims pass through on mismatch */
    uint32_t permit_seq;     /* bumped (and futex-woken) by the daemon after it opens gates:
                                adapters' permit waiters sleep on it (lxf_permit_wait) */
    uint64_t segment_bytes;  /* sizeof(struct lxf_segment) of the creator */
    uint64_t heartbeat_ns;   /* CLOCK_MONOTONIC ns of the daemon's last beat; 0 = never */
    uint64_t stale_ns;       /* beat older than this = daemon gone (0: LXF_DEFAULT_STALE_NS) */
    uint64_t next_msg_id;    /* message-id allocator, fetch_add by lxf_msg_id_alloc */
    uint64_t created_ns;     /* CLOCK_MONOTONIC ns at creation */
    uint32_t daemon_pid;     /* pid of the creating daemon */
    uint32_t bell_armed;     /* 1 while the daemon sleeps until rung (lxf_bell_arm): the next event
                                pusher that takes it back to 0 rings the bell (see lxf_bell_path) */
};

struct lxf_counters {
    uint64_t events_dropped;   /* event pushes refused, ring full */
    uint64_t cmds_dropped;     /* command pushes refused, ring full */
    uint64_t tags_full;        /* tag writes refused, no free slot within LXF_TAG_PROBES */
    uint64_t wr_deferred;      /* work requests a shim queued because the gate was closed */
    uint64_t wr_released;      /* deferred work requests a shim later posted */
    uint64_t wr_failopen;      /* deferred work requests released without a permit: daemon stale,
                                  release-all or pass-through command, QP destroyed, internal error */
    uint64_t wr_post_errors;   /* deferred work requests the device refused at release */
    uint64_t shim_internal_errors; /* allocation failures and the like, each failed open */
    uint64_t events_skipped;   /* ring slots the consumer skipped: claimed and never published
                                  (producer died) or a corrupt sequence number, repaired */
    uint64_t reattaches;       /* shims that moved to this segment from a replaced one */
    uint64_t wr_defer_timeouts; /* deferred WRs released because they waited longer than the
                                   maximum deferral age (also in wr_failopen) */
    uint64_t injected_dropped; /* error completions a shim could not hold (buffer full) */
    uint64_t sock_tos_set;     /* setsockopt(IP_TOS) calls made because a socket's class changed */
    uint64_t sock_msgs;        /* socket messages (tagged socket, new msg_id) seen by shims */
    uint64_t pad[2];
};

/* One event, shim or adapter -> daemon.  56 bytes. */
struct lxf_event {
    uint32_t kind;        /* LXF_EV_* */
    uint32_t pid;         /* producing process */
    uint64_t msg_id;      /* message (0 for a layer boundary) */
    uint64_t request_id;  /* serving request the message belongs to */
    uint64_t bytes;       /* message size in bytes (0 unknown) */
    uint64_t t_ns;        /* CLOCK_MONOTONIC ns when produced */
    uint32_t stage;       /* LXF_STAGE_* */
    uint32_t layer;       /* model layer index */
    uint64_t handle;      /* qp_num or socket fd the message was seen on, 0 if none */
};

struct lxf_event_slot {
    uint64_t seq;         /* Vyukov sequence: == index when free, index+1 when full */
    struct lxf_event ev;
};

/* MPSC ring: producers claim with CAS on tail, one consumer advances head.
 * stall_pos / stall_since_ns are the consumer's own: the position + 1 of a
 * slot seen claimed but unpublished, and since when (LXF_RING_SKIP_NS). */
struct lxf_event_ring {
    uint64_t head;        /* consumer cursor (daemon only) */
    uint64_t stall_pos;
    uint64_t stall_since_ns;
    uint64_t head_pad[5];
    uint64_t tail;        /* producer claim cursor */
    uint64_t tail_pad[7];
    struct lxf_event_slot slots[LXF_EVENT_RING_SLOTS];
};

/* One command, daemon -> shim of one process.  24 bytes. */
struct lxf_command {
    uint32_t kind;        /* LXF_CMD_* */
    uint32_t arg;         /* command-specific */
    uint64_t msg_id;      /* message the command is about, 0 for all */
    uint64_t value;       /* command-specific */
};

struct lxf_cmd_slot {
    uint64_t seq;
    struct lxf_command cmd;
};

struct lxf_cmd_ring {
    uint64_t head;        /* consumer cursor (the shim's progress thread) */
    uint64_t stall_pos;
    uint64_t stall_since_ns;
    uint64_t head_pad[5];
    uint64_t tail;
    uint64_t tail_pad[7];
    struct lxf_cmd_slot slots[LXF_CMD_RING_SLOTS];
};

/* One attached process.  pid 0 = free; claimed with CAS by the shim.  A
 * process is (pid, start_ticks): a pid reused by a later process has another
 * start time, so the daemon never takes it for the process that attached. */
struct lxf_proc {
    uint32_t pid;
    uint32_t state;       /* reserved */
    uint64_t attach_ns;   /* CLOCK_MONOTONIC ns when claimed */
    uint64_t start_ticks; /* field 22 of /proc/<pid>/stat: start time in clock ticks since boot */
    uint64_t pad[5];
    struct lxf_cmd_ring cmds;
};

/* Permit of one message, one 64-bit word (see LXF_MSG_ID_BITS) so that a
 * shim reads it with one atomic load.  Slot = msg_id % LXF_PERMIT_SLOTS. */
struct lxf_permit {
    uint64_t word;
};

/* Decoded permit, filled by lxf_permit_get. */
struct lxf_permit_view {
    uint64_t msg_id;
    uint32_t gate;        /* LXF_GATE_* */
    uint32_t level;       /* software priority level, 0 = highest */
    uint32_t dscp;        /* DSCP, 0..63 */
    uint32_t pad;
};

/* What a flow tag says about the QP or socket it names. */
struct lxf_tag_value {
    uint64_t msg_id;      /* message now carried; 0 = none (traffic passes through) */
    uint64_t request_id;
    uint64_t bytes;       /* message size; 0 = unknown (ends when the tag changes) */
    uint32_t stage;       /* LXF_STAGE_* */
    uint32_t layer;
    int32_t dscp;         /* traffic class of the QP or socket, -1 = leave as is */
    uint32_t flags;       /* reserved */
};

/* One registry slot.  key = pid << 32 | kind << 28 | (handle & 0x0fffffff);
 * 0 = free.  Adapters claim a slot by CAS on key and update value under the
 * seqlock seq (odd while written); shims read it lock-free. */
struct lxf_flow_tag {
    uint64_t key;
    uint64_t seq;
    struct lxf_tag_value value;
};

struct lxf_segment {
    struct lxf_header header;
    struct lxf_counters counters;
    struct lxf_event_ring events;
    struct lxf_proc procs[LXF_MAX_PROCS];
    struct lxf_permit permits[LXF_PERMIT_SLOTS];
    struct lxf_flow_tag tags[LXF_TAG_SLOTS];
};

/* --- operations (shm.c), shared by the shim and the cffi module --- */

uint64_t lxf_now_ns(void);

/* Daemon side: create (mode 0600, fails if it exists) / remove a segment. */
struct lxf_segment *lxf_segment_create(const char *name, uint64_t stale_ns);
int lxf_segment_unlink(const char *name);
/* Either side: map an existing segment; *status gets LXF_ATTACH_*. */
struct lxf_segment *lxf_segment_attach(const char *name, int *status);
void lxf_segment_detach(struct lxf_segment *seg);

void lxf_heartbeat(struct lxf_segment *seg);
/* 1 when the daemon's heartbeat is younger than the segment's stale_ns
 * (or default_stale_ns when that is 0) at time now_ns. */
int lxf_segment_live(const struct lxf_segment *seg, uint64_t now_ns, uint64_t default_stale_ns);

uint64_t lxf_msg_id_alloc(struct lxf_segment *seg);

/* Rings: push returns 0, or -1 when full (counted); pop returns how many. */
int lxf_event_push(struct lxf_segment *seg, const struct lxf_event *ev);
int lxf_event_pop_batch(struct lxf_segment *seg, struct lxf_event *out, int max);
int lxf_cmd_push(struct lxf_segment *seg, struct lxf_proc *proc, const struct lxf_command *cmd);
int lxf_cmd_pop_batch(struct lxf_proc *proc, struct lxf_command *out, int max);

/* Process slots: claim returns NULL when all are taken.  A slot is found by
 * (pid, start_ticks); find matches the pid alone (the daemon's commands). */
struct lxf_proc *lxf_proc_claim(struct lxf_segment *seg, uint32_t pid, uint64_t start_ticks);
struct lxf_proc *lxf_proc_find(struct lxf_segment *seg, uint32_t pid);
void lxf_proc_release(struct lxf_proc *proc);

/* Permits: get returns 1 when the slot holds msg_id's permit, else 0. */
void lxf_permit_set(struct lxf_segment *seg, uint64_t msg_id, uint32_t gate, uint32_t level, uint32_t dscp);
int lxf_permit_get(const struct lxf_segment *seg, uint64_t msg_id, struct lxf_permit_view *out);
void lxf_permit_clear(struct lxf_segment *seg, uint64_t msg_id);

/* Flow tags: write returns 0, or -1 when no slot is free (counted);
 * read returns 1 when a tag for (pid, kind, handle) exists, else 0. */
int lxf_tag_write(struct lxf_segment *seg, uint32_t pid, uint32_t kind, uint64_t handle, const struct lxf_tag_value *value);
int lxf_tag_read(const struct lxf_segment *seg, uint32_t pid, uint32_t kind, uint64_t handle, struct lxf_tag_value *out);
int lxf_tag_remove(struct lxf_segment *seg, uint32_t pid, uint32_t kind, uint64_t handle);
int lxf_tag_clear_pid(struct lxf_segment *seg, uint32_t pid);

/* Doorbells, so that neither side polls.
 *
 * Producers -> daemon: the bell is a FIFO the daemon creates next to its
 * segment (lxf_bell_path: a name unique to this daemon instance) and holds
 * open for reading; before it blocks (poll on the FIFO and its sockets) it
 * arms the bell, and the first event push that sees it armed disarms it and
 * writes one byte.  A push never blocks on the bell (O_NONBLOCK; no reader:
 * nothing is written) and costs one atomic load when the daemon is awake.
 *
 * Daemon -> adapters: after a step that opened gates the daemon bumps
 * header.permit_seq and wakes its futex; a process waiting for a permit
 * sleeps on that word (lxf_permit_wait) instead of polling the table. */
#define LXF_BELL_PATH_MAX 96
/* Writes the bell's path for this segment into out (LXF_BELL_PATH_MAX bytes). */
void lxf_bell_path(const struct lxf_segment *seg, char *out);
/* Daemon: create the FIFO (0600) and open it for reading, non-blocking; the fd or -1. */
int lxf_bell_create(struct lxf_segment *seg);
/* Daemon: arm the bell; 1 when armed (the event ring is empty), 0 when events
 * are already waiting (not armed: drain them first). */
int lxf_bell_arm(struct lxf_segment *seg);
void lxf_bell_disarm(struct lxf_segment *seg);
/* Daemon: after publishing permits, bump permit_seq and wake its waiters. */
void lxf_permit_publish(struct lxf_segment *seg);
uint32_t lxf_permit_seq(const struct lxf_segment *seg);
/* Adapter: sleep until permit_seq differs from seq or timeout_ns passes;
 * 1 when it changed (or was already different), 0 on timeout. */
int lxf_permit_wait(struct lxf_segment *seg, uint32_t seq, uint64_t timeout_ns);

/* LAXFLOW_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* LAXFLOW_SHM_H */
