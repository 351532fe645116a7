/*
 * shim_core.c -- configuration, symbol resolution, segment attachment, fork
 * handling, the dlopen hook and the exported C API of liblaxflow_shim.so.
 *
 * Everything an intercepted call needs before it can decide anything lives
 * here.  lxf_init runs once per process (pthread_once) from the first
 * intercepted call on whatever thread makes it.  Nothing here exits, aborts
 * or prints: when a symbol or the segment is missing the shim passes calls
 * through unchanged (fail open).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shim_internal.h"

struct lxf_real lxf_real;
struct lxf_config lxf_cfg = {.static_dscp = -1};
LXF_TLS __thread int lxf_in_shim;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_attach_lock = PTHREAD_MUTEX_INITIALIZER;
static struct lxf_segment *g_seg;   /* set once attached, read with acquire */
static struct lxf_proc *g_proc;     /* our command-ring slot */
static int g_pass_through;          /* daemon said LXF_CMD_PASS_THROUGH */
static uint32_t g_pid;

/* ----------------------------------------------------------- configuration */

static long env_long(const char *name, long dflt, long lo, long hi)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return dflt; /* `laxflow run` validates these before they get here */
    return v;
}

static void load_config(void)
{
    const char *name = getenv("LAXFLOW_SHM_NAME");
    if (!name || !*name || strlen(name) >= sizeof(lxf_cfg.shm_name))
        name = "/laxflow";
    strcpy(lxf_cfg.shm_name, name);
    lxf_cfg.static_dscp = (int)env_long("LAXFLOW_DSCP", -1, 0, 63);
    lxf_cfg.stale_ns = (uint64_t)env_long("LAXFLOW_STALE_MS", LXF_DEFAULT_STALE_NS / 1000000, 1, 3600000) * 1000000ULL;
    lxf_cfg.progress_us = (uint32_t)env_long("LAXFLOW_PROGRESS_US", 50, 1, 1000000);
    lxf_cfg.disabled = (int)env_long("LAXFLOW_SHIM_DISABLE", 0, 0, 1);
}

/* -------------------------------------------------------- real symbols */

static void *next_sym(const char *name, const char *version)
{
    void *p = version ? dlvsym(RTLD_NEXT, name, version) : NULL;
    return p ? p : dlsym(RTLD_NEXT, name);
}

static void resolve_symbols(void)
{
    lxf_real.dlopen = next_sym("dlopen", NULL);
    lxf_real.connect = next_sym("connect", NULL);
    lxf_real.accept = next_sym("accept", NULL);
    lxf_real.accept4 = next_sym("accept4", NULL);
    lxf_real.ibv_open_device = next_sym("ibv_open_device", "IBVERBS_1.1");
    lxf_real.ibv_close_device = next_sym("ibv_close_device", "IBVERBS_1.1");
    lxf_real.ibv_create_qp = next_sym("ibv_create_qp", "IBVERBS_1.1");
    lxf_real.ibv_modify_qp = next_sym("ibv_modify_qp", "IBVERBS_1.1");
    lxf_real.ibv_destroy_qp = next_sym("ibv_destroy_qp", "IBVERBS_1.1");
}

/* ------------------------------------------------------------ the segment */

struct lxf_segment *lxf_segment(void)
{
    return __atomic_load_n(&g_seg, __ATOMIC_ACQUIRE);
}

struct lxf_proc *lxf_proc(void)
{
    return __atomic_load_n(&g_proc, __ATOMIC_ACQUIRE);
}

/* Called by lxf_init and, while unattached, by the progress thread about
 * once a second, so a daemon started after the job is picked up. */
int lxf_try_attach(void)
{
    if (lxf_segment())
        return 1;
    if (lxf_cfg.disabled)
        return 0;
    pthread_mutex_lock(&g_attach_lock);
    if (!g_seg) {
        int status;
        struct lxf_segment *seg = lxf_segment_attach(lxf_cfg.shm_name, &status);
        if (seg) {
            __atomic_store_n(&g_proc, lxf_proc_claim(seg, g_pid), __ATOMIC_RELEASE);
            __atomic_store_n(&g_seg, seg, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&g_attach_lock);
    return lxf_segment() != NULL;
}

uint32_t lxf_self_pid(void)
{
    return g_pid;
}

int lxf_daemon_live(void)
{
    struct lxf_segment *seg = lxf_segment();
    return seg && lxf_segment_live(seg, lxf_now_ns(), lxf_cfg.stale_ns);
}

int lxf_gating(void)
{
    return lxf_segment() != NULL && !__atomic_load_n(&g_pass_through, __ATOMIC_RELAXED);
}

void lxf_set_pass_through(int on)
{
    __atomic_store_n(&g_pass_through, on, __ATOMIC_RELAXED);
}

void lxf_count(uint64_t *counter, uint64_t n)
{
    if (lxf_segment() && n)
        __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}

int lxf_emit(uint32_t kind, uint64_t msg_id, const struct lxf_tag_value *tag, uint64_t handle)
{
    struct lxf_segment *seg = lxf_segment();
    if (!seg)
        return -1;
    struct lxf_event ev = {
        .kind = kind,
        .pid = g_pid,
        .msg_id = msg_id,
        .request_id = tag ? tag->request_id : 0,
        .bytes = tag ? tag->bytes : 0,
        .t_ns = lxf_now_ns(),
        .stage = tag ? tag->stage : 0,
        .layer = tag ? tag->layer : 0,
        .handle = handle,
    };
    return lxf_event_push(seg, &ev);
}

/* ------------------------------------------------------------------ fork */

static void atfork_child(void)
{
    /* The child is a new process: new pid, no progress thread, and the
     * parent's deferred work requests and command slot are not its own. */
    g_pid = (uint32_t)getpid();
    pthread_mutex_init(&g_attach_lock, NULL);
    __atomic_store_n(&g_proc, NULL, __ATOMIC_RELEASE);
    struct lxf_segment *seg = lxf_segment();
    if (seg)
        __atomic_store_n(&g_proc, lxf_proc_claim(seg, g_pid), __ATOMIC_RELEASE);
    lxf_defer_atfork_child();
}

/* -------------------------------------------------------------------- init */

static void do_init(void)
{
    lxf_in_shim++;
    g_pid = (uint32_t)getpid();
    load_config();
    resolve_symbols();
    pthread_atfork(NULL, NULL, atfork_child);
    lxf_try_attach();
    lxf_in_shim--;
}

void lxf_init(void)
{
    pthread_once(&g_once, do_init);
}

__attribute__((destructor)) static void lxf_fini(void)
{
    struct lxf_proc *p = lxf_proc();
    if (p && __atomic_load_n(&p->pid, __ATOMIC_RELAXED) == g_pid)
        lxf_proc_release(p);
}

/* ------------------------------------------------------------ dlopen hook */

static int is_ibverbs_name(const char *file)
{
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    return strncmp(base, "libibverbs.so", 13) == 0;
}

/* A handle on this library itself, so that NCCL's dlvsym(handle, "ibv_...",
 * "IBVERBS_1.1") finds the wrappers first and, through our DT_NEEDED on the
 * real libibverbs, everything we do not override. */
static void *self_handle(int mode)
{
    Dl_info info;
    if (!dladdr((void *)&lxf_init, &info) || !info.dli_fname)
        return NULL;
    return lxf_real.dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_NOW | (mode & RTLD_GLOBAL));
}

/* Called by anything in the process that dlopens, notably NCCL when it loads
 * libibverbs.so(.1) for its IB transport. */
LXF_EXPORT void *dlopen(const char *file, int mode)
{
    lxf_init();
    if (LXF_UNLIKELY(!lxf_real.dlopen)) {
        errno = ENOSYS;
        return NULL;
    }
    if (file && !lxf_in_shim && !lxf_cfg.disabled && is_ibverbs_name(file)) {
        lxf_in_shim++;
        void *h = self_handle(mode);
        lxf_in_shim--;
        if (h)
            return h;
    }
    return lxf_real.dlopen(file, mode);
}

/* ----------------------------------------------------------- exported API */

/* 1 when the shim is attached to a live daemon and gating traffic. Adapters
 * call it to decide whether to gate in their own layer as well. */
LXF_EXPORT int laxflow_shim_active(void)
{
    lxf_init();
    return lxf_gating() && lxf_daemon_live();
}

/* Called by adapters (the prefill hooks) when a request finishes computing
 * a layer: the daemon promotes stage-1 and stage-3 messages there. */
LXF_EXPORT int laxflow_shim_layer_boundary(uint64_t request_id, uint32_t layer)
{
    lxf_init();
    struct lxf_segment *seg = lxf_segment();
    if (!seg)
        return -1;
    struct lxf_tag_value tag = {.request_id = request_id, .layer = layer};
    lxf_emit(LXF_EV_LAYER_BOUNDARY, 0, &tag, 0);
    return 0;
}

/* Post every deferred work request whose gate is now open, on the calling
 * thread; adapters call it right after the daemon opens a gate they wait on. */
LXF_EXPORT void laxflow_shim_progress(void)
{
    lxf_init();
    lxf_release_ready_all(0);
}
