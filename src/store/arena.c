/*
 * arena.c -- the master's shared-memory arena for blobs, and a child's
 * view of it.
 *
 * Before the arena, each blob the master put on a same-host run was a
 * file of its own in /dev/shm, and every worker that resolved it opened
 * it, mapped it (MAP_POPULATE), and unmapped it when the master released
 * it: about 45 us to map and 15-70 us to unmap a 400 KB policy on the
 * 2-core VM, per worker, per new policy.  Now blobs up to
 * FB_ARENA_MAX_BLOB go into a few large files (segments) that a child
 * maps once, whole, for the life of the process.  The master reuses a
 * freed region for a later blob, so a worker's page tables already point
 * at its pages: resolving the next policy maps nothing.
 *
 * Reuse is safe because a region is freed only when nobody can read it:
 * the master released the blob, and every child it placed the blob for
 * (OBJ_AT) has said OBJ_DROP or is gone (objserve.c keeps these holds
 * per connection; object.c frees the region when the last goes).  Each
 * region starts with a header (struct fb_arena_head) naming the blob,
 * which the master marks released: a child drops what the master
 * released by reading it, without a system call, and checks that a
 * region holds the blob it asked for before it reads one.
 *
 * The master writes with pwrite() (a full /dev/shm gives ENOSPC, not the
 * SIGBUS a store through a mapping would) and reads through a read-only
 * mapping.  Segments are never shrunk: the arena's memory is what the
 * run used at most (up to FB_ARENA_SEGS x FB_ARENA_SEG_BYTES), returned
 * when the master exits and the last child unmaps.  Blobs larger than
 * FB_ARENA_MAX_BLOB, or that do not fit, keep a file of their own.
 *
 * Master: all calls with fb_blobs_lock held.  Child: fb_arena_view is
 * called with fetch_mu held (one fetch at a time); fb_arena_released
 * only reads.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "runtime/runtime.h"
#include "store/object_int.h"

#define PAGE 4096u
#define MAGIC 0x52414246u /* "FBAR" */
#define LIVE 1u
#define RELEASED 2u

struct extent {
    uint64_t off, len;
};

struct seg {
    int fd;
    const uint8_t *base; /* read-only mapping */
    char path[128];
    struct extent *free; /* sorted by offset, never touching */
    size_t n_free, cap_free;
};

static struct seg segs[FB_ARENA_SEGS];
static int n_segs;
static int broken; /* a segment could not be made: stop trying */

static uint64_t region_len(size_t len)
{
    return ((uint64_t)FB_ARENA_HEAD + len + PAGE - 1) / PAGE * PAGE;
}

static int add_segment(void)
{
    if (n_segs == FB_ARENA_SEGS || broken)
        return -1;
    struct seg *s = &segs[n_segs];
    snprintf(s->path, sizeof s->path, "/dev/shm/fiber-%s-%ld-arena%d",
             fb_rt()->run_id, (long)getpid(), n_segs);
    s->fd = open(s->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    void *map = MAP_FAILED;
    if (s->fd >= 0 && ftruncate(s->fd, FB_ARENA_SEG_BYTES) == 0)
        map = mmap(NULL, FB_ARENA_SEG_BYTES, PROT_READ, MAP_SHARED, s->fd, 0);
    s->free = malloc(8 * sizeof *s->free);
    if (map == MAP_FAILED || !s->free) {
        fb_log_warn("shared-object arena %s unavailable (%s): blobs get "
                    "files of their own", s->path, strerror(errno));
        if (s->fd >= 0) {
            close(s->fd);
            unlink(s->path);
        }
        if (map != MAP_FAILED)
            munmap(map, FB_ARENA_SEG_BYTES);
        free(s->free);
        memset(s, 0, sizeof *s);
        broken = 1;
        return -1;
    }
    s->base = map;
    s->cap_free = 8;
    s->free[0] = (struct extent){0, FB_ARENA_SEG_BYTES};
    s->n_free = 1;
    n_segs++;
    return 0;
}

/* First fit in s: the offset of a new region of n bytes, or -1. */
static int64_t take(struct seg *s, uint64_t n)
{
    for (size_t i = 0; i < s->n_free; i++) {
        struct extent *e = &s->free[i];
        if (e->len < n)
            continue;
        uint64_t off = e->off;
        e->off += n;
        e->len -= n;
        if (e->len == 0) {
            memmove(e, e + 1, (s->n_free - i - 1) * sizeof *e);
            s->n_free--;
        }
        return (int64_t)off;
    }
    return -1;
}

/* Gives [off, off + n) back to s, merging with its neighbours.  Returns
 * 0, or -1 when the extent list cannot grow (the region is then lost to
 * the arena until the run ends: memory, not correctness). */
static int give(struct seg *s, uint64_t off, uint64_t n)
{
    size_t i = 0;
    while (i < s->n_free && s->free[i].off < off)
        i++;
    int left = i > 0 && s->free[i - 1].off + s->free[i - 1].len == off;
    int right = i < s->n_free && off + n == s->free[i].off;
    if (left && right) {
        s->free[i - 1].len += n + s->free[i].len;
        memmove(&s->free[i], &s->free[i + 1],
                (s->n_free - i - 1) * sizeof *s->free);
        s->n_free--;
    } else if (left) {
        s->free[i - 1].len += n;
    } else if (right) {
        s->free[i].off = off;
        s->free[i].len += n;
    } else {
        if (s->n_free == s->cap_free) {
            struct extent *v =
                realloc(s->free, 2 * s->cap_free * sizeof *v);
            if (!v)
                return -1;
            s->free = v;
            s->cap_free *= 2;
        }
        memmove(&s->free[i + 1], &s->free[i],
                (s->n_free - i) * sizeof *s->free);
        s->free[i] = (struct extent){off, n};
        s->n_free++;
    }
    return 0;
}

static int write_all(int fd, const void *p, size_t n, uint64_t off)
{
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p = (const uint8_t *)p + w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

int fb_arena_put(const uint8_t *ref, const void *data, size_t len, int *seg,
                 uint64_t *off, const uint8_t **out)
{
    if (len == 0 || len > FB_ARENA_MAX_BLOB)
        return -1;
    uint64_t n = region_len(len);
    int64_t at = -1;
    int k = 0;
    for (; k < n_segs && at < 0; k++)
        at = take(&segs[k], n);
    if (at < 0) {
        if (add_segment() != 0)
            return -1;
        k = n_segs;
        at = take(&segs[k - 1], n);
    }
    struct seg *s = &segs[k - 1];
    struct fb_arena_head h = {.magic = MAGIC, .state = LIVE, .len = len};
    memcpy(h.ref, ref, FB_WIRE_REF_LEN);
    if (write_all(s->fd, data, len, (uint64_t)at + FB_ARENA_HEAD) != 0 ||
        write_all(s->fd, &h, sizeof h, (uint64_t)at) != 0) {
        fb_log_warn("shared-object arena %s: cannot write %zu bytes (%s): "
                    "this blob gets a file of its own", s->path, len,
                    strerror(errno));
        (void)give(s, (uint64_t)at, n);
        return -1;
    }
    *seg = k - 1;
    *off = (uint64_t)at;
    *out = s->base + at + FB_ARENA_HEAD;
    return 0;
}

void fb_arena_mark_released(int seg, uint64_t off)
{
    uint32_t state = RELEASED;
    if (seg >= 0 && seg < n_segs &&
        write_all(segs[seg].fd, &state, sizeof state,
                  off + offsetof(struct fb_arena_head, state)) != 0)
        fb_log_warn("shared-object arena: cannot mark a region released "
                    "(%s); children drop it when they evict it",
                    strerror(errno));
}

void fb_arena_free(int seg, uint64_t off, size_t len)
{
    if (seg >= 0 && seg < n_segs &&
        give(&segs[seg], off, region_len(len)) != 0)
        fb_log_warn("shared-object arena: out of memory for its free list; "
                    "%llu bytes stay unused until the run ends",
                    (unsigned long long)region_len(len));
}

const char *fb_arena_path(int seg)
{
    return seg >= 0 && seg < n_segs ? segs[seg].path : "";
}

size_t fb_arena_free_bytes(void)
{
    size_t n = 0;
    for (int k = 0; k < n_segs; k++)
        for (size_t i = 0; i < segs[k].n_free; i++)
            n += segs[k].free[i].len;
    return n;
}

int fb_arena_segments(void) { return n_segs; }

void fb_arena_shutdown(void)
{
    /* The files go; the mappings stay (blobs still held read them), as
     * children's do until they exit. */
    for (int k = 0; k < n_segs; k++)
        if (segs[k].path[0]) {
            unlink(segs[k].path);
            segs[k].path[0] = '\0';
        }
}

/* ---- a child -------------------------------------------------------------- */

int fb_map_master_file(const char *path, const char *what, int populate,
                       const uint8_t **out, size_t *size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fb_err_errno(FIBER_ENOKEY, "cannot open %s %s", what, path);
    struct stat st;
    void *map = MAP_FAILED;
    size_t want = *size;
    int fits = fstat(fd, &st) == 0 &&
               (want ? (size_t)st.st_size == want : st.st_size >= (off_t)PAGE);
    if (fits)
        map = mmap(NULL, (size_t)st.st_size, PROT_READ,
                   MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return fits ? fb_err_errno(FIBER_EPROTO, "cannot map %s %s", what,
                                   path)
                    : fb_err(FIBER_EPROTO, "%s %s is not %zu bytes long",
                             what, path, want);
    *out = map;
    *size = (size_t)st.st_size;
    return 0;
}

struct view {
    char path[128];
    const uint8_t *base;
    uint64_t size;
};

static struct view views[4 * FB_ARENA_SEGS];
static int n_views;

/* The mapping of the master's arena file path, made on first use.
 * Returns 0 with *out, or a code. */
static int view_of(const char *path, const struct view **out)
{
    for (int i = 0; i < n_views; i++)
        if (strcmp(views[i].path, path) == 0) {
            *out = &views[i];
            return 0;
        }
    if (strlen(path) >= sizeof views[0].path)
        return fb_err(FIBER_EPROTO, "arena path too long: %s", path);
    if (n_views == (int)FB_ARRAY_LEN(views))
        return fb_err(FIBER_EPROTO, "the master named more than %d arena "
                      "files", n_views);
    const uint8_t *map;
    size_t size = 0;
    int rc = fb_map_master_file(path, "the master's arena", 0, &map, &size);
    if (rc)
        return rc;
    struct view *v = &views[n_views++];
    memcpy(v->path, path, strlen(path) + 1);
    v->base = map;
    v->size = size;
    *out = v;
    return 0;
}

int fb_arena_view(const char *path, uint64_t off, const uint8_t *ref,
                  size_t len, const uint8_t **out)
{
    const struct view *v = NULL;
    int rc = view_of(path, &v);
    if (rc)
        return rc;
    if (off % PAGE || off > v->size || v->size - off < FB_ARENA_HEAD ||
        v->size - off - FB_ARENA_HEAD < len)
        return fb_err(FIBER_EPROTO, "arena region at %llu (+%zu) is outside "
                      "%s (%llu bytes)", (unsigned long long)off, len, path,
                      (unsigned long long)v->size);
    const volatile struct fb_arena_head *h =
        (const volatile struct fb_arena_head *)(v->base + off);
    uint8_t named[FB_WIRE_REF_LEN];
    for (size_t i = 0; i < sizeof named; i++)
        named[i] = h->ref[i];
    if (h->magic != MAGIC || h->len != len ||
        memcmp(named, ref, FB_WIRE_REF_LEN) != 0)
        return fb_err(FIBER_EPROTO, "arena region at %llu of %s does not "
                      "hold the blob the master named", (unsigned long long)off,
                      path);
    if (h->state != LIVE)
        return fb_err(FIBER_ENOKEY, "the shared object was released before "
                      "this process read it");
    *out = v->base + off + FB_ARENA_HEAD;
    return 0;
}

int fb_arena_released(const uint8_t *data)
{
    const volatile struct fb_arena_head *h =
        (const volatile struct fb_arena_head *)(data - FB_ARENA_HEAD);
    return h->state != LIVE;
}
