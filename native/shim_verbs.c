/*
 * shim_verbs.c -- the verbs entry points of liblaxflow_shim.so.
 *
 * Exported under the IBVERBS_1.1 version node (laxflow_shim.map) so that both
 * callers reach them: Mooncake links libibverbs and binds ibv_open_device@
 * IBVERBS_1.1 to the first definition, ours; NCCL dlopens libibverbs (our
 * dlopen hook hands it this library) and asks dlvsym(h, name, "IBVERBS_1.1").
 *
 * ibv_post_send and ibv_poll_cq are static inline in <infiniband/verbs.h>:
 * they call qp->context->ops.post_send and cq->context->ops.poll_cq.  So
 * ibv_open_device saves the provider's two pointers per context and puts
 * wrap_post_send / wrap_poll_cq in their place.  Both wrappers run on the
 * application's posting / polling threads (NCCL proxy threads, Mooncake
 * workers); their pass-through path takes no lock, allocates nothing and
 * writes nothing shared.
 *
 * Traffic class is per QP: it is fixed when the QP moves to RTR with an
 * address vector (ibv_modify_qp with IBV_QP_AV).  The class comes from, in
 * order: the calling thread's tag (laxflow_shim_set_tag), the QP's flow tag
 * in the registry (dscp >= 0), the static LAXFLOW_DSCP.  A message's level can
 * therefore reach the wire only by posting it on a QP of that class; adapters
 * keep one QP per class and peer (README: "traffic classes and QPs").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "shim_internal.h"

#define LXF_MAX_CTX 256

typedef struct ibv_qp *(*lxf_create_qp_ex_fn)(struct ibv_context *, struct ibv_qp_init_attr_ex *);
typedef struct ibv_cq_ex *(*lxf_create_cq_ex_fn)(struct ibv_context *, struct ibv_cq_init_attr_ex *);

struct lxf_ctx_entry {
    struct ibv_context *ctx;     /* NULL: free */
    lxf_post_send_fn post_send;  /* the provider's */
    lxf_poll_cq_fn poll_cq;
    lxf_create_qp_ex_fn create_qp_ex; /* verbs_context's, NULL if it has none */
    lxf_create_cq_ex_fn create_cq_ex;
};

static struct lxf_ctx_entry g_ctx[LXF_MAX_CTX];
static uint32_t g_n_ctx;
static pthread_mutex_t g_ctx_lock = PTHREAD_MUTEX_INITIALIZER;
/* Last provider functions seen: used if a context is somehow unknown, so a
 * wrapper always has a real function to call. */
static lxf_post_send_fn g_last_post_send;
static lxf_poll_cq_fn g_last_poll_cq;

static struct lxf_ctx_entry *ctx_find(struct ibv_context *ctx)
{
    uint32_t n = __atomic_load_n(&g_n_ctx, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n; i++)
        if (__atomic_load_n(&g_ctx[i].ctx, __ATOMIC_ACQUIRE) == ctx)
            return &g_ctx[i];
    return NULL;
}

lxf_post_send_fn lxf_real_post_send(struct ibv_context *ctx)
{
    struct lxf_ctx_entry *ce = ctx_find(ctx);
    return ce ? ce->post_send : g_last_post_send;
}

/* ------------------------------------------------------- ops-table wrappers */

static int wrap_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
    lxf_post_send_fn real = lxf_real_post_send(qp->context);
    if (LXF_UNLIKELY(lxf_in_shim))
        return real(qp, wr, bad_wr);
    /* A QP with state may hold deferred WRs: it goes through lxf_qp_post even
     * when gating is off, so that nothing overtakes its queue. */
    struct lxf_qp_state *qs = NULL;
    if (__atomic_load_n(&lxf_n_tracked, __ATOMIC_RELAXED))
        qs = lxf_qp_find(qp->context, qp->qp_num);
    if (LXF_LIKELY(!qs)) {
        if (!lxf_gating())
            return real(qp, wr, bad_wr);
        struct lxf_tag_value tag;
        if (!lxf_cfg.default_stage &&
            (!lxf_tag_read(lxf_segment(), lxf_self_pid(), LXF_TAG_QP, qp->qp_num, &tag) || tag.msg_id == 0))
            return real(qp, wr, bad_wr); /* untagged QP: pass through */
        qs = lxf_qp_claim(qp);
        if (!qs)
            return real(qp, wr, bad_wr);
    }
    lxf_in_shim++;
    int rc = lxf_qp_post(qs, wr, bad_wr, real);
    lxf_in_shim--;
    return rc;
}

static int wrap_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
    struct lxf_ctx_entry *ce = ctx_find(cq->context);
    lxf_poll_cq_fn real = ce ? ce->poll_cq : g_last_poll_cq;
    if (LXF_LIKELY(__atomic_load_n(&lxf_n_tracked, __ATOMIC_RELAXED) == 0 &&
                   __atomic_load_n(&lxf_n_injected, __ATOMIC_RELAXED) == 0) ||
        lxf_in_shim)
        return real(cq, num_entries, wc);
    lxf_in_shim++;
    int got = 0;
    if (__atomic_load_n(&lxf_n_injected, __ATOMIC_RELAXED))
        got = lxf_take_injected(cq, num_entries, wc);
    int r = 0;
    if (got < num_entries) {
        r = real(cq, num_entries - got, wc + got);
        if (r < 0) {
            lxf_in_shim--;
            return got ? got : r;
        }
    }
    if (r > 0)
        lxf_qp_on_completions(cq, wc + got, r);
    /* The caller's next call moves deferred work along, as the progress
     * thread does. */
    if (__atomic_load_n(&lxf_n_deferred, __ATOMIC_RELAXED))
        lxf_release_ready_all(0);
    lxf_in_shim--;
    return got + r;
}

/* verbs_context of ctx when it is extended and long enough to hold op. */
#define VCTX_HAS(ctx, op) verbs_get_ctx_op((ctx), op)

/* ibv_create_qp_ex (inline) calls this through verbs_context: QPs created
 * the new way get the same treatment as ibv_create_qp's, and their
 * ibv_qp_ex send builders are wrapped. */
static struct ibv_qp *wrap_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr)
{
    struct lxf_ctx_entry *ce = ctx_find(ctx);
    if (!ce || !ce->create_qp_ex) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    struct ibv_qp *qp = ce->create_qp_ex(ctx, attr);
    if (!qp || lxf_in_shim || lxf_cfg.disabled || !attr)
        return qp;
    lxf_in_shim++;
    if (attr->sq_sig_all)
        lxf_qp_set_sig_all(qp);
    if ((attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && lxf_real.ibv_qp_to_qp_ex) {
        struct ibv_qp_ex *qpx = lxf_real.ibv_qp_to_qp_ex(qp);
        if (qpx)
            lxf_qpx_install(qpx);
    }
    lxf_in_shim--;
    return qp;
}

static struct ibv_cq_ex *wrap_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr)
{
    struct lxf_ctx_entry *ce = ctx_find(ctx);
    if (!ce || !ce->create_cq_ex) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    struct ibv_cq_ex *cq = ce->create_cq_ex(ctx, attr);
    if (cq && !lxf_in_shim && !lxf_cfg.disabled) {
        lxf_in_shim++;
        lxf_cqx_install(cq);
        lxf_in_shim--;
    }
    return cq;
}

static void ctx_install(struct ibv_context *ctx)
{
    pthread_mutex_lock(&g_ctx_lock);
    struct lxf_ctx_entry *ce = NULL;
    for (uint32_t i = 0; i < g_n_ctx && !ce; i++)
        if (!g_ctx[i].ctx)
            ce = &g_ctx[i];
    if (!ce && g_n_ctx < LXF_MAX_CTX)
        ce = &g_ctx[g_n_ctx];
    if (ce) {
        ce->post_send = ctx->ops.post_send;
        ce->poll_cq = ctx->ops.poll_cq;
        struct verbs_context *vq = VCTX_HAS(ctx, create_qp_ex);
        struct verbs_context *vc = VCTX_HAS(ctx, create_cq_ex);
        ce->create_qp_ex = vq ? vq->create_qp_ex : NULL;
        ce->create_cq_ex = vc ? vc->create_cq_ex : NULL;
        g_last_post_send = ce->post_send;
        g_last_poll_cq = ce->poll_cq;
        __atomic_store_n(&ce->ctx, ctx, __ATOMIC_RELEASE);
        if (ce == &g_ctx[g_n_ctx])
            __atomic_store_n(&g_n_ctx, g_n_ctx + 1, __ATOMIC_RELEASE);
        /* Only now that the entry is findable may the wrappers be reached. */
        ctx->ops.post_send = wrap_post_send;
        ctx->ops.poll_cq = wrap_poll_cq;
        if (vq)
            vq->create_qp_ex = wrap_create_qp_ex;
        if (vc)
            vc->create_cq_ex = wrap_create_cq_ex;
    }
    /* table full: the context stays unwrapped, its traffic passes through */
    pthread_mutex_unlock(&g_ctx_lock);
}

static void ctx_remove(struct ibv_context *ctx)
{
    pthread_mutex_lock(&g_ctx_lock);
    struct lxf_ctx_entry *ce = ctx_find(ctx);
    if (ce) {
        ctx->ops.post_send = ce->post_send;
        ctx->ops.poll_cq = ce->poll_cq;
        struct verbs_context *v = verbs_get_ctx(ctx);
        if (ce->create_qp_ex)
            v->create_qp_ex = ce->create_qp_ex;
        if (ce->create_cq_ex)
            v->create_cq_ex = ce->create_cq_ex;
        __atomic_store_n(&ce->ctx, NULL, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_ctx_lock);
}

/* ------------------------------------------------------- exported symbols */

LXF_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    lxf_init();
    if (LXF_UNLIKELY(!lxf_real.ibv_open_device)) {
        errno = ENOSYS;
        return NULL;
    }
    struct ibv_context *ctx = lxf_real.ibv_open_device(device);
    if (!ctx || lxf_in_shim || lxf_cfg.disabled)
        return ctx;
    lxf_in_shim++;
    ctx_install(ctx);
    lxf_progress_start();
    lxf_in_shim--;
    return ctx;
}

LXF_EXPORT int ibv_close_device(struct ibv_context *context)
{
    lxf_init();
    if (LXF_UNLIKELY(!lxf_real.ibv_close_device))
        return -1;
    if (context && !lxf_in_shim)
        ctx_remove(context);
    return lxf_real.ibv_close_device(context);
}

LXF_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    lxf_init();
    if (LXF_UNLIKELY(!lxf_real.ibv_create_qp)) {
        errno = ENOSYS;
        return NULL;
    }
    struct ibv_qp *qp = lxf_real.ibv_create_qp(pd, attr);
    /* Completion tracking must know that every WR of this QP is signaled. */
    if (qp && attr && attr->sq_sig_all && !lxf_in_shim && !lxf_cfg.disabled)
        lxf_qp_set_sig_all(qp);
    return qp;
}

static int qp_dscp(struct ibv_qp *qp)
{
    int d = lxf_thread_dscp();
    if (d >= 0)
        return d;
    struct lxf_segment *seg = lxf_segment();
    struct lxf_tag_value tag;
    if (seg && lxf_tag_read(seg, lxf_self_pid(), LXF_TAG_QP, qp->qp_num, &tag) && tag.dscp >= 0 && tag.dscp < 64)
        return tag.dscp;
    return lxf_cfg.static_dscp;
}

LXF_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
    lxf_init();
    if (LXF_UNLIKELY(!lxf_real.ibv_modify_qp))
        return ENOSYS;
    if (lxf_in_shim || lxf_cfg.disabled || !qp || !attr || !(attr_mask & IBV_QP_AV) || !attr->ah_attr.is_global)
        return lxf_real.ibv_modify_qp(qp, attr, attr_mask);
    int dscp = qp_dscp(qp);
    if (dscp < 0)
        return lxf_real.ibv_modify_qp(qp, attr, attr_mask);
    /* The caller's attr is theirs: rewrite a copy.  DSCP is the upper six
     * bits of the traffic class; the two ECN bits are kept as given. */
    struct ibv_qp_attr copy = *attr;
    copy.ah_attr.grh.traffic_class = (uint8_t)((dscp << 2) | (attr->ah_attr.grh.traffic_class & 3));
    return lxf_real.ibv_modify_qp(qp, &copy, attr_mask);
}

LXF_EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
    lxf_init();
    if (LXF_UNLIKELY(!lxf_real.ibv_destroy_qp))
        return ENOSYS;
    if (qp && !lxf_in_shim) {
        lxf_in_shim++;
        lxf_qp_forget(qp);
        lxf_in_shim--;
    }
    return lxf_real.ibv_destroy_qp(qp);
}
