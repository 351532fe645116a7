/*
 * shim_core.c -- configuration, symbol resolution, segment attachment, fork
 * handling, the dlopen hook and the exported C API of liblaxflow_shim.so.
 *
 * Everything an intercepted call needs before it can decide anything lives
 * here.  lxf_init runs once per process (pthread_once) from the first
 * intercepted call on whatever thread makes it.  Nothing here exits or
 * aborts; the one thing it prints is a warning, once, when the daemon's
 * segment refuses this user (warn_denied).  When a symbol or the segment is
 * missing the shim passes calls through unchanged (fail open).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/syscall.h>
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
static uint64_t g_start_ticks;      /* our start time: (pid, start) is our identity */
static uint32_t g_gen;              /* +2 each time we move to a new segment, odd while moving */
static uint64_t g_next_check_ns;    /* rate limit of lxf_maintain */
/* The progress thread's view of the daemon's liveness, refreshed on each of
 * its turns, so that the post path reads a flag instead of the clock (a
 * clock read costs 20-150 ns, more than the whole open-gate path). */
static int g_live_cached;
static int g_live_valid;            /* set while a progress thread keeps it fresh */

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
    lxf_cfg.max_defer_ns = (uint64_t)env_long("LAXFLOW_MAX_DEFER_MS", LXF_DEFAULT_MAX_DEFER_MS, 1, 3600000) * 1000000ULL;
    lxf_cfg.disabled = (int)env_long("LAXFLOW_SHIM_DISABLE", 0, 0, 1);
    /* `laxflow run` sets 2 (collective) for NCCL/Gloo jobs: their QPs and
     * sockets carry no flow tags, yet the daemon must see their traffic. */
    lxf_cfg.default_stage = (uint32_t)env_long("LAXFLOW_DEFAULT_STAGE", 0, 0, 3);
    const char *pause = getenv("LAXFLOW_TEST_PAUSE_POST");
    if (pause && strlen(pause) < sizeof(lxf_cfg.test_pause_post) - 16)
        strcpy(lxf_cfg.test_pause_post, pause);
}

/* Field 22 of /proc/self/stat (start time in clock ticks since boot); 0 if
 * unreadable.  Raw syscalls only: also called in the atfork child. */
static uint64_t read_start_ticks(void)
{
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and ')' */
    if (!p)
        return 0;
    for (int field = 2; field < 22 && p; field++)
        p = strchr(p + 1, ' ');
    return p ? strtoull(p + 1, NULL, 10) : 0;
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
    lxf_real.listen = next_sym("listen", NULL);
    lxf_real.send = next_sym("send", NULL);
    lxf_real.sendmsg = next_sym("sendmsg", NULL);
    lxf_real.write = next_sym("write", NULL);
    lxf_real.writev = next_sym("writev", NULL);
    lxf_real.ibv_open_device = next_sym("ibv_open_device", "IBVERBS_1.1");
    lxf_real.ibv_close_device = next_sym("ibv_close_device", "IBVERBS_1.1");
    lxf_real.ibv_create_qp = next_sym("ibv_create_qp", "IBVERBS_1.1");
    lxf_real.ibv_modify_qp = next_sym("ibv_modify_qp", "IBVERBS_1.1");
    lxf_real.ibv_destroy_qp = next_sym("ibv_destroy_qp", "IBVERBS_1.1");
    lxf_real.ibv_qp_to_qp_ex = next_sym("ibv_qp_to_qp_ex", "IBVERBS_1.6");
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

/* Attach attempts refused for permissions (LXF_ATTACH_DENIED): the daemon's
 * segment is not shared with this process's user.  Read by
 * laxflow_shim_attach_denied; the first one is also said on stderr. */
static uint64_t g_attach_denied;
static int g_denied_warned;

static void warn_denied(void)
{
    __atomic_fetch_add(&g_attach_denied, 1, __ATOMIC_RELAXED);
    if (__atomic_exchange_n(&g_denied_warned, 1, __ATOMIC_RELAXED))
        return;
    /* The one message the shim ever prints: without it a job under another
     * user than the daemon's silently runs unscheduled. */
    char msg[640];
    int n = snprintf(msg, sizeof(msg),
                     "laxflow shim: cannot attach the node daemon's segment %s (/dev/shm%s): permission denied "
                     "for uid %u; this process's traffic passes through unscheduled. Fix: run the daemon with "
                     "--group GROUP (config key \"group\") and this job's user in GROUP.\n",
                     lxf_cfg.shm_name, lxf_cfg.shm_name, (unsigned)getuid());
    if (n > 0) {
        ssize_t w = syscall(SYS_write, 2, msg, (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
        (void)w;
    }
}

static struct lxf_segment *attach_segment(int *status)
{
    struct lxf_segment *seg = lxf_segment_attach(lxf_cfg.shm_name, status);
    if (LXF_UNLIKELY(*status == LXF_ATTACH_DENIED))
        warn_denied();
    return seg;
}

static struct lxf_segment *attach_live(void)
{
    int status;
    struct lxf_segment *seg = attach_segment(&status);
    if (seg && !lxf_segment_live(seg, lxf_now_ns(), lxf_cfg.stale_ns)) {
        lxf_segment_detach(seg);
        seg = NULL;
    }
    return seg;
}

/* Attach when unattached.  Called by lxf_init and lxf_maintain; the lock
 * serialises attach and re-attach. */
int lxf_try_attach(void)
{
    if (lxf_segment())
        return 1;
    if (lxf_cfg.disabled)
        return 0;
    pthread_mutex_lock(&g_attach_lock);
    if (!g_seg) {
        int status;
        struct lxf_segment *seg = attach_segment(&status);
        if (seg) {
            __atomic_store_n(&g_proc, lxf_proc_claim(seg, g_pid, g_start_ticks), __ATOMIC_RELEASE);
            __atomic_store_n(&g_seg, seg, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&g_attach_lock);
    return lxf_segment() != NULL;
}

/* The daemon restarted: its old segment is stale and the name maps a new,
 * live one.  Move to it.  The old mapping is replaced in place by zero pages
 * (never unmapped: other threads may still hold the pointer; they now read
 * "no tag, no permit" and pass through), so the unlinked segment's memory is
 * freed.  Work deferred under the old segment is released by the next
 * release pass (its generation no longer matches: fail open). */
static void try_reattach(struct lxf_segment *old)
{
    struct lxf_segment *seg = attach_live();
    if (!seg)
        return;
    if (seg->header.created_ns == old->header.created_ns && seg->header.daemon_pid == old->header.daemon_pid) {
        lxf_segment_detach(seg); /* the same segment, its daemon just slow */
        return;
    }
    pthread_mutex_lock(&g_attach_lock);
    if (g_seg != old) { /* another thread moved first */
        pthread_mutex_unlock(&g_attach_lock);
        lxf_segment_detach(seg);
        return;
    }
    struct lxf_proc *old_proc = g_proc;
    /* A sequence lock around the switch: the generation is odd while the
     * segment moves and even again once the new one is in place, so a post
     * that read the generation, then the segment and its flow tag, and finds
     * the same even generation afterwards knows that its segment and tag
     * belong together (lxf_qp_post). */
    __atomic_fetch_add(&g_gen, 1, __ATOMIC_ACQ_REL);
    __atomic_store_n(&g_proc, lxf_proc_claim(seg, g_pid, g_start_ticks), __ATOMIC_RELEASE);
    __atomic_store_n(&g_pass_through, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_seg, seg, __ATOMIC_RELEASE);
    __atomic_fetch_add(&g_gen, 1, __ATOMIC_ACQ_REL);
    __atomic_fetch_add(&seg->counters.reattaches, 1, __ATOMIC_RELAXED);
    if (old_proc && __atomic_load_n(&old_proc->pid, __ATOMIC_RELAXED) == g_pid)
        lxf_proc_release(old_proc);
    mmap(old, sizeof(*old), PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    pthread_mutex_unlock(&g_attach_lock);
    lxf_release_ready_all(0);
}

/* Keep the attachment right: attach to a daemon started after us, move to
 * a restarted daemon's new segment.  Called by the progress thread on every
 * turn and by every other entry point (sockets, the C API) so that processes
 * without verbs attach too; does real work at most every
 * LXF_ATTACH_RETRY_NS, and never blocks on the daemon. */
void lxf_maintain(void)
{
    if (lxf_cfg.disabled)
        return;
    uint64_t now = lxf_now_ns();
    uint64_t next = __atomic_load_n(&g_next_check_ns, __ATOMIC_RELAXED);
    if (now < next ||
        !__atomic_compare_exchange_n(&g_next_check_ns, &next, now + LXF_ATTACH_RETRY_NS, 0, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED))
        return; /* checked recently, or another thread is checking */
    lxf_in_shim++;
    struct lxf_segment *seg = lxf_segment();
    if (!seg)
        lxf_try_attach();
    else if (!lxf_segment_live(seg, now, lxf_cfg.stale_ns))
        try_reattach(seg);
    lxf_in_shim--;
}

uint32_t lxf_generation(void)
{
    return __atomic_load_n(&g_gen, __ATOMIC_ACQUIRE);
}

/* The segment of generation gen, or NULL once the shim has moved on (or is
 * moving).  The segment is read before the generation: try_reattach raises
 * the generation before it publishes a new segment, so an unchanged
 * generation means seg is still gen's.  Completions go through it: an event
 * of a replaced daemon's message never reaches its successor. */
struct lxf_segment *lxf_segment_of(uint32_t gen)
{
    struct lxf_segment *seg = lxf_segment();
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return lxf_generation() == gen ? seg : NULL;
}

uint32_t lxf_self_pid(void)
{
    return g_pid;
}

int lxf_daemon_live(void)
{
    if (__atomic_load_n(&g_live_valid, __ATOMIC_RELAXED))
        return __atomic_load_n(&g_live_cached, __ATOMIC_RELAXED);
    struct lxf_segment *seg = lxf_segment();
    return seg && lxf_segment_live(seg, lxf_now_ns(), lxf_cfg.stale_ns);
}

/* Progress thread, every turn (at most 1 ms apart). */
void lxf_refresh_live(void)
{
    struct lxf_segment *seg = lxf_segment();
    int live = seg && lxf_segment_live(seg, lxf_now_ns(), lxf_cfg.stale_ns);
    __atomic_store_n(&g_live_cached, live, __ATOMIC_RELAXED);
    __atomic_store_n(&g_live_valid, 1, __ATOMIC_RELAXED);
}

int lxf_gating(void)
{
    return lxf_segment() != NULL && !__atomic_load_n(&g_pass_through, __ATOMIC_RELAXED);
}

void lxf_set_pass_through(int on)
{
    __atomic_store_n(&g_pass_through, on, __ATOMIC_RELAXED);
}

int lxf_emit(uint32_t kind, uint64_t msg_id, const struct lxf_tag_value *tag, uint64_t handle)
{
    return lxf_emit_to(lxf_segment(), kind, msg_id, tag, handle);
}

int lxf_emit_to(struct lxf_segment *seg, uint32_t kind, uint64_t msg_id, const struct lxf_tag_value *tag,
                uint64_t handle)
{
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

/* Tests only: the window between a post's reads of its segment and flow tag
 * and its generation check, held open while LAXFLOW_TEST_PAUSE_POST's file
 * exists, so that a test can restart the daemon inside it.  PATH.waiting
 * says a poster is held.  Bounded to 10 s: a test gone wrong never wedges
 * the job. */
void lxf_test_pause_post(void)
{
    const char *path = lxf_cfg.test_pause_post;
    if (access(path, F_OK) != 0)
        return;
    char waiting[sizeof(lxf_cfg.test_pause_post)];
    strcpy(waiting, path);
    strcat(waiting, ".waiting");
    int fd = open(waiting, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0)
        close(fd);
    for (int i = 0; i < 10000 && access(path, F_OK) == 0; i++)
        usleep(1000);
    unlink(waiting);
}

/* ------------------------------------------------------------------ fork */

static void atfork_child(void)
{
    /* The child is a new process: new pid, no progress thread, and the
     * parent's deferred work requests and command slot are not its own. */
    g_pid = (uint32_t)getpid();
    g_start_ticks = read_start_ticks();
    g_next_check_ns = 0;
    g_live_valid = 0; /* no progress thread here until the child opens a device */
    pthread_mutex_init(&g_attach_lock, NULL);
    __atomic_store_n(&g_proc, NULL, __ATOMIC_RELEASE);
    struct lxf_segment *seg = lxf_segment();
    if (seg)
        __atomic_store_n(&g_proc, lxf_proc_claim(seg, g_pid, g_start_ticks), __ATOMIC_RELEASE);
    lxf_defer_atfork_child();
}

/* -------------------------------------------------------------------- init */

static void do_init(void)
{
    lxf_in_shim++;
    g_pid = (uint32_t)getpid();
    g_start_ticks = read_start_ticks();
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

static void *dlopen_self(const char *file, int mode)
{
    lxf_in_shim++;
    void *h = self_handle(mode);
    lxf_in_shim--;
    return h ? h : lxf_real.dlopen(file, mode);
}

static void *dlopen_enosys(const char *file, int mode)
{
    (void)file;
    (void)mode;
    errno = ENOSYS;
    return NULL;
}

/* Where the public dlopen goes, called with dlopen's own arguments by the
 * trampoline below.  glibc's dlopen searches the library path of its caller
 * (DT_RPATH / DT_RUNPATH with $ORIGIN), which it finds from its return
 * address; so the real dlopen must be reached by a jump that leaves the
 * application's return address in place, never by a call from the shim.
 * The trampoline guarantees that at any optimisation level or under a
 * sanitizer (a plain C wrapper only gets it when gcc happens to emit a
 * tail jump). */
__attribute__((used, visibility("hidden"))) void *lxf_dlopen_target(const char *file, int mode)
{
    (void)mode;
    lxf_init();
    if (LXF_UNLIKELY(!lxf_real.dlopen))
        return (void *)dlopen_enosys;
    if (file && !lxf_in_shim && !lxf_cfg.disabled && is_ibverbs_name(file))
        return (void *)dlopen_self;
    return (void *)lxf_real.dlopen;
}

/* dlopen: called by anything in the process that loads a library, notably
 * NCCL loading libibverbs.so(.1) for its IB transport.  Saves the two
 * arguments, asks lxf_dlopen_target where to go, restores them and jumps
 * there with the caller's return address untouched. */
#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlopen\n"
        ".type dlopen, @function\n"
        "dlopen:\n"
        ".cfi_startproc\n"
        "  pushq %rdi\n"
        ".cfi_adjust_cfa_offset 8\n"
        "  pushq %rsi\n"
        ".cfi_adjust_cfa_offset 8\n"
        "  subq $8, %rsp\n" /* the call needs a 16-byte aligned stack */
        ".cfi_adjust_cfa_offset 8\n"
        "  call lxf_dlopen_target\n"
        "  addq $8, %rsp\n"
        ".cfi_adjust_cfa_offset -8\n"
        "  popq %rsi\n"
        ".cfi_adjust_cfa_offset -8\n"
        "  popq %rdi\n"
        ".cfi_adjust_cfa_offset -8\n"
        "  jmp *%rax\n"
        ".cfi_endproc\n"
        ".size dlopen, .-dlopen\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl dlopen\n"
        ".type dlopen, %function\n"
        "dlopen:\n"
        ".cfi_startproc\n"
        "  stp x29, x30, [sp, #-32]!\n"
        ".cfi_def_cfa_offset 32\n"
        ".cfi_offset 29, -32\n"
        ".cfi_offset 30, -24\n"
        "  mov x29, sp\n"
        "  stp x0, x1, [sp, #16]\n"
        "  bl lxf_dlopen_target\n"
        "  mov x16, x0\n"
        "  ldp x0, x1, [sp, #16]\n"
        "  ldp x29, x30, [sp], #32\n"
        ".cfi_def_cfa_offset 0\n"
        "  br x16\n"
        ".cfi_endproc\n"
        ".size dlopen, .-dlopen\n");
#else
#error "liblaxflow_shim: dlopen trampoline written for x86_64 and aarch64 only"
#endif

/* ----------------------------------------------------------- exported API */

/* 1 when the shim is attached to a live daemon and gating traffic. Adapters
 * call it to decide whether to gate in their own layer as well. */
LXF_EXPORT int laxflow_shim_active(void)
{
    lxf_init();
    lxf_maintain();
    return lxf_gating() && lxf_daemon_live();
}

/* Called by adapters (the prefill hooks) when a request finishes computing
 * a layer: the daemon promotes stage-1 and stage-3 messages there. */
LXF_EXPORT int laxflow_shim_layer_boundary(uint64_t request_id, uint32_t layer)
{
    lxf_init();
    lxf_maintain();
    struct lxf_segment *seg = lxf_segment();
    if (!seg)
        return -1;
    struct lxf_tag_value tag = {.request_id = request_id, .layer = layer};
    lxf_emit(LXF_EV_LAYER_BOUNDARY, 0, &tag, 0);
    return 0;
}

/* How many times this process was refused the daemon's segment for
 * permissions (EACCES: the segment is mode 0600 and the daemon runs as
 * another user, or 0660 and this user is not in the daemon's group).  While
 * it grows, the process's traffic passes through unscheduled.  For tests and
 * tools that run inside the job (ctypes, dlsym). */
LXF_EXPORT uint64_t laxflow_shim_attach_denied(void)
{
    lxf_init();
    return __atomic_load_n(&g_attach_denied, __ATOMIC_RELAXED);
}

/* Post every deferred work request whose gate is now open, on the calling
 * thread; adapters call it right after the daemon opens a gate they wait on. */
LXF_EXPORT void laxflow_shim_progress(void)
{
    lxf_init();
    lxf_maintain();
    lxf_release_ready_all(0);
}
