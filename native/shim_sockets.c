/*
 * shim_sockets.c -- TCP sockets: DSCP on connect / listen / accept / accept4,
 * socket flow tags on send / sendmsg / write / writev, and the per-thread tag
 * adapters set.
 *
 * Mooncake's TCP transport, Gloo and anything else that talks TCP reach the
 * network through connect() or accept(); setting IP_TOS (IPV6_TCLASS) there
 * marks the whole connection, SYN included on the connecting side.  The DSCP
 * comes from the calling thread's tag (laxflow_shim_set_tag, called by an
 * adapter around the code that opens the connection) or from the static rule
 * LAXFLOW_DSCP (`laxflow run --dscp N`, testbeds without a daemon).
 * Failures to set the option are ignored and errno is left as the real call
 * set it: tagging never changes what the caller sees.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "shim_internal.h"

struct lxf_thread_tag {
    int set;
    uint64_t request_id;
    uint32_t stage;
    uint32_t layer;
    int dscp;
};

static LXF_TLS __thread struct lxf_thread_tag t_tag;

int lxf_thread_dscp(void)
{
    return t_tag.set ? t_tag.dscp : -1;
}

/* Called by adapters on the thread that is about to open connections or
 * bring QPs to RTR for (request, stage, layer); dscp -1 leaves the class to
 * the static rule.  Returns 0, or -1 for a DSCP outside 0..63. */
LXF_EXPORT int laxflow_shim_set_tag(uint64_t request_id, uint32_t stage, uint32_t layer, int dscp)
{
    if (dscp < -1 || dscp > 63)
        return -1;
    t_tag = (struct lxf_thread_tag){1, request_id, stage, layer, dscp};
    return 0;
}

LXF_EXPORT void laxflow_shim_clear_tag(void)
{
    t_tag.set = 0;
}

static int socket_dscp(void)
{
    if (t_tag.set && t_tag.dscp >= 0)
        return t_tag.dscp;
    return lxf_cfg.static_dscp;
}

/* Mark fd with dscp if it is a TCP socket; family is the address family if
 * known.  Returns 1 if the option was set. */
static int set_class(int fd, int family, int dscp)
{
    int done = 0;
    int saved = errno;
    int type = 0;
    socklen_t len;
    len = sizeof(type);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM) {
        if (family == AF_UNSPEC) {
            len = sizeof(family);
            if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &family, &len) != 0)
                family = AF_UNSPEC;
        }
        int tos = dscp << 2; /* ECN bits stay with the kernel */
        if (family == AF_INET6) {
            setsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &tos, sizeof(tos));
            setsockopt(fd, IPPROTO_IP, IP_TOS, &tos, sizeof(tos)); /* v4-mapped peers */
            done = 1;
        } else if (family == AF_INET) {
            done = setsockopt(fd, IPPROTO_IP, IP_TOS, &tos, sizeof(tos)) == 0;
        }
    }
    errno = saved;
    return done;
}

/* ------------------------------------------------------------ flow tags */

/* Per-fd state of sockets that carried a tagged message.  The array is BSS:
 * pages of fds never tagged are never touched. */
#define LXF_MAX_FDS 65536

struct lxf_fd_state {
    int lock;
    int dscp_plus1;       /* class last set by us + 1; 0 = not set by us */
    uint32_t gen;         /* segment generation of msg */
    uint64_t msg;         /* message now carried, 0 none */
    uint64_t bytes;       /* bytes of msg written so far */
    int done;             /* its COMPLETION was sent */
    struct lxf_tag_value tag;
    int dflt;             /* LAXFLOW_DEFAULT_STAGE: a TCP connection of ours, untagged writes are messages */
    int dflt_dscp_plus1;  /* class of this socket's default-stage messages, from their permits; 0 none */
    uint64_t prev_dflt;   /* the last default-stage message, whose permit may hold the class */
    uint64_t switch_since; /* when a class change was first put off for unacknowledged bytes, ns; 0 none */
};

static struct lxf_fd_state g_fds[LXF_MAX_FDS];

static void fd_lock(struct lxf_fd_state *f)
{
    while (__atomic_exchange_n(&f->lock, 1, __ATOMIC_ACQUIRE))
        while (__atomic_load_n(&f->lock, __ATOMIC_RELAXED))
            __builtin_ia32_pause();
}

static void fd_unlock(struct lxf_fd_state *f)
{
    __atomic_store_n(&f->lock, 0, __ATOMIC_RELEASE);
}

/* A new connection on fd: whatever the number carried before is gone. */
static void fd_reset(int fd)
{
    if (fd < 0 || fd >= LXF_MAX_FDS)
        return;
    struct lxf_fd_state *f = &g_fds[fd];
    if (!__atomic_load_n(&f->msg, __ATOMIC_RELAXED) && !__atomic_load_n(&f->dscp_plus1, __ATOMIC_RELAXED))
        return;
    fd_lock(f);
    f->msg = 0;
    f->dscp_plus1 = 0;
    f->switch_since = 0;
    fd_unlock(f);
}

/* A class change waits for the connection to drain.  A TCP segment leaves in
 * the socket's class when it is (re)transmitted, so changing the class while
 * earlier bytes are unacknowledged moves them too, and two classes in flight
 * on one connection reorder at the switch's strict-priority queues (dup
 * ACKs, spurious retransmits, a collapsed window; measured on the testbed).
 * A blocking socket waits here (the write would block anyway) until the
 * bytes are acknowledged; a non-blocking one keeps its class and retries at
 * its next write.  Either way the change happens after LXF_CLASS_DRAIN_NS at
 * the latest: the permit's class must reach the wire. */
#define LXF_CLASS_DRAIN_NS (20ULL * 1000 * 1000)

static int unacked(int fd)
{
    int n = 0;
    return ioctl(fd, SIOCOUTQ, &n) == 0 ? n : 0;
}

static int class_switch_now(struct lxf_fd_state *f, int fd)
{
    if (!f->dscp_plus1 || unacked(fd) == 0) {
        f->switch_since = 0;
        return 1;
    }
    uint64_t now = lxf_now_ns();
    if (!f->switch_since)
        f->switch_since = now;
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0 && !(flags & O_NONBLOCK)) {
        struct timespec nap = {0, 100 * 1000};
        while (unacked(fd) > 0 && lxf_now_ns() - f->switch_since < LXF_CLASS_DRAIN_NS)
            nanosleep(&nap, NULL);
    }
    if (unacked(fd) > 0 && lxf_now_ns() - f->switch_since < LXF_CLASS_DRAIN_NS)
        return 0;
    f->switch_since = 0;
    return 1;
}

static void finish_msg(struct lxf_fd_state *f, int fd)
{
    struct lxf_segment *seg = f->msg && !f->done ? lxf_segment_of(f->gen) : NULL;
    if (seg)
        lxf_emit_to(seg, LXF_EV_COMPLETION, f->msg, &f->tag, (uint64_t)fd);
    f->msg = 0;
}

/* Before a write on fd: if an adapter tagged fd (Segment.tag_socket), a new
 * message starts (SUBMIT to the daemon) and the socket's class follows the
 * tag's DSCP, or the permit's when the tag leaves it open -- one setsockopt
 * only when the class changes.  Returns the state to account the written
 * bytes to, or NULL (untagged: pass through). */
static int is_tcp(int fd)
{
    int type = 0, family = 0;
    socklen_t len = sizeof(type);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM)
        return 0;
    len = sizeof(family);
    return getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &family, &len) == 0 && (family == AF_INET || family == AF_INET6);
}

static uint64_t write_len(size_t len, const struct iovec *iov, size_t iovcnt)
{
    uint64_t n = len;
    for (size_t i = 0; iov && i < iovcnt; i++)
        n += iov[i].iov_len;
    return n;
}

static struct lxf_fd_state *flow_before(int fd, size_t len, const struct iovec *iov, size_t iovcnt)
{
    uint32_t before = lxf_generation(); /* before the segment: see lxf_qp_post */
    struct lxf_segment *seg = lxf_segment();
    if (!seg || fd < 0 || fd >= LXF_MAX_FDS || !lxf_gating())
        return NULL;
    struct lxf_fd_state *f = &g_fds[fd];
    struct lxf_tag_value tag;
    int tagged = lxf_tag_read(seg, lxf_self_pid(), LXF_TAG_SOCKET, (uint64_t)fd, &tag) && tag.msg_id;
    int dflt = !tagged && __atomic_load_n(&f->dflt, __ATOMIC_RELAXED);
    if (!tagged && !dflt && !__atomic_load_n(&f->msg, __ATOMIC_RELAXED))
        return NULL;
    lxf_in_shim++;
    int saved = errno;
    if (dflt && !is_tcp(fd)) {
        /* The number was closed and reused for a file or pipe (close is not
         * ours to see): those writes are not network traffic. */
        __atomic_store_n(&f->dflt, 0, __ATOMIC_RELAXED);
        dflt = 0;
    }
    fd_lock(f);
    __atomic_thread_fence(__ATOMIC_ACQUIRE); /* seqlock reader: the reads above come first */
    uint32_t gen = lxf_generation();
    if (LXF_UNLIKELY(gen != before || (gen & 1))) {
        /* The shim moved to a restarted daemon after this write read its
         * tag from the old segment: this write goes untracked (fail open);
         * the next one reads the new segment. */
        fd_unlock(f);
        errno = saved;
        lxf_in_shim--;
        return NULL;
    }
    if (dflt) {
        /* LAXFLOW_DEFAULT_STAGE: each untagged write is one message of that
         * stage.  Its own permit comes after the write has started, so the
         * class is the one the daemon gave this socket's previous message. */
        struct lxf_permit_view pv;
        if (f->prev_dflt && lxf_permit_get(seg, f->prev_dflt, &pv) && pv.dscp < 64)
            f->dflt_dscp_plus1 = (int)pv.dscp + 1;
        uint64_t n = write_len(len, iov, iovcnt);
        tag = (struct lxf_tag_value){.msg_id = n ? lxf_msg_id_alloc(seg) : 0, .bytes = n,
                                     .stage = lxf_cfg.default_stage, .dscp = f->dflt_dscp_plus1 - 1};
        tagged = tag.msg_id != 0;
        if (tagged)
            f->prev_dflt = tag.msg_id;
    }
    if (!tagged || tag.msg_id != f->msg || f->gen != gen) {
        finish_msg(f, fd);
        if (tagged) {
            f->msg = tag.msg_id;
            f->tag = tag;
            f->gen = gen;
            f->bytes = 0;
            f->done = 0;
            lxf_emit_to(seg, LXF_EV_SUBMIT, tag.msg_id, &tag, (uint64_t)fd);
            LXF_COUNT(sock_msgs, 1);
        }
    }
    if (tagged) {
        int dscp = tag.dscp;
        struct lxf_permit_view pv;
        if (dscp < 0 && lxf_permit_get(seg, tag.msg_id, &pv))
            dscp = (int)pv.dscp;
        if (dscp >= 0 && dscp < 64 && dscp + 1 != f->dscp_plus1 && class_switch_now(f, fd) &&
            set_class(fd, AF_UNSPEC, dscp)) {
            f->dscp_plus1 = dscp + 1;
            LXF_COUNT(sock_tos_set, 1);
        }
    }
    fd_unlock(f);
    errno = saved;
    lxf_in_shim--;
    return tagged ? f : NULL;
}

/* After the write: count what the kernel took; the message completes when
 * its bytes are all written (a tag without bytes completes when the tag
 * moves on). */
static void flow_after(struct lxf_fd_state *f, int fd, ssize_t n)
{
    if (n <= 0)
        return;
    int saved = errno;
    lxf_in_shim++;
    fd_lock(f);
    f->bytes += (uint64_t)n;
    if (f->msg && !f->done && f->tag.bytes && f->bytes >= f->tag.bytes) {
        struct lxf_segment *seg = lxf_segment_of(f->gen);
        if (seg)
            lxf_emit_to(seg, LXF_EV_COMPLETION, f->msg, &f->tag, (uint64_t)fd);
        f->done = 1;
    }
    fd_unlock(f);
    lxf_in_shim--;
    errno = saved;
}

/* Static and thread-tag class at connection set-up. */
static void tag_socket(int fd, int family)
{
    int dscp = socket_dscp();
    fd_reset(fd);
    if (lxf_cfg.default_stage && fd >= 0 && fd < LXF_MAX_FDS) {
        struct lxf_fd_state *f = &g_fds[fd];
        fd_lock(f);
        f->dflt = is_tcp(fd);
        f->dflt_dscp_plus1 = 0;
        f->prev_dflt = 0;
        fd_unlock(f);
    }
    if (dscp < 0 || fd < 0)
        return;
    set_class(fd, family, dscp);
}

LXF_EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    lxf_init();
    lxf_maintain();
    if (LXF_UNLIKELY(!lxf_real.connect)) {
        errno = ENOSYS;
        return -1;
    }
    if (!lxf_in_shim && !lxf_cfg.disabled && addr && len >= sizeof(sa_family_t) &&
        (addr->sa_family == AF_INET || addr->sa_family == AF_INET6)) {
        lxf_in_shim++;
        tag_socket(fd, addr->sa_family); /* before the SYN leaves */
        lxf_in_shim--;
    }
    return lxf_real.connect(fd, addr, len);
}

LXF_EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
    lxf_init();
    lxf_maintain();
    if (LXF_UNLIKELY(!lxf_real.accept)) {
        errno = ENOSYS;
        return -1;
    }
    int c = lxf_real.accept(fd, addr, len);
    if (c >= 0 && !lxf_in_shim && !lxf_cfg.disabled) {
        lxf_in_shim++;
        tag_socket(c, AF_UNSPEC);
        lxf_in_shim--;
    }
    return c;
}

LXF_EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    lxf_init();
    lxf_maintain();
    if (LXF_UNLIKELY(!lxf_real.accept4)) {
        errno = ENOSYS;
        return -1;
    }
    int c = lxf_real.accept4(fd, addr, len, flags);
    if (c >= 0 && !lxf_in_shim && !lxf_cfg.disabled) {
        lxf_in_shim++;
        tag_socket(c, AF_UNSPEC);
        lxf_in_shim--;
    }
    return c;
}

/* The listening socket gets the class before it listens: the kernel sends
 * SYN-ACKs with the listener's TOS and accepted sockets inherit it, so an
 * accepted connection carries its class from its first packet. */
LXF_EXPORT int listen(int fd, int backlog)
{
    lxf_init();
    if (LXF_UNLIKELY(!lxf_real.listen)) {
        errno = ENOSYS;
        return -1;
    }
    lxf_maintain();
    if (!lxf_in_shim && !lxf_cfg.disabled) {
        lxf_in_shim++;
        tag_socket(fd, AF_UNSPEC);
        lxf_in_shim--;
    }
    return lxf_real.listen(fd, backlog);
}

/* Writes are frequent (files too): look at the attachment on one call in 64
 * per thread, so that the clock read of lxf_maintain stays off most writes. */
static void maintain_sometimes(void)
{
    static LXF_TLS __thread unsigned calls;
    if ((++calls & 63) == 0)
        lxf_maintain();
}

/* The four write calls of TCP senders (Mooncake's TCP transport, Gloo,
 * Python's socket module): untagged fds, no daemon and re-entry pass straight
 * through after one lookup. */
#define WRITE_WRAPPER(call, real_call, len, iov, iovcnt)       \
    lxf_init();                                                \
    if (LXF_UNLIKELY(!lxf_real.call)) {                        \
        errno = ENOSYS;                                        \
        return -1;                                             \
    }                                                          \
    if (lxf_in_shim || lxf_cfg.disabled)                       \
        return real_call;                                      \
    maintain_sometimes();                                      \
    struct lxf_fd_state *f = flow_before(fd, len, iov, iovcnt); \
    ssize_t n = real_call;                                     \
    if (f)                                                     \
        flow_after(f, fd, n);                                  \
    return n;

LXF_EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
    WRITE_WRAPPER(send, lxf_real.send(fd, buf, len, flags), len, NULL, 0)
}

LXF_EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
    WRITE_WRAPPER(sendmsg, lxf_real.sendmsg(fd, msg, flags), 0, msg ? msg->msg_iov : NULL,
                  msg ? msg->msg_iovlen : 0)
}

LXF_EXPORT ssize_t write(int fd, const void *buf, size_t len)
{
    WRITE_WRAPPER(write, lxf_real.write(fd, buf, len), len, NULL, 0)
}

LXF_EXPORT ssize_t writev(int fd, const struct iovec *iov, int iovcnt)
{
    WRITE_WRAPPER(writev, lxf_real.writev(fd, iov, iovcnt), 0, iov, iovcnt > 0 ? (size_t)iovcnt : 0)
}
