/*
 * shm.c -- operations on the shared-memory segment of laxflow_shm.h.
 *
 * Compiled twice: into liblaxflow_shim.so (hidden symbols, called by the shim
 * on application threads and its progress thread) and into the cffi module
 * laxflow.protocol._shm (called by the daemon and by tests from Python).
 * Nothing here allocates after create/attach, takes a lock or logs, so the
 * shim may call it on its hot path; the one system call an event push may
 * make is the doorbell's, once per daemon sleep (see laxflow_shm.h).  Every shared word goes through __atomic
 * builtins; the rings are Dmitry Vyukov's bounded queue (per-slot sequence
 * numbers), lock-free for any number of producers and one consumer.
 */
#define _GNU_SOURCE
#include "laxflow_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define LOAD_RLX(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define STORE_RLX(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define ADD_RLX(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)

#define MSG_ID_MASK ((1ULL << LXF_MSG_ID_BITS) - 1)
#define TAG_TOMBSTONE 1ULL /* a freed registry slot; never a valid key (pid >= 1) */

uint64_t lxf_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------- segment */

static void init_rings(struct lxf_segment *seg)
{
    for (uint64_t i = 0; i < LXF_EVENT_RING_SLOTS; i++)
        seg->events.slots[i].seq = i;
    for (int p = 0; p < LXF_MAX_PROCS; p++)
        for (uint64_t i = 0; i < LXF_CMD_RING_SLOTS; i++)
            seg->procs[p].cmds.slots[i].seq = i;
}

/* Where a new segment's message ids start: the wall clock in microseconds,
 * modulo the id's 40 bits (a lap is 12.7 days).  A restarted daemon's first
 * id is then the time elapsed since its predecessor started past that one's
 * first id, so the ids the predecessor handed out -- above all its last ones,
 * which shims and adapters may still hold -- lie behind the new ones, unless
 * it allocated more than one id per microsecond over its life or the wall
 * clock was stepped back by more than the restart took.  Until then a stale
 * message can never be taken for one of the new daemon's (a permit, a
 * completion, an open message of a shim). */
static uint64_t first_msg_id(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t us = (uint64_t)ts.tv_sec * 1000000ULL + (uint64_t)ts.tv_nsec / 1000ULL;
    uint64_t id = us & MSG_ID_MASK;
    return id ? id : 1;
}

struct lxf_segment *lxf_segment_create(const char *name, uint64_t stale_ns)
{
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return NULL;
    /* shm_open's mode is filtered by the umask; the segment must be 0600. */
    fchmod(fd, 0600);
    if (ftruncate(fd, (off_t)sizeof(struct lxf_segment)) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        errno = e;
        return NULL;
    }
    void *p = mmap(NULL, sizeof(struct lxf_segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(name);
        errno = e;
        return NULL;
    }
    struct lxf_segment *seg = p;
    init_rings(seg);
    seg->header.version = LXF_SHM_VERSION;
    seg->header.segment_bytes = sizeof(struct lxf_segment);
    seg->header.stale_ns = stale_ns;
    seg->header.next_msg_id = first_msg_id();
    seg->header.created_ns = lxf_now_ns();
    seg->header.heartbeat_ns = seg->header.created_ns;
    seg->header.daemon_pid = (uint32_t)getpid();
    /* Attachers check the magic first: publish it only once all is set. */
    STORE_REL(&seg->header.magic, LXF_SHM_MAGIC);
    return seg;
}

int lxf_segment_unlink(const char *name)
{
    return shm_unlink(name);
}

struct lxf_segment *lxf_segment_attach(const char *name, int *status)
{
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
        *status = errno == ENOENT ? LXF_ATTACH_NOENT : errno == EACCES ? LXF_ATTACH_DENIED : LXF_ATTACH_ERROR;
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < sizeof(struct lxf_header)) {
        close(fd);
        *status = LXF_ATTACH_SHORT;
        return NULL;
    }
    /* Map the header alone first: a segment of another layout version may
     * have another size, and its header is all we may read of it. */
    struct lxf_header *h = mmap(NULL, sizeof(struct lxf_header), PROT_READ, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) {
        close(fd);
        *status = LXF_ATTACH_ERROR;
        return NULL;
    }
    uint64_t magic = LOAD_ACQ(&h->magic);
    uint32_t version = h->version;
    uint64_t bytes = h->segment_bytes;
    munmap(h, sizeof(struct lxf_header));
    if (magic != LXF_SHM_MAGIC) {
        close(fd);
        *status = LXF_ATTACH_BADMAGIC;
        return NULL;
    }
    if (version != LXF_SHM_VERSION || bytes != sizeof(struct lxf_segment)) {
        close(fd);
        *status = LXF_ATTACH_BADVERSION;
        return NULL;
    }
    if ((uint64_t)st.st_size < sizeof(struct lxf_segment)) {
        close(fd);
        *status = LXF_ATTACH_SHORT;
        return NULL;
    }
    void *p = mmap(NULL, sizeof(struct lxf_segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        *status = LXF_ATTACH_ERROR;
        return NULL;
    }
    *status = LXF_ATTACH_OK;
    return p;
}

void lxf_segment_detach(struct lxf_segment *seg)
{
    if (seg)
        munmap(seg, sizeof(struct lxf_segment));
}

void lxf_heartbeat(struct lxf_segment *seg)
{
    STORE_REL(&seg->header.heartbeat_ns, lxf_now_ns());
}

int lxf_segment_live(const struct lxf_segment *seg, uint64_t now_ns, uint64_t default_stale_ns)
{
    uint64_t beat = LOAD_ACQ(&seg->header.heartbeat_ns);
    uint64_t stale = LOAD_RLX(&seg->header.stale_ns);
    if (stale == 0)
        stale = default_stale_ns;
    if (beat == 0)
        return 0;
    /* A beat slightly in the future (another CPU's clock read) is live. */
    return now_ns <= beat || now_ns - beat <= stale;
}

uint64_t lxf_msg_id_alloc(struct lxf_segment *seg)
{
    for (;;) {
        uint64_t id = ADD_RLX(&seg->header.next_msg_id, 1) & MSG_ID_MASK;
        if (id != 0)
            return id;
    }
}

/* ------------------------------------------------------------------ rings */

/* One generic Vyukov enqueue/dequeue over slots laid out as {seq, payload}.
 * Every loop is bounded: a producer never waits on the consumer or on another
 * producer for more than LXF_RING_PUSH_TRIES tries. */
static int ring_push(uint64_t *tail, uint64_t *slot0, size_t slot_words, uint64_t nslots,
                     const void *payload, size_t payload_bytes)
{
    uint64_t pos = LOAD_RLX(tail);
    for (int tries = 0; tries < LXF_RING_PUSH_TRIES; tries++) {
        uint64_t *slot = slot0 + (pos & (nslots - 1)) * slot_words;
        uint64_t seq = LOAD_ACQ(slot);
        int64_t dif = (int64_t)(seq - pos);
        if (dif == 0) {
            if (__atomic_compare_exchange_n(tail, &pos, pos + 1, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
                memcpy(slot + 1, payload, payload_bytes);
                /* A CAS, not a store: if the consumer gave up on this slot
                 * (we were stalled past LXF_RING_SKIP_NS) it has moved the
                 * sequence on, and the event is dropped instead. */
                uint64_t expect = pos;
                return __atomic_compare_exchange_n(slot, &expect, pos + 1, 0, __ATOMIC_RELEASE,
                                                   __ATOMIC_RELAXED) ? 0 : -1;
            }
            /* CAS failure reloaded pos */
        } else if (dif < 0) {
            return -1; /* full */
        } else {
            pos = LOAD_RLX(tail);
        }
    }
    return -1; /* a corrupt slot or endless contention: drop, never spin */
}

/* stall[0] = position + 1 of a slot seen claimed but unpublished, stall[1] =
 * since when.  Consumer-only state, kept in the segment so that a restarted
 * consumer (or the shim after fork) continues it.  Returns slots skipped. */
static int ring_pop_batch(uint64_t *head, const uint64_t *tail, uint64_t *stall, uint64_t *slot0,
                          size_t slot_words, uint64_t nslots, void *out, size_t payload_bytes, int max,
                          int *skipped)
{
    uint64_t pos = LOAD_RLX(head);
    int n = 0;
    *skipped = 0;
    while (n < max) {
        uint64_t *slot = slot0 + (pos & (nslots - 1)) * slot_words;
        uint64_t seq = LOAD_ACQ(slot);
        if (seq == pos + 1) {
            memcpy((char *)out + (size_t)n * payload_bytes, slot + 1, payload_bytes);
            STORE_REL(slot, pos + nslots);
            pos++;
            n++;
            continue;
        }
        int claimed = LOAD_ACQ(tail) != pos;
        if (seq == pos) {
            if (!claimed)
                break; /* empty */
            /* Claimed, not yet published: normally a producer between its
             * two steps; past the bound, one that died there. */
            uint64_t now = lxf_now_ns();
            if (stall[0] != pos + 1) {
                stall[0] = pos + 1;
                stall[1] = now;
                break;
            }
            if (now - stall[1] < LXF_RING_SKIP_NS)
                break;
        } else if (!claimed) {
            /* A corrupt free slot at the tail: producers cannot claim it.
             * Put its sequence back; nothing to deliver. */
            if (__atomic_compare_exchange_n(slot, &seq, pos, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
                (*skipped)++;
            break;
        }
        /* Skip it: free it for the next round.  A CAS, so that a producer
         * publishing just now wins and is read on the next turn. */
        if (__atomic_compare_exchange_n(slot, &seq, pos + nslots, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
            (*skipped)++;
            pos++;
        }
    }
    STORE_REL(head, pos);
    return n;
}

static void bell_after_push(struct lxf_segment *seg);

int lxf_event_push(struct lxf_segment *seg, const struct lxf_event *ev)
{
    struct lxf_event_ring *r = &seg->events;
    if (ring_push(&r->tail, (uint64_t *)r->slots, sizeof(r->slots[0]) / 8, LXF_EVENT_RING_SLOTS,
                  ev, sizeof(*ev)) == 0) {
        bell_after_push(seg);
        return 0;
    }
    ADD_RLX(&seg->counters.events_dropped, 1);
    return -1;
}

int lxf_event_pop_batch(struct lxf_segment *seg, struct lxf_event *out, int max)
{
    struct lxf_event_ring *r = &seg->events;
    int skipped;
    int n = ring_pop_batch(&r->head, &r->tail, &r->stall_pos, (uint64_t *)r->slots, sizeof(r->slots[0]) / 8,
                           LXF_EVENT_RING_SLOTS, out, sizeof(*out), max, &skipped);
    if (skipped)
        ADD_RLX(&seg->counters.events_skipped, (uint64_t)skipped);
    return n;
}

int lxf_cmd_push(struct lxf_segment *seg, struct lxf_proc *proc, const struct lxf_command *cmd)
{
    struct lxf_cmd_ring *r = &proc->cmds;
    if (ring_push(&r->tail, (uint64_t *)r->slots, sizeof(r->slots[0]) / 8, LXF_CMD_RING_SLOTS,
                  cmd, sizeof(*cmd)) == 0)
        return 0;
    ADD_RLX(&seg->counters.cmds_dropped, 1);
    return -1;
}

int lxf_cmd_pop_batch(struct lxf_proc *proc, struct lxf_command *out, int max)
{
    struct lxf_cmd_ring *r = &proc->cmds;
    int skipped;
    return ring_pop_batch(&r->head, &r->tail, &r->stall_pos, (uint64_t *)r->slots, sizeof(r->slots[0]) / 8,
                          LXF_CMD_RING_SLOTS, out, sizeof(*out), max, &skipped);
}

/* ------------------------------------------------------------------ procs */

struct lxf_proc *lxf_proc_find(struct lxf_segment *seg, uint32_t pid)
{
    for (int i = 0; i < LXF_MAX_PROCS; i++)
        if (LOAD_ACQ(&seg->procs[i].pid) == pid)
            return &seg->procs[i];
    return NULL;
}

struct lxf_proc *lxf_proc_claim(struct lxf_segment *seg, uint32_t pid, uint64_t start_ticks)
{
    for (int i = 0; i < LXF_MAX_PROCS; i++)
        if (LOAD_ACQ(&seg->procs[i].pid) == pid && LOAD_ACQ(&seg->procs[i].start_ticks) == start_ticks)
            return &seg->procs[i];
    for (int i = 0; i < LXF_MAX_PROCS; i++) {
        uint32_t expect = 0;
        if (__atomic_compare_exchange_n(&seg->procs[i].pid, &expect, pid, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED)) {
            STORE_REL(&seg->procs[i].start_ticks, start_ticks);
            STORE_RLX(&seg->procs[i].attach_ns, lxf_now_ns());
            return &seg->procs[i];
        }
    }
    return NULL;
}

void lxf_proc_release(struct lxf_proc *proc)
{
    /* Commands still queued are dropped with the slot: skip them so that the
     * next owner starts on an empty ring. */
    struct lxf_command scratch[16];
    while (lxf_cmd_pop_batch(proc, scratch, 16) > 0) {
    }
    STORE_RLX(&proc->start_ticks, 0);
    STORE_REL(&proc->pid, 0);
}

/* ---------------------------------------------------------------- permits */

void lxf_permit_set(struct lxf_segment *seg, uint64_t msg_id, uint32_t gate, uint32_t level, uint32_t dscp)
{
    uint64_t word = ((msg_id & MSG_ID_MASK) << 24) | ((uint64_t)(gate & 0xff) << 16) |
                    ((uint64_t)(dscp & 0xff) << 8) | (level & 0xff);
    STORE_REL(&seg->permits[msg_id % LXF_PERMIT_SLOTS].word, word);
}

int lxf_permit_get(const struct lxf_segment *seg, uint64_t msg_id, struct lxf_permit_view *out)
{
    uint64_t word = LOAD_ACQ(&seg->permits[msg_id % LXF_PERMIT_SLOTS].word);
    if ((word >> 24) != (msg_id & MSG_ID_MASK) || msg_id == 0)
        return 0;
    out->msg_id = msg_id;
    out->gate = (uint32_t)(word >> 16) & 0xff;
    out->dscp = (uint32_t)(word >> 8) & 0xff;
    out->level = (uint32_t)word & 0xff;
    out->pad = 0;
    return 1;
}

void lxf_permit_clear(struct lxf_segment *seg, uint64_t msg_id)
{
    uint64_t *w = &seg->permits[msg_id % LXF_PERMIT_SLOTS].word;
    uint64_t cur = LOAD_ACQ(w);
    if ((cur >> 24) == (msg_id & MSG_ID_MASK))
        __atomic_compare_exchange_n(w, &cur, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}

/* -------------------------------------------------------------- flow tags */

static uint64_t tag_key(uint32_t pid, uint32_t kind, uint64_t handle)
{
    return ((uint64_t)pid << 32) | ((uint64_t)(kind & 0xf) << 28) | (handle & 0x0fffffffULL);
}

static uint32_t tag_hash(uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (uint32_t)key & (LXF_TAG_SLOTS - 1);
}

/* Index of key's slot, or -1.  Probing stops at a never-used slot (0);
 * tombstones keep chains intact. */
static int tag_find(const struct lxf_segment *seg, uint64_t key)
{
    uint32_t h = tag_hash(key);
    for (int i = 0; i < LXF_TAG_PROBES; i++) {
        uint32_t idx = (h + (uint32_t)i) & (LXF_TAG_SLOTS - 1);
        uint64_t k = LOAD_ACQ(&seg->tags[idx].key);
        if (k == key)
            return (int)idx;
        if (k == 0)
            return -1;
    }
    return -1;
}

int lxf_tag_write(struct lxf_segment *seg, uint32_t pid, uint32_t kind, uint64_t handle, const struct lxf_tag_value *value)
{
    uint64_t key = tag_key(pid, kind, handle);
    int idx = tag_find(seg, key);
    if (idx < 0) {
        uint32_t h = tag_hash(key);
        for (int i = 0; i < LXF_TAG_PROBES && idx < 0; i++) {
            uint32_t j = (h + (uint32_t)i) & (LXF_TAG_SLOTS - 1);
            uint64_t k = LOAD_ACQ(&seg->tags[j].key);
            if ((k == 0 || k == TAG_TOMBSTONE) &&
                __atomic_compare_exchange_n(&seg->tags[j].key, &k, key, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
                idx = (int)j;
            else if (k == key)
                idx = (int)j; /* another writer claimed it for the same key */
        }
    }
    if (idx < 0) {
        ADD_RLX(&seg->counters.tags_full, 1);
        return -1;
    }
    struct lxf_flow_tag *t = &seg->tags[idx];
    /* Seqlock writer: take the sequence from even to odd (serialises writers). */
    uint64_t s = LOAD_RLX(&t->seq);
    for (;;) {
        if ((s & 1) == 0 &&
            __atomic_compare_exchange_n(&t->seq, &s, s + 1, 1, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            break;
        s = LOAD_RLX(&t->seq);
    }
    __atomic_thread_fence(__ATOMIC_RELEASE);
    STORE_RLX(&t->value.msg_id, value->msg_id);
    STORE_RLX(&t->value.request_id, value->request_id);
    STORE_RLX(&t->value.bytes, value->bytes);
    STORE_RLX(&t->value.stage, value->stage);
    STORE_RLX(&t->value.layer, value->layer);
    STORE_RLX(&t->value.dscp, value->dscp);
    STORE_RLX(&t->value.flags, value->flags);
    STORE_REL(&t->seq, s + 2);
    return 0;
}

int lxf_tag_read(const struct lxf_segment *seg, uint32_t pid, uint32_t kind, uint64_t handle, struct lxf_tag_value *out)
{
    uint64_t key = tag_key(pid, kind, handle);
    int idx = tag_find(seg, key);
    if (idx < 0)
        return 0;
    const struct lxf_flow_tag *t = &seg->tags[idx];
    for (int attempt = 0; attempt < 64; attempt++) {
        uint64_t s1 = LOAD_ACQ(&t->seq);
        if (s1 & 1)
            continue;
        out->msg_id = LOAD_RLX(&t->value.msg_id);
        out->request_id = LOAD_RLX(&t->value.request_id);
        out->bytes = LOAD_RLX(&t->value.bytes);
        out->stage = LOAD_RLX(&t->value.stage);
        out->layer = LOAD_RLX(&t->value.layer);
        out->dscp = LOAD_RLX(&t->value.dscp);
        out->flags = LOAD_RLX(&t->value.flags);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (LOAD_RLX(&t->seq) == s1 && LOAD_ACQ(&t->key) == key)
            return 1;
    }
    return 0; /* a writer kept it busy: treat as untagged (fail open) */
}

int lxf_tag_remove(struct lxf_segment *seg, uint32_t pid, uint32_t kind, uint64_t handle)
{
    uint64_t key = tag_key(pid, kind, handle);
    int idx = tag_find(seg, key);
    if (idx < 0)
        return 0;
    /* Readers re-check the key after reading, so freeing is one store. */
    __atomic_compare_exchange_n(&seg->tags[idx].key, &key, TAG_TOMBSTONE, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
    return 1;
}

int lxf_tag_clear_pid(struct lxf_segment *seg, uint32_t pid)
{
    int n = 0;
    for (int i = 0; i < LXF_TAG_SLOTS; i++) {
        uint64_t k = LOAD_ACQ(&seg->tags[i].key);
        if (k > TAG_TOMBSTONE && (uint32_t)(k >> 32) == pid &&
            __atomic_compare_exchange_n(&seg->tags[i].key, &k, TAG_TOMBSTONE, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            n++;
    }
    return n;
}

/* -------------------------------------------------------------- doorbells */

void lxf_bell_path(const struct lxf_segment *seg, char *out)
{
    /* Unique to this daemon instance (pid and creation time), so a bell left
     * by a dead daemon is never rung for its successor. */
    snprintf(out, LXF_BELL_PATH_MAX, "/dev/shm/laxflow-bell.%u.%llu", seg->header.daemon_pid,
             (unsigned long long)seg->header.created_ns);
}

int lxf_bell_create(struct lxf_segment *seg)
{
    char path[LXF_BELL_PATH_MAX];
    lxf_bell_path(seg, path);
    unlink(path);
    if (mkfifo(path, 0600) != 0)
        return -1;
    chmod(path, 0600); /* mkfifo's mode is filtered by the umask */
    /* O_RDWR: a FIFO with a writer of its own never reports hang-up, so the
     * daemon's poll wakes only for bytes. */
    return open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
}

int lxf_bell_arm(struct lxf_segment *seg)
{
    __atomic_store_n(&seg->header.bell_armed, 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    /* Dekker with the pusher (push, fence, load armed): either it sees the
     * bell armed and rings, or this sees its claim on the ring. */
    if (__atomic_load_n(&seg->events.tail, __ATOMIC_SEQ_CST) != LOAD_ACQ(&seg->events.head)) {
        __atomic_store_n(&seg->header.bell_armed, 0, __ATOMIC_SEQ_CST);
        return 0;
    }
    return 1;
}

void lxf_bell_disarm(struct lxf_segment *seg)
{
    __atomic_store_n(&seg->header.bell_armed, 0, __ATOMIC_SEQ_CST);
}

static void bell_ring(struct lxf_segment *seg)
{
    /* Opened per ring, not cached: a ring happens once per daemon sleep, and
     * an fd kept in a preloaded job could be closed and reused under us. */
    char path[LXF_BELL_PATH_MAX];
    lxf_bell_path(seg, path);
    int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return; /* no daemon reading: it polls on its own timer */
    char b = 1;
    ssize_t rc = write(fd, &b, 1); /* full pipe: already rung */
    (void)rc;
    close(fd);
}

static void bell_after_push(struct lxf_segment *seg)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&seg->header.bell_armed, __ATOMIC_SEQ_CST) &&
        __atomic_exchange_n(&seg->header.bell_armed, 0, __ATOMIC_SEQ_CST))
        bell_ring(seg);
}

void lxf_permit_publish(struct lxf_segment *seg)
{
    __atomic_fetch_add(&seg->header.permit_seq, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &seg->header.permit_seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

uint32_t lxf_permit_seq(const struct lxf_segment *seg)
{
    return LOAD_ACQ(&seg->header.permit_seq);
}

int lxf_permit_wait(struct lxf_segment *seg, uint32_t seq, uint64_t timeout_ns)
{
    if (LOAD_ACQ(&seg->header.permit_seq) != seq)
        return 1;
    struct timespec ts = {(time_t)(timeout_ns / 1000000000ULL), (long)(timeout_ns % 1000000000ULL)};
    /* Shared (not FUTEX_PRIVATE): the word is in a mapping of several processes. */
    syscall(SYS_futex, &seg->header.permit_seq, FUTEX_WAIT, seq, &ts, NULL, 0);
    return LOAD_ACQ(&seg->header.permit_seq) != seq;
}
