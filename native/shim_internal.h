/*
 * shim_internal.h -- what the files of liblaxflow_shim.so share.
 *
 * The shim is split by concern, each intercepted call in three layers
 * (public symbol, policy, real_ call):
 *   shim_core.c     configuration, real-symbol resolution (pthread_once),
 *                   re-entrancy guard, fork handlers, segment attach, the
 *                   dlopen hook and the small exported C API
 *   shim_verbs.c    ibv_open_device / ibv_close_device / ibv_create_qp /
 *                   ibv_modify_qp / ibv_destroy_qp and the ops-table
 *                   wrappers of post_send and poll_cq
 *   shim_defer.c    per-QP state: deferral queues of deep-copied WR chains,
 *                   release, completion tracking, the progress thread
 *   shim_sockets.c  connect / accept / accept4 and the per-thread tag
 *   shm.c           the shared-memory segment (also in the cffi module)
 * Only symbols marked LXF_EXPORT leave the library (-fvisibility=hidden and
 * laxflow_shim.map).
 */
#ifndef LAXFLOW_SHIM_INTERNAL_H
#define LAXFLOW_SHIM_INTERNAL_H

#include <infiniband/verbs.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "laxflow_shm.h"

#define LXF_EXPORT __attribute__((visibility("default")))
#define LXF_TLS __attribute__((tls_model("initial-exec")))
#define LXF_LIKELY(x) __builtin_expect(!!(x), 1)
#define LXF_UNLIKELY(x) __builtin_expect(!!(x), 0)

#define LXF_DEFAULT_MAX_DEFER_MS 300      /* LAXFLOW_MAX_DEFER_MS default */
#define LXF_ATTACH_RETRY_NS 20000000ULL   /* lxf_maintain does real work at most this often */

typedef int (*lxf_post_send_fn)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);
typedef int (*lxf_poll_cq_fn)(struct ibv_cq *, int, struct ibv_wc *);

/* The next definitions of every intercepted symbol, resolved once. */
struct lxf_real {
    void *(*dlopen)(const char *, int);
    int (*connect)(int, const struct sockaddr *, socklen_t);
    int (*accept)(int, struct sockaddr *, socklen_t *);
    int (*accept4)(int, struct sockaddr *, socklen_t *, int);
    int (*listen)(int, int);
    ssize_t (*send)(int, const void *, size_t, int);
    ssize_t (*sendmsg)(int, const struct msghdr *, int);
    ssize_t (*write)(int, const void *, size_t);
    ssize_t (*writev)(int, const struct iovec *, int);
    struct ibv_context *(*ibv_open_device)(struct ibv_device *);
    int (*ibv_close_device)(struct ibv_context *);
    struct ibv_qp *(*ibv_create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*ibv_modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
    int (*ibv_destroy_qp)(struct ibv_qp *);
    struct ibv_qp_ex *(*ibv_qp_to_qp_ex)(struct ibv_qp *); /* IBVERBS_1.6; NULL on older libibverbs */
};

/* Configuration, read from the environment once by lxf_init (the only place
 * the shim reads the environment). */
struct lxf_config {
    char shm_name[256];   /* LAXFLOW_SHM_NAME, default "/laxflow" */
    int static_dscp;      /* LAXFLOW_DSCP 0..63 for every TCP connection and QP; -1 none */
    uint64_t stale_ns;    /* LAXFLOW_STALE_MS, default LXF_DEFAULT_STALE_NS */
    uint32_t progress_us; /* LAXFLOW_PROGRESS_US, progress-thread period while WRs wait */
    uint64_t max_defer_ns; /* LAXFLOW_MAX_DEFER_MS: a deferred WR older than this is released */
    int disabled;         /* LAXFLOW_SHIM_DISABLE=1: pass everything through */
    uint32_t default_stage; /* LAXFLOW_DEFAULT_STAGE 1..3: stage of untagged QPs and TCP sockets; 0 none */
    /* LAXFLOW_TEST_PAUSE_POST=PATH, tests only: while PATH exists, a post
     * that has read its segment and flow tag waits there (see
     * lxf_test_pause_post); empty when unset, and then never looked at again. */
    char test_pause_post[256];
};

extern struct lxf_real lxf_real;
extern struct lxf_config lxf_cfg;
extern LXF_TLS __thread int lxf_in_shim;

/* shim_core.c */
void lxf_init(void);
uint32_t lxf_self_pid(void);                /* getpid(), cached and refreshed after fork */
struct lxf_segment *lxf_segment(void);     /* attached segment or NULL (acquire) */
int lxf_try_attach(void);                  /* attach if unattached; 1 if attached */
void lxf_maintain(void);                   /* every entry point: late attach, re-attach (rate-limited) */
uint32_t lxf_generation(void);             /* +2 at each move to a new segment; odd while moving */
struct lxf_segment *lxf_segment_of(uint32_t gen); /* the segment while still on generation gen, else NULL */
struct lxf_proc *lxf_proc(void);           /* this process's command slot or NULL */
int lxf_daemon_live(void);                 /* segment attached, heartbeat fresh */
void lxf_refresh_live(void);               /* progress thread: refresh the cached liveness */
int lxf_gating(void);                      /* segment attached and gating not switched off */
void lxf_set_pass_through(int on);         /* LXF_CMD_PASS_THROUGH / LXF_CMD_ENFORCE */
/* Add n to a counter of the attached segment, if any (field of lxf_counters). */
#define LXF_COUNT(field, n)                                                        \
    do {                                                                           \
        struct lxf_segment *lxf_s_ = lxf_segment();                                \
        uint64_t lxf_n_ = (n);                                                     \
        if (lxf_s_ && lxf_n_)                                                      \
            __atomic_fetch_add(&lxf_s_->counters.field, lxf_n_, __ATOMIC_RELAXED); \
    } while (0)
/* Push an event; 0, or -1 when unattached or the ring is full (counted). */
int lxf_emit(uint32_t kind, uint64_t msg_id, const struct lxf_tag_value *tag, uint64_t handle);
/* The same into a given segment: the one a caller read its tag from. */
int lxf_emit_to(struct lxf_segment *seg, uint32_t kind, uint64_t msg_id, const struct lxf_tag_value *tag,
                uint64_t handle);
/* Tests only (LAXFLOW_TEST_PAUSE_POST): hold the calling thread while the file exists. */
void lxf_test_pause_post(void);

/* shim_verbs.c */
lxf_post_send_fn lxf_real_post_send(struct ibv_context *ctx);

/* shim_verbs_ex.c: wrap the send builders of a qp_ex / the polling of a cq_ex */
void lxf_qpx_install(struct ibv_qp_ex *qpx);
void lxf_cqx_install(struct ibv_cq_ex *cq);
int lxf_thread_dscp(void);                 /* shim_sockets.c: current thread tag's DSCP or -1 */

/* shim_defer.c */
struct lxf_qp_state;
struct lxf_qp_state *lxf_qp_find(struct ibv_context *ctx, uint32_t qp_num);
struct lxf_qp_state *lxf_qp_claim(struct ibv_qp *qp);
void lxf_qp_set_sig_all(struct ibv_qp *qp);
int lxf_qp_post(struct lxf_qp_state *qs, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr,
                lxf_post_send_fn real);
void lxf_qp_on_completions(struct ibv_cq *cq, struct ibv_wc *wc, int n);
int lxf_take_injected(struct ibv_cq *cq, int max, struct ibv_wc *wc);
void lxf_qp_forget(struct ibv_qp *qp);
void lxf_qp_release_all(struct lxf_qp_state *qs);
void lxf_release_ready_all(int force);
void lxf_progress_start(void);
void lxf_defer_atfork_child(void);
extern uint32_t lxf_n_tracked;             /* QPs with state; 0 keeps poll_cq a pass-through */
extern uint32_t lxf_n_deferred;            /* WRs waiting in all queues */
extern uint32_t lxf_n_injected;            /* synthetic error completions waiting */

#endif
