/*
 * shim_sockets.c -- TCP sockets: DSCP on connect / accept / accept4, and the
 * per-thread tag adapters set.
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
#include <netinet/in.h>
#include <netinet/ip.h>
#include <sys/socket.h>

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

/* Mark fd if it is a TCP socket; family is the address family if known. */
static void tag_socket(int fd, int family)
{
    int dscp = socket_dscp();
    if (dscp < 0 || fd < 0)
        return;
    int saved = errno;
    int type = 0;
    socklen_t len = sizeof(type);
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
        } else if (family == AF_INET) {
            setsockopt(fd, IPPROTO_IP, IP_TOS, &tos, sizeof(tos));
        }
    }
    errno = saved;
}

LXF_EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    lxf_init();
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
