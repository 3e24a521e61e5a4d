/*
 * object.c -- shared objects: the store of blobs, the public calls
 * (fiber_object_*, fiber_pool_shared, fiber_task_shared), and a child's
 * side: its bounded cache and how it fetches what it lacks.
 *
 * The store is one hash table of blobs keyed by ref, in every process.
 * In the master it holds what was put (freed when no reference, pin or
 * transfer is left); in a child it is a cache, evicted least recently
 * used first beyond object_cache_mb, never a pinned blob.
 *
 * A child fetches with one request at a time (fetch_mu): it asks the
 * master's blob server, which either sends the bytes or names a holder;
 * it then asks that holder.  Whatever fails at a holder (it cannot be
 * reached, it closes mid-way, it sends bytes that do not match the hash)
 * is reported to the master (OBJ_BAD) and the child asks the master
 * again, up to MAX_TRIES times.  Bytes are checked against the hash
 * before they enter the cache.  Once it has the blob the child starts
 * its own relay server (once) and tells the master (OBJ_HAVE).
 */
#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "net/net.h"
#include "runtime/runtime.h"
#include "runtime/task.h"
#include "store/object_int.h"

#define BUCKETS 1024
#define MAX_TRIES 16
#define PEER_TIMEOUT_MS 10000

static pthread_mutex_t blobs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fb_blob *table[BUCKETS];
static struct fb_blob *lru_head, *lru_tail; /* child: oldest first */
static fiber_object_stats stats;

void fb_blobs_lock(void) { pthread_mutex_lock(&blobs_mu); }
void fb_blobs_unlock(void) { pthread_mutex_unlock(&blobs_mu); }

static unsigned bucket(const uint8_t *ref)
{
    return (unsigned)(ref[0] | ref[1] << 8) % BUCKETS;
}

struct fb_blob *fb_blob_find(const uint8_t ref[FB_WIRE_REF_LEN])
{
    for (struct fb_blob *b = table[bucket(ref)]; b; b = b->hnext)
        if (memcmp(b->ref, ref, FB_WIRE_REF_LEN) == 0)
            return b;
    return NULL;
}

static void lru_unlink(struct fb_blob *b)
{
    if (b->lru_prev)
        b->lru_prev->lru_next = b->lru_next;
    else if (lru_head == b)
        lru_head = b->lru_next;
    if (b->lru_next)
        b->lru_next->lru_prev = b->lru_prev;
    else if (lru_tail == b)
        lru_tail = b->lru_prev;
    b->lru_prev = b->lru_next = NULL;
}

static void lru_touch(struct fb_blob *b)
{
    lru_unlink(b);
    b->lru_prev = lru_tail;
    if (lru_tail)
        lru_tail->lru_next = b;
    else
        lru_head = b;
    lru_tail = b;
}

/* Child, lock held: the arena blobs this process no longer reads, for
 * OBJ_DROP on its next request to the master (send_drops). */
static uint8_t (*drops)[FB_WIRE_REF_LEN];
static size_t n_drops, cap_drops;

static void queue_drop(const uint8_t *ref)
{
    if (n_drops == cap_drops) {
        size_t cap = cap_drops ? 2 * cap_drops : 16;
        void *v = realloc(drops, cap * sizeof *drops);
        if (!v) {
            /* the region stays held until this process exits */
            fb_log_warn("out of memory to drop a shared object");
            return;
        }
        drops = v;
        cap_drops = cap;
    }
    memcpy(drops[n_drops++], ref, FB_WIRE_REF_LEN);
}

void fb_blob_hold(struct fb_blob *b) { b->child_holds++; }

void fb_blob_unhold(struct fb_blob *b)
{
    if (b->child_holds > 0)
        b->child_holds--;
    if (b->orphan && b->child_holds == 0) {
        fb_arena_free(b->arena_seg, b->arena_off, b->len);
        free(b);
    }
}

static void blob_free(struct fb_blob *b)
{
    struct fb_blob **pp = &table[bucket(b->ref)];
    while (*pp && *pp != b)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = b->hnext;
    lru_unlink(b);
    while (b->holders) {
        struct fb_holder *h = b->holders;
        b->holders = h->next;
        free(h);
    }
    stats.objects--;
    stats.bytes_held -= b->len;
    if (b->in_arena) {
        if (!fb_rt_is_master()) {
            queue_drop(b->ref);
        } else {
            /* Children that still read it keep its region: the blob
             * lives on out of the table until they drop it. */
            fb_arena_mark_released(b->arena_seg, b->arena_off);
            if (b->child_holds > 0) {
                b->orphan = 1;
                b->hnext = NULL;
                return;
            }
            fb_arena_free(b->arena_seg, b->arena_off, b->len);
        }
        free(b);
        return;
    }
    if (b->mapped)
        munmap(b->data, b->len);
    else
        free(b->data);
    if (b->shm_path[0] && fb_rt_is_master())
        unlink(b->shm_path); /* children's mappings stay valid */
    free(b);
}

/* Master: a blob nobody refers to any more goes at once. */
static void maybe_free(struct fb_blob *b)
{
    if (fb_rt_is_master() && b->owners == 0 && b->pins == 0)
        blob_free(b);
}

void fb_blob_pin(struct fb_blob *b) { b->pins++; }

void fb_blob_unpin(struct fb_blob *b)
{
    if (b->pins > 0)
        b->pins--;
    maybe_free(b);
}

void fb_blobs_note_sent(uint64_t bytes, int whole, int redirect)
{
    stats.bytes_served += bytes;
    stats.transfers += whole != 0;
    stats.redirects += redirect != 0;
}

void fb_blobs_note_map(void) { stats.maps++; }

void fb_blobs_each(void (*fn)(struct fb_blob *b, void *arg), void *arg)
{
    for (unsigned i = 0; i < BUCKETS; i++)
        for (struct fb_blob *b = table[i], *next; b; b = next) {
            next = b->hnext;
            fn(b, arg);
        }
}

/* Lock held.  Adds a blob that owns data (taken on success). */
static struct fb_blob *blob_add(const uint8_t *ref, uint8_t *data, size_t len)
{
    struct fb_blob *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    memcpy(b->ref, ref, FB_WIRE_REF_LEN);
    b->data = data;
    b->len = len;
    unsigned k = bucket(ref);
    b->hnext = table[k];
    table[k] = b;
    stats.objects++;
    stats.bytes_held += len;
    return b;
}

/* Lock held.  Child: drops unpinned blobs, oldest use first, until the
 * cache fits its budget. */
static void evict(void)
{
    uint64_t budget = (uint64_t)fb_rt_config()->object_cache_mb << 20;
    for (struct fb_blob *b = lru_head, *next; b && stats.bytes_held > budget;
         b = next) {
        next = b->lru_next;
        if (b->pins == 0 && b->outer_pins == 0) {
            blob_free(b);
            stats.evictions++;
        }
    }
}

/* Lock held.  Child: drops the unpinned blobs it maps from master files
 * that are gone (the master released them), whatever the budget: an ES
 * run puts a new policy each iteration, and the old ones would otherwise
 * stay mapped, on every worker, until object_cache_mb.  Called when a
 * blob arrives: one access() for each of at most DROP_LOOKS such blobs,
 * least recently used first (a worker caching thousands of small objects
 * pays a bounded cost per arrival). */
#define DROP_LOOKS 64
static void drop_released(void)
{
    int looks = 0;
    for (struct fb_blob *b = lru_head, *next; b && looks < DROP_LOOKS;
         b = next) {
        next = b->lru_next;
        if (!b->mapped || !b->shm_path[0] || b->pins || b->outer_pins)
            continue;
        if (b->in_arena) { /* a read of its header, no system call */
            if (fb_arena_released(b->data)) {
                blob_free(b);
                stats.evictions++;
            }
            continue;
        }
        looks++;
        if (access(b->shm_path, F_OK) != 0) {
            blob_free(b);
            stats.evictions++;
        }
    }
}

static void make_ref(const void *data, size_t len, uint8_t ref[FB_WIRE_REF_LEN])
{
    crypto_generichash(ref, 32, data, len, NULL, 0);
    for (int i = 0; i < 8; i++)
        ref[32 + i] = (uint8_t)((uint64_t)len >> (8 * i));
}

static uint64_t ref_len(const uint8_t *ref)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | ref[32 + i];
    return v;
}

/* ---- the master's server ---------------------------------------------------- */

static pthread_mutex_t server_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fb_oserve *server; /* master: the directory; child: a relay */
static char master_addr[FB_WIRE_ADDR_MAX + 1]; /* child */

const char *fb_objects_master_address(void)
{
    pthread_mutex_lock(&server_mu);
    if (!server && fb_rt_is_master() && fb_rt()->run_dir[0]) {
        char addr[FB_WIRE_ADDR_MAX + 1];
        if (fb_rt_config()->transport == FB_TRANSPORT_TCP)
            snprintf(addr, sizeof addr, "tcp:%s:0",
                     fb_rt_config()->listen_host);
        else
            snprintf(addr, sizeof addr, "unix:%s/blobs.sock",
                     fb_rt()->run_dir);
        if (fb_oserve_start(&server, addr, 1) != 0)
            fb_log_warn("shared objects unavailable: %s", fiber_last_error());
    }
    const char *a = server ? fb_oserve_address(server) : "";
    pthread_mutex_unlock(&server_mu);
    return a;
}

void fb_objects_set_master(const char *addr)
{
    fb_strlcpy(master_addr, addr ? addr : "", sizeof master_addr);
}

static void unlink_shm(struct fb_blob *b, void *arg)
{
    (void)arg;
    if (b->shm_path[0] && !b->in_arena) {
        if (fb_rt_is_master()) /* a child's path names the master's file */
            unlink(b->shm_path);
        b->shm_path[0] = '\0';
    }
}

void fb_objects_shutdown(void)
{
    pthread_mutex_lock(&server_mu);
    struct fb_oserve *s = server;
    server = NULL;
    pthread_mutex_unlock(&server_mu);
    fb_oserve_stop(s);
    /* The master's copies in /dev/shm go with it (the memory stays mapped
     * until the process ends). */
    fb_blobs_lock();
    fb_blobs_each(unlink_shm, NULL);
    if (fb_rt_is_master()) {
        fb_oserve_reap(1); /* no connection is left to read the arena */
        fb_arena_shutdown();
    }
    fb_blobs_unlock();
}

/* ---- the public calls ------------------------------------------------------- */

/* Master, lock held: a blob's copy in a file of /dev/shm that same-host
 * children map (object_shm).  Returns 0 with *out and path filled, or -1
 * (the caller keeps a private copy instead). */
static int shm_copy(const uint8_t *ref, const void *data, size_t len,
                    uint8_t **out, char *path, size_t size)
{
    if (!fb_rt_config()->object_shm || len == 0 ||
        fb_rt_config()->transport == FB_TRANSPORT_TCP)
        return -1;
    char hex[33];
    sodium_bin2hex(hex, sizeof hex, ref, 16);
    snprintf(path, size, "/dev/shm/fiber-%s-%ld-%s", fb_rt()->run_id,
             (long)getpid(), hex);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    /* write() fills the file without a page fault per page; the mapping
     * then shares those pages. */
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, (const uint8_t *)data + done, len - done);
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    void *map = MAP_FAILED;
    if (done == len)
        map = mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        unlink(path);
        return -1;
    }
    stats.shm_bytes += len;
    *out = map;
    return 0;
}

/* Master: whether a len-byte blob goes to the arena (same-host children
 * read it there), as shm_copy decides for a file of its own. */
static int arena_ok(size_t len)
{
    return fb_rt_config()->object_shm && len > 0 &&
           len <= FB_ARENA_MAX_BLOB &&
           fb_rt_config()->transport != FB_TRANSPORT_TCP;
}

FIBER_API int fiber_object_put(const void *data, size_t len, fiber_ref *ref)
{
    if (!ref || (!data && len))
        return fb_err(FIBER_EINVAL, "fiber_object_put: %s is NULL",
                      ref ? "data" : "ref");
    if (!fb_rt_is_master())
        return fb_err(FIBER_ENOTINIT, "only the master puts shared objects "
                      "(call fiber_init first; children resolve refs)");
    if (!fb_rt_address()[0] || !fb_objects_master_address()[0])
        return fb_err(FIBER_ESYS, "the shared-object server cannot start");
    uint8_t r[FB_WIRE_REF_LEN];
    make_ref(data, len, r);
    fb_blobs_lock();
    struct fb_blob *b = fb_blob_find(r);
    if (!b) {
        int seg = -1;
        uint64_t at = 0;
        const uint8_t *view = NULL;
        if (arena_ok(len) && fb_arena_put(r, data, len, &seg, &at, &view) != 0) {
            fb_oserve_reap(0); /* regions of exited processes come back */
            if (fb_arena_put(r, data, len, &seg, &at, &view) != 0)
                seg = -1;
        }
        if (seg >= 0) {
            b = blob_add(r, (uint8_t *)view, len);
            if (!b) {
                fb_arena_free(seg, at, len);
                fb_blobs_unlock();
                return fb_err(FIBER_ENOMEM, "out of memory for a shared "
                              "object");
            }
            b->mapped = 1;
            b->in_arena = 1;
            b->arena_seg = seg;
            b->arena_off = at;
            fb_strlcpy(b->shm_path, fb_arena_path(seg), sizeof b->shm_path);
            stats.shm_bytes += len;
        }
    }
    if (!b) {
        char path[128];
        uint8_t *copy = NULL;
        int mapped = shm_copy(r, data, len, &copy, path, sizeof path) == 0;
        if (!mapped && (copy = malloc(len ? len : 1)) && len)
            memcpy(copy, data, len);
        b = copy ? blob_add(r, copy, len) : NULL;
        if (b && mapped) {
            b->mapped = 1;
            fb_strlcpy(b->shm_path, path, sizeof b->shm_path);
        }
        if (!b) {
            if (mapped) {
                munmap(copy, len);
                unlink(path);
            } else {
                free(copy);
            }
            fb_blobs_unlock();
            return fb_err(FIBER_ENOMEM, "out of memory for a %zu-byte shared "
                          "object", len);
        }
    }
    b->owners++;
    fb_blobs_unlock();
    memcpy(ref->bytes, r, FIBER_REF_LEN);
    return 0;
}

FIBER_API int fiber_object_release(const fiber_ref *ref)
{
    if (!ref)
        return fb_err(FIBER_EINVAL, "fiber_object_release: ref is NULL");
    fb_blobs_lock();
    struct fb_blob *b = fb_blob_find(ref->bytes);
    int rc = 0;
    if (!b) {
        rc = FIBER_ENOKEY;
    } else if (fb_rt_is_master()) {
        if (b->owners > 0) {
            b->owners--;
            maybe_free(b);
        } else {
            rc = FIBER_ENOKEY;
        }
    } else if (b->outer_pins > 0) {
        b->outer_pins--;
        evict(); /* it may have held the cache over its budget */
    } else {
        rc = FIBER_ENOKEY;
    }
    fb_blobs_unlock();
    return rc ? fb_err(rc, "fiber_object_release: nothing to release for "
                       "this ref") : 0;
}

int fb_objects_pin_ref(const fiber_ref *ref)
{
    fb_blobs_lock();
    struct fb_blob *b = fb_blob_find(ref->bytes);
    if (b)
        fb_blob_pin(b);
    fb_blobs_unlock();
    return b ? 0 : fb_err(FIBER_ENOKEY, "the shared argument's object is not "
                          "in the store (never put, or released)");
}

void fb_objects_unpin_ref(const fiber_ref *ref)
{
    fb_blobs_lock();
    struct fb_blob *b = fb_blob_find(ref->bytes);
    if (b)
        fb_blob_unpin(b);
    fb_blobs_unlock();
}

FIBER_API int fiber_object_released(const fiber_ref *ref)
{
    if (!ref || fb_rt_is_master())
        return 0;
    fb_blobs_lock();
    struct fb_blob *b = fb_blob_find(ref->bytes);
    int gone = 0;
    if (b && b->in_arena)
        gone = fb_arena_released(b->data);
    else if (b && b->mapped && b->shm_path[0])
        gone = access(b->shm_path, F_OK) != 0;
    fb_blobs_unlock();
    return gone;
}

static __thread fiber_ref call_shared;
static __thread int has_call_shared;

FIBER_API int fiber_pool_shared(const fiber_ref *ref)
{
    has_call_shared = ref != NULL;
    if (ref)
        call_shared = *ref;
    return 0;
}

const fiber_ref *fb_objects_call_shared(void)
{
    return has_call_shared ? &call_shared : NULL;
}

FIBER_API int fiber_object_stats_get(fiber_object_stats *st)
{
    if (!st)
        return fb_err(FIBER_EINVAL, "fiber_object_stats_get: st is NULL");
    fb_blobs_lock();
    *st = stats;
    fb_blobs_unlock();
    return 0;
}

/* ---- a child: pins of the running task -------------------------------------- */

static struct fb_blob **task_pins;
static size_t n_task_pins, cap_task_pins;
static uint8_t task_shared[FB_WIRE_REF_LEN];
static int has_task_shared;

void fb_objects_set_task_shared(const uint8_t *ref)
{
    has_task_shared = ref != NULL;
    if (ref)
        memcpy(task_shared, ref, FB_WIRE_REF_LEN);
}

void fb_objects_task_end(void)
{
    if (n_task_pins == 0)
        return;
    fb_blobs_lock();
    for (size_t i = 0; i < n_task_pins; i++)
        fb_blob_unpin(task_pins[i]);
    n_task_pins = 0;
    evict();
    fb_blobs_unlock();
}

/* Lock held.  Pins b for the running task, or for the caller until
 * fiber_object_release outside a task or when held (fiber_object_hold).
 * Returns 0 or FIBER_ENOMEM. */
static int pin_for_caller(struct fb_blob *b, int hold)
{
    if (!fb_task_running() || hold) {
        b->outer_pins++;
        return 0;
    }
    if (n_task_pins == cap_task_pins) {
        size_t cap = cap_task_pins ? 2 * cap_task_pins : 8;
        struct fb_blob **v = realloc(task_pins, cap * sizeof *v);
        if (!v)
            return fb_err(FIBER_ENOMEM, "out of memory");
        task_pins = v;
        cap_task_pins = cap;
    }
    task_pins[n_task_pins++] = b;
    fb_blob_pin(b);
    fb_task_owe_end();
    return 0;
}

/* ---- a child: fetching ------------------------------------------------------ */

static pthread_mutex_t fetch_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fb_conn to_master; /* zeroed: closed until dialed */
static uint64_t next_req;

/* One try of dial: FIBER_ECLOSED when the server cut the connection
 * before it answered. */
static int dial_once(struct fb_conn *c, const char *addr, uint64_t deadline)
{
    int fd;
    int rc = fb_sock_dial(addr, deadline, &fd);
    if (rc)
        return rc;
    fb_conn_init(c, fd, 1u << 30);
    rc = fb_conn_secure_for(c, addr, FB_SEC_CLIENT, fb_rt_token());
    const char *bid = fb_rt_build_id();
    char name[] = "blobs";
    struct fb_msg_hello h = {.build_id = bid,
                             .build_id_len = (uint8_t)strlen(bid),
                             .pid = (uint32_t)getpid(),
                             .name = name,
                             .name_len = (uint8_t)strlen(name)};
    memcpy(h.token, fb_rt_token(), sizeof h.token);
    if (rc == 0)
        rc = fb_wire_put_hello(fb_conn_out(c), &h);
    if (rc == 0)
        rc = fb_conn_flush_wait(c, deadline);
    struct fb_wire_hdr hdr;
    const uint8_t *p;
    int got = rc == 0 ? fb_conn_recv_wait(c, &hdr, &p, deadline) : 0;
    if (rc == 0 && got != 1)
        rc = fb_err(got == FIBER_ETIMEDOUT ? got : FIBER_ECLOSED,
                    "blob server %s closed the connection: %s", addr,
                    fb_conn_err_or(c, fiber_last_error()));
    else if (rc == 0 && hdr.type != FB_MSG_WELCOME)
        rc = fb_err(FIBER_EAUTH, "blob server %s refused us", addr);
    if (rc)
        fb_conn_close(c);
    return rc;
}

/* Dials addr and proves who we are (HELLO, WELCOME); dials again while
 * the server cuts us before answering and the deadline allows (a server
 * over max_pending_connections closes its oldest waiting connection:
 * hundreds of workers fetching at once on few cores).  Returns 0 or a
 * code with a message. */
static int dial(struct fb_conn *c, const char *addr, uint64_t deadline)
{
    unsigned attempt = 0;
    int rc;
    while ((rc = dial_once(c, addr, deadline)) == FIBER_ECLOSED &&
           fb_dial_again(&attempt, deadline))
        fb_log_info("blob server %s cut the handshake (%s); dialing again",
                    addr, fiber_last_error());
    return rc;
}

static int master_conn(void)
{
    if (fb_conn_fd(&to_master) >= 0)
        return 0;
    if (!master_addr[0])
        return fb_err(FIBER_EUNREACHABLE, "this process does not know the "
                      "master's blob server (not a fiber child?)");
    return dial(&to_master, master_addr,
                fb_deadline_ms(fb_rt_config()->connect_timeout_ms));
}

/* What one request gave. */
struct answer {
    int done;               /* the bytes are all in buf */
    char from[FB_WIRE_ADDR_MAX + 1]; /* OBJ_FROM: ask there */
    uint8_t *map;           /* OBJ_FILE, OBJ_AT: the master's copy */
    int arena;              /* OBJ_AT: map is in the master's arena */
    char file[128];         /* OBJ_FILE: its path ("" if longer) */
    int none;               /* OBJ_NONE: the server has no such blob */
};

/* Maps the master's copy at path read-only.  Returns 0 with *out. */
static int map_file(const char *path, size_t len, uint8_t **out)
{
    const uint8_t *map;
    size_t size = len;
    int rc = fb_map_master_file(path, "the shared object's file", 1, &map,
                                &size);
    if (rc)
        return rc;
    *out = (uint8_t *)map;
    return 0;
}

/* Sends OBJ_GET for ref on c and reads the answer into *buf (len bytes,
 * allocated when the first piece comes, so that a forged ref's length
 * is never allocated before a server vouched for the blob).
 * Returns 0 with *a, or a code (the connection is then unusable). */
static int ask(struct fb_conn *c, const uint8_t *ref, uint8_t **buf,
               size_t len, uint64_t deadline, struct answer *a)
{
    uint64_t id = ++next_req;
    memset(a, 0, sizeof *a);
    int rc = fb_wire_put_obj_get(fb_conn_out(c), id, ref);
    if (rc == 0)
        rc = fb_conn_flush_wait(c, deadline);
    size_t got = 0;
    while (rc == 0) {
        struct fb_wire_hdr h;
        const uint8_t *p;
        int r = fb_conn_recv_wait(c, &h, &p, deadline);
        if (r != 1)
            return fb_err(r < 0 ? r : FIBER_ECLOSED, "blob transfer cut: %s",
                          fb_conn_err_or(c, fiber_last_error()));
        if (h.id != id)
            return fb_err(FIBER_EPROTO, "blob server answered request %llu, "
                          "not %llu", (unsigned long long)h.id,
                          (unsigned long long)id);
        if (h.type == FB_MSG_OBJ_FROM) {
            const char *s;
            uint32_t n;
            fb_wire_get_obj_from(p, h.len, &s, &n, NULL, 0);
            memcpy(a->from, s, n);
            a->from[n] = '\0';
            return 0;
        }
        if (h.type == FB_MSG_OBJ_FILE) {
            const char *s;
            uint32_t n;
            char path[4096];
            fb_wire_get_obj_file(p, h.len, &s, &n, NULL, 0);
            memcpy(path, s, n);
            path[n] = '\0';
            if (n < sizeof a->file)
                memcpy(a->file, path, n + 1);
            return map_file(path, len, &a->map);
        }
        if (h.type == FB_MSG_OBJ_AT) {
            const char *s;
            uint32_t n;
            uint64_t off;
            char path[4096];
            fb_wire_get_obj_at(p, h.len, &off, &s, &n, NULL, 0);
            memcpy(path, s, n);
            path[n] = '\0';
            if (n < sizeof a->file)
                memcpy(a->file, path, n + 1);
            a->arena = 1;
            const uint8_t *view;
            int vrc = fb_arena_view(path, off, ref, len, &view);
            if (vrc == FIBER_ENOKEY) {
                /* released before we looked: the master holds its place
                 * for us until we say so; the connection stays good */
                fb_blobs_lock();
                queue_drop(ref);
                fb_blobs_unlock();
                a->none = 1;
            }
            a->map = (uint8_t *)view;
            return vrc;
        }
        if (h.type == FB_MSG_OBJ_NONE) {
            struct fb_msg_text t;
            fb_wire_get_obj_none(h.code, p, h.len, &t, NULL, 0);
            a->none = 1;
            return fb_err(h.code, "%.*s", (int)t.len, t.text);
        }
        struct fb_msg_obj_data d;
        if (h.type != FB_MSG_OBJ_DATA)
            return fb_err(FIBER_EPROTO, "blob server sent %s",
                          fb_msg_type_name(h.type));
        fb_wire_get_obj_data(p, h.len, &d, NULL, 0);
        if (d.offset != got || d.len > len - got)
            return fb_err(FIBER_EPROTO, "blob piece at %llu (+%u) does not "
                          "follow %zu of %zu bytes",
                          (unsigned long long)d.offset, d.len, got, len);
        if (!*buf && !(*buf = malloc(len ? len : 1)))
            return fb_err(FIBER_ENOMEM, "out of memory for a %zu-byte "
                          "shared object", len);
        if (d.len)
            memcpy(*buf + got, d.bytes, d.len);
        got += d.len;
        if (got == len) {
            a->done = 1;
            return 0;
        }
    }
    return rc;
}

static void tell_master_bad(const uint8_t *ref, const char *addr)
{
    if (fb_wire_put_obj_bad(fb_conn_out(&to_master), ref, addr) == 0)
        fb_conn_flush(&to_master);
}

/* Asks the holder at addr.  Returns 0 when buf holds bytes that match. */
static int from_holder(const char *addr, const uint8_t *ref, uint8_t **buf,
                       size_t len)
{
    struct fb_conn c;
    fb_conn_init(&c, -1, 0);
    uint64_t deadline = fb_deadline_ms(PEER_TIMEOUT_MS);
    struct answer a;
    int rc = dial(&c, addr, deadline);
    if (rc == 0)
        rc = ask(&c, ref, buf, len, deadline, &a);
    if (rc == 0 && !a.done)
        rc = fb_err(FIBER_EPROTO, "holder %s redirected us", addr);
    fb_conn_close(&c);
    uint8_t check[FB_WIRE_REF_LEN];
    if (rc == 0) {
        make_ref(*buf, len, check);
        if (memcmp(check, ref, FB_WIRE_REF_LEN) != 0)
            rc = fb_err(FIBER_EPROTO, "holder %s sent bytes that do not "
                        "match the ref", addr);
    }
    if (rc)
        fb_log_info("shared object from %s failed (%s); asking the master "
                    "again", addr, fiber_last_error());
    return rc;
}

/* A child that exits leaves no socket behind (one killed does: the run
 * directory goes with the run). */
static void unlink_relay(void)
{
    const char *a = server ? fb_oserve_address(server) : "";
    if (strncmp(a, "unix:", 5) == 0)
        unlink(a + 5);
}

/* The relay: where this child serves what it holds.  Beside the master's
 * unix socket (the run directory), or on listen_host with TCP. */
static int start_relay(void)
{
    pthread_mutex_lock(&server_mu);
    int rc = 0;
    if (!server) {
        char want[FB_WIRE_ADDR_MAX + 1];
        const char *slash = strrchr(master_addr, '/');
        if (strncmp(master_addr, "tcp:", 4) == 0)
            snprintf(want, sizeof want, "tcp:%s:0",
                     fb_rt_config()->listen_host);
        else if (slash && (size_t)(slash - master_addr) < sizeof want - 40)
            snprintf(want, sizeof want, "%.*s/relay.%ld.sock",
                     (int)(slash - master_addr), master_addr, (long)getpid());
        else
            rc = fb_err(FIBER_EINVAL, "no place for a relay socket");
        if (rc == 0)
            rc = fb_oserve_start(&server, want, 0);
        if (rc == 0)
            atexit(unlink_relay);
    }
    pthread_mutex_unlock(&server_mu);
    return rc;
}

/* Child, fetch_mu held: queues the pending OBJ_DROPs on the master
 * connection (sent with the next flush).  With no connection they are
 * moot: the master let go of that connection's holds. */
static size_t put_drops(void)
{
    fb_blobs_lock();
    size_t n = 0;
    for (; n < n_drops && fb_conn_fd(&to_master) >= 0; n++)
        if (fb_wire_put_obj_drop(fb_conn_out(&to_master), drops[n]) != 0)
            break; /* out of memory: the master frees them when we go */
    n_drops = 0;
    fb_blobs_unlock();
    return n;
}

/* Fetches ref into a new buffer (*out, len bytes), verified; *from is
 * the holder it came from ("" for the master).  Or, on the master's host,
 * maps the master's copy (*mapped = 1; not hashed again: those bytes
 * never left the master's file).  fetch_mu held. */
static int fetch(const uint8_t *ref, size_t len, uint8_t **out, char *from,
                 int *mapped, int *arena, char file[128])
{
    *mapped = 0;
    *arena = 0;
    uint8_t *buf = NULL;
    int rc = master_conn();
    if (rc == 0)
        put_drops(); /* they leave with the request */
    for (int tries = 0; rc == 0; tries++) {
        if (tries == MAX_TRIES) {
            rc = fb_err(FIBER_ECLOSED, "shared object: %d holders failed in "
                        "a row", MAX_TRIES);
            break;
        }
        struct answer a;
        uint64_t deadline = fb_deadline_ms(-1);
        rc = ask(&to_master, ref, &buf, len, deadline, &a);
        if (rc) {
            if (!a.none) /* an answer that is not "none" broke the conn */
                fb_conn_close(&to_master);
            break;
        }
        if (a.map) {
            free(buf);
            *out = a.map;
            *mapped = 1;
            *arena = a.arena;
            memcpy(file, a.file, sizeof a.file);
            return 0;
        }
        if (a.done) {
            uint8_t check[FB_WIRE_REF_LEN];
            make_ref(buf, len, check);
            if (memcmp(check, ref, FB_WIRE_REF_LEN) != 0)
                rc = fb_err(FIBER_EPROTO, "the master sent bytes that do not "
                            "match the ref");
            from[0] = '\0';
            break;
        }
        if (from_holder(a.from, ref, &buf, len) == 0) {
            fb_strlcpy(from, a.from, FB_WIRE_ADDR_MAX + 1);
            break;
        }
        stats.fetch_retries++;
        tell_master_bad(ref, a.from);
    }
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    return 0;
}

/* Child: brings ref into the cache.  Lock NOT held. */
static int fetch_into_cache(const uint8_t *ref)
{
    pthread_mutex_lock(&fetch_mu);
    fb_blobs_lock();
    int have = fb_blob_find(ref) != NULL;
    fb_blobs_unlock();
    int rc = 0;
    uint8_t *data = NULL;
    char from[FB_WIRE_ADDR_MAX + 1] = "";
    size_t len = (size_t)ref_len(ref);
    int mapped = 0, arena = 0;
    char file[128] = "";
    uint64_t t0 = fb_now_ns();
    if (!have)
        rc = fetch(ref, len, &data, from, &mapped, &arena, file);
    if (!have && rc == 0)
        fb_log_debug("shared object of %zu bytes %s %s in %.1f ms", len,
                     mapped ? "mapped" : "fetched from",
                     mapped ? "" : from[0] ? from : "the master",
                     (double)(fb_now_ns() - t0) / 1e6);
    if (!have && rc == 0) {
        fb_blobs_lock();
        struct fb_blob *b = blob_add(ref, data, len);
        if (b) {
            b->mapped = mapped;
            b->in_arena = arena;
            if (mapped) {
                stats.shm_bytes += len;
                memcpy(b->shm_path, file, sizeof file);
            }
            lru_touch(b);
            stats.fetches++;
            b->pins++; /* evict() must not take it before the caller pins */
            drop_released();
            evict();
            b->pins--;
        }
        if (!b && arena)
            queue_drop(ref);
        fb_blobs_unlock();
        if (!b) {
            if (mapped && !arena)
                munmap(data, len);
            else if (!mapped)
                free(data);
            rc = fb_err(FIBER_ENOMEM, "out of memory");
        }
        if (put_drops() > 0) /* what this arrival pushed out */
            fb_conn_flush(&to_master);
    }
    /* A mapped copy needs no relay: every process on this host maps the
     * master's file. */
    if (!have && rc == 0 && !mapped && start_relay() == 0 &&
        fb_wire_put_obj_have(fb_conn_out(&to_master), ref,
                             fb_oserve_address(server),
                             from) == 0)
        fb_conn_flush(&to_master);
    pthread_mutex_unlock(&fetch_mu);
    return rc;
}

static int object_get(const fiber_ref *ref, const void **data, size_t *len,
                      int hold)
{
    if (!ref || !data || !len)
        return fb_err(FIBER_EINVAL, "fiber_object_get: an argument is NULL");
    if (!fb_rt()->initialized)
        return fb_err(FIBER_ENOTINIT, "fiber_init() has not been called");
    int master = fb_rt_is_master();
    if (master && hold)
        return fb_err(FIBER_ESTATE, "fiber_object_hold is for children: the "
                      "master reads its blobs with fiber_object_get");
    for (int pass = 0; pass < 2; pass++) {
        fb_blobs_lock();
        struct fb_blob *b = fb_blob_find(ref->bytes);
        if (b && !master && pass == 0)
            stats.cache_hits++;
        int rc = b && !master ? pin_for_caller(b, hold) : 0;
        if (b && !master)
            lru_touch(b);
        if (b && rc == 0) {
            *data = b->data;
            *len = b->len;
        }
        fb_blobs_unlock();
        if (b)
            return rc;
        if (master)
            return fb_err(FIBER_ENOKEY, "no shared object has this ref (it "
                          "was never put, or was released)");
        rc = pass == 0 ? fetch_into_cache(ref->bytes) : 0;
        if (rc)
            return rc;
    }
    return fb_err(FIBER_ENOKEY, "the shared object was evicted as soon as "
                  "it came: object_cache_mb is too small for it");
}

FIBER_API int fiber_object_get(const fiber_ref *ref, const void **data,
                               size_t *len)
{
    return object_get(ref, data, len, 0);
}

FIBER_API int fiber_object_hold(const fiber_ref *ref, const void **data,
                                size_t *len)
{
    return object_get(ref, data, len, 1);
}

FIBER_API int fiber_task_shared(const void **data, size_t *len)
{
    if (!has_task_shared)
        return fb_err(FIBER_ENOKEY, "this call has no shared argument "
                      "(fiber_pool_shared)");
    fiber_ref r;
    memcpy(r.bytes, task_shared, FIBER_REF_LEN);
    return fiber_object_get(&r, data, len);
}
