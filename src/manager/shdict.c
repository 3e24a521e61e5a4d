/*
 * shdict.c -- a dict in shared memory that survives a process killed at
 * any instruction while it holds the dict's lock (shdict.h says what it
 * is for and what it takes on trust).
 *
 * Layout.  From the view's off:
 *
 *   header   magic, layout, the recorded file size, the heap's start and
 *            top, the last version handed out (seq), the next insertion
 *            number, the count, the index's offset, one free list head a
 *            size class, the SipHash key, the robust mutex
 *   heap     blocks, back to back from the heap's start to its top
 *
 * A block is 64 << cls bytes (cls 0 to 39: 64 B to 32 TiB), never split
 * or merged, and begins with a 64-byte header saying what it is: FREE (on
 * its class's free list), BUSY (taken by an operation in progress), LIVE
 * (an entry: seq, insertion order, hash, key and value lengths, then the
 * key's and the value's bytes) or INDEX (an open-addressing table of
 * (offset, hash) slots over the LIVE entries, linear probing; an empty
 * slot is offset 0, a deleted one 1).  Since every block says its size,
 * the heap can be walked from its start to its top.  Offsets are file
 * offsets, the same in every process's mapping.
 *
 * Allocation pops the class's free list or, when it is empty, writes a
 * block's header at the top and then advances the top (growing the file
 * first if the top would pass its recorded size: ftruncate to double, at
 * most the reserve, then the new size is recorded).
 *
 * Crash consistency.  The heap is the truth; the index, the free lists
 * and the count are caches of it that a repair rebuilds.  Each operation
 * has one commit point, a single aligned store made with release order
 * after everything it publishes is written:
 *
 *   set  the new entry's state becomes LIVE, with a seq higher than any
 *        before.  Until then the entry is BUSY and ignored; after, it wins
 *        over the key's older entry if that is still LIVE.  Then the index
 *        is pointed at it and the old entry freed.  An overwrite copies the
 *        old entry's insertion number, so the key keeps its place.
 *   del  the entry's state becomes FREE.  Then it leaves the index, the
 *        count drops and the block goes on its free list.
 *   top  the heap's top moves only after the new block's header is
 *        written, so a walk never meets a block without a size.
 *
 * A process that dies holding the lock makes the next locker's
 * pthread_mutex_lock return EOWNERDEAD: it marks the dict for repair
 * (needs_repair, in the header), makes the mutex consistent and repairs.
 * The repair walks the heap: every block that is not LIVE becomes FREE and
 * goes on its free list (BUSY blocks of an unfinished operation, old
 * indexes, blocks lost between a pop and their use); then it takes a new
 * index and inserts every LIVE entry, keeping for each key the entry with
 * the highest seq and freeing the others; last it sets the count, the
 * seq and insertion counters, the index and clears needs_repair.  A repair
 * changes nothing an earlier one decided (it frees only what is not LIVE
 * or is an older copy of a key), so a repair killed in turn is simply done
 * again by the next locker; a repair that fails (FIBER_ENOMEM, or
 * FIBER_EPROTO for a heap that cannot be walked) leaves needs_repair set
 * and every later operation tries again.  The index a repair takes always
 * fits in a block it freed: an index is rehashed before it is half full,
 * so the entries a crash can leave fit half of the index it had.
 *
 * Untrusted memory.  Every offset read from the region is checked against
 * the heap's bounds (its start, and a top that must lie within the
 * recorded file size and the view's reserve) and every length against its
 * block before a byte is touched; a block's fields are read once into
 * locals, then checked, then used.  What does not add up is FIBER_EPROTO.
 * Free lists are walked one pop at a time (a popped block must be FREE
 * and of the class, and becomes BUSY, so a cycle is caught); probes stop
 * after the index's size; heap walks advance at least 64 bytes a block.
 *
 * Limits.  A key is at most FB_SHDICT_MAX_KEY bytes; an entry takes the
 * power of two that holds its 64-byte header, key and value (up to half
 * of it is slack); the index takes 16 bytes a slot at a load of at most
 * one half; the whole dict lives within reserve - off bytes, and a set
 * that would pass them fails with FIBER_ENOMEM, the dict unchanged.  Freed
 * blocks are reused by their class only; the file never shrinks.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "base/common.h"
#include "manager/shdict.h"

volatile int fb_shdict_crash_at;

#define SHD_MAGIC 0x7463696468736266ULL /* "fbshdict" */
#define SHD_LAYOUT 1
#define SHD_ALIGN 64
#define SHD_CLASSES 40
#define SHD_BLK_HDR 64
#define SHD_MIN_SLOTS 64
#define SLOT_EMPTY 0
#define SLOT_TOMB 1

enum {
    ST_FREE = 0x45455246,  /* "FREE" */
    ST_BUSY = 0x59535542,  /* "BUSY" */
    ST_LIVE = 0x4556494c,  /* "LIVE" */
    ST_INDEX = 0x58444e49, /* "INDX" */
};

struct shd_hdr {
    uint64_t magic;
    uint32_t layout;
    uint32_t needs_repair; /* a repair is due (set before it starts) */
    uint64_t file_size;    /* the memfd's size, as its last grower set it */
    uint64_t heap_start;   /* file offset of the first block */
    uint64_t top;          /* file offset past the last block */
    uint64_t seq;          /* the last version given to an entry */
    uint64_t next_order;   /* the next new key's insertion number */
    uint64_t count;        /* LIVE entries */
    uint64_t index;        /* file offset of the INDEX block */
    uint64_t free_head[SHD_CLASSES];
    unsigned char hash_key[crypto_shorthash_KEYBYTES];
    pthread_mutex_t lock __attribute__((aligned(64)));
};

#define SHD_HDR_SIZE                                                          \
    ((sizeof(struct shd_hdr) + SHD_ALIGN - 1) / SHD_ALIGN * SHD_ALIGN)

struct shd_blk {
    uint32_t state;
    uint32_t cls;   /* the block is 64 << cls bytes */
    uint64_t seq;   /* entry: its version; the highest wins at repair */
    uint64_t order; /* entry: its key's insertion number */
    uint64_t hash;  /* entry: its key's SipHash */
    uint64_t next;  /* free: the next free block of its class (0: none) */
    uint64_t klen;  /* entry: key bytes (at +64) */
    uint64_t vlen;  /* entry: value bytes (after the key); index: slots
                     * in use, live or deleted */
    uint64_t spare;
};

struct shd_slot {
    uint64_t off; /* the entry's block, or SLOT_EMPTY, SLOT_TOMB */
    uint64_t hash;
};

_Static_assert(sizeof(struct shd_blk) == SHD_BLK_HDR, "block header size");
/* tests/unit/test_shdict.c scribbles on these fields by their offsets. */
_Static_assert(offsetof(struct shd_hdr, top) == 32 &&
                   offsetof(struct shd_hdr, index) == 64 &&
                   offsetof(struct shd_hdr, free_head) == 72 &&
                   offsetof(struct shd_hdr, lock) == 448 &&
                   SHD_HDR_SIZE == 512,
               "the header's layout 1");
_Static_assert(offsetof(struct shd_blk, klen) == 40 &&
                   offsetof(struct shd_blk, vlen) == 48,
               "the block header's layout 1");
_Static_assert(crypto_shorthash_BYTES == 8, "a SipHash is 64 bits");

/* One operation's view of the dict: the header's bounds, checked once
 * under the lock and kept here. */
struct shd {
    const struct fb_shdict *d;
    uint8_t *base;
    struct shd_hdr *h;
    uint64_t start; /* the heap's start */
    uint64_t top;   /* the heap's top */
    uint64_t lim;   /* the recorded file size, at most the reserve */
};

/* An entry's fields, read once and checked. */
struct shd_ent {
    uint64_t off, seq, order, hash, klen, vlen;
    uint32_t cls;
};

/* An index block, checked. */
struct shd_index {
    uint64_t off;
    struct shd_blk *b;
    struct shd_slot *slot;
    uint64_t cap, used;
};

static void crash_point(int n)
{
    if (fb_shdict_crash_at == n)
        raise(SIGKILL);
}

static int corrupt(const char *fmt, ...) FIBER_PRINTF(1, 2);

static int corrupt(const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return fb_err(FIBER_EPROTO, "the dict's shared memory is corrupt: %s",
                  why);
}

static uint64_t block_size(uint32_t cls) { return (uint64_t)SHD_ALIGN << cls; }

/* The smallest class whose blocks hold need bytes, or -1 past the last. */
static int class_for(uint64_t need)
{
    for (int c = 0; c < SHD_CLASSES; c++)
        if (block_size((uint32_t)c) >= need)
            return c;
    return -1;
}

static struct shd_blk *blk(const struct shd *s, uint64_t off)
{
    return (struct shd_blk *)(s->base + off);
}

/* Checks that a block starts at off within the heap and ends by its top;
 * stores its class.  Returns 0 or -1. */
static int blk_check(const struct shd *s, uint64_t off, uint32_t *cls)
{
    if (off < s->start || off >= s->top || off % SHD_ALIGN ||
        s->top - off < SHD_BLK_HDR)
        return -1;
    uint32_t c = blk(s, off)->cls;
    if (c >= SHD_CLASSES || block_size(c) > s->top - off)
        return -1;
    *cls = c;
    return 0;
}

/* Reads the LIVE entry at off into e.  Returns 0 or FIBER_EPROTO. */
static int ent_read(const struct shd *s, uint64_t off, struct shd_ent *e)
{
    uint32_t cls;
    if (blk_check(s, off, &cls) != 0)
        return corrupt("no block at offset %llu", (unsigned long long)off);
    const struct shd_blk *b = blk(s, off);
    uint64_t size = block_size(cls) - SHD_BLK_HDR;
    e->off = off;
    e->cls = cls;
    e->seq = b->seq;
    e->order = b->order;
    e->hash = b->hash;
    e->klen = b->klen;
    e->vlen = b->vlen;
    if (b->state != ST_LIVE)
        return corrupt("the block at offset %llu is not an entry",
                       (unsigned long long)off);
    if (e->klen > size || e->vlen > size - e->klen)
        return corrupt("the entry at offset %llu is longer than its block",
                       (unsigned long long)off);
    return 0;
}

static const uint8_t *ent_key(const struct shd *s, const struct shd_ent *e)
{
    return s->base + e->off + SHD_BLK_HDR;
}

static int ent_is(const struct shd *s, const struct shd_ent *e,
                  const void *k, size_t kl, uint64_t hash)
{
    return e->hash == hash && e->klen == kl &&
           (kl == 0 || memcmp(ent_key(s, e), k, kl) == 0);
}

/* Reads the INDEX block at off into ix.  Returns 0 or FIBER_EPROTO. */
static int index_read(const struct shd *s, uint64_t off, struct shd_index *ix)
{
    uint32_t cls;
    if (blk_check(s, off, &cls) != 0 || blk(s, off)->state != ST_INDEX ||
        block_size(cls) < SHD_BLK_HDR + SHD_MIN_SLOTS * sizeof(struct shd_slot))
        return corrupt("no index at offset %llu", (unsigned long long)off);
    ix->off = off;
    ix->b = blk(s, off);
    ix->slot = (struct shd_slot *)(s->base + off + SHD_BLK_HDR);
    ix->cap = (block_size(cls) - SHD_BLK_HDR) / sizeof(struct shd_slot);
    ix->used = ix->b->vlen;
    if (ix->used > ix->cap)
        return corrupt("the index at offset %llu has %llu of %llu slots in "
                       "use", (unsigned long long)off,
                       (unsigned long long)ix->used,
                       (unsigned long long)ix->cap);
    return 0;
}

/* Looks k up in ix.  On 0, e->off is its entry's offset (0: none), *at its
 * slot, and *ins the slot a new entry for it would take.  Returns 0 or
 * FIBER_EPROTO. */
static int index_find(const struct shd *s, const struct shd_index *ix,
                      const void *k, size_t kl, uint64_t hash,
                      struct shd_ent *e, uint64_t *at, uint64_t *ins)
{
    uint64_t i = hash % ix->cap, tomb = UINT64_MAX;
    for (uint64_t n = 0; n < ix->cap; n++, i = i + 1 == ix->cap ? 0 : i + 1) {
        uint64_t off = ix->slot[i].off;
        if (off == SLOT_EMPTY) {
            *ins = tomb != UINT64_MAX ? tomb : i;
            e->off = 0;
            return 0;
        }
        if (off == SLOT_TOMB) {
            if (tomb == UINT64_MAX)
                tomb = i;
            continue;
        }
        if (ix->slot[i].hash != hash)
            continue;
        int rc = ent_read(s, off, e);
        if (rc)
            return rc;
        if (ent_is(s, e, k, kl, hash)) {
            *at = i;
            return 0;
        }
    }
    if (tomb == UINT64_MAX)
        return corrupt("its index of %llu slots is full",
                       (unsigned long long)ix->cap);
    *ins = tomb;
    e->off = 0;
    return 0;
}

/* ---- allocation ------------------------------------------------------- */

/* The size of d's file, or the whole reservation when d is private
 * memory (fd -1: a manager out of descriptors), all of which may be
 * touched. */
static int file_bytes(const struct fb_shdict *d, uint64_t *n)
{
    struct stat st;
    if (d->fd < 0) {
        *n = d->reserve;
        return 0;
    }
    if (fstat(d->fd, &st) != 0)
        return fb_err_errno(FIBER_ESYS, "cannot stat the dict's memfd");
    *n = (uint64_t)st.st_size;
    return 0;
}

/* Grows the file so that size more bytes fit above the top: doubling,
 * capped at the reserve.  Returns 0, FIBER_ENOMEM or FIBER_ESYS. */
static int grow(struct shd *s, uint64_t size)
{
    const struct fb_shdict *d = s->d;
    if (size > d->reserve || s->top > d->reserve - size)
        return fb_err(FIBER_ENOMEM, "the dict is full: %llu more bytes would "
                      "pass its limit of %zu bytes",
                      (unsigned long long)size, d->reserve - d->off);
    uint64_t want = s->top + size, n = s->h->file_size;
    if (n < SHD_ALIGN)
        n = SHD_ALIGN;
    while (n < want && n <= d->reserve / 2)
        n *= 2;
    if (n < want || n > d->reserve)
        n = d->reserve;
    uint64_t st_size = 0;
    int frc = file_bytes(d, &st_size);
    if (frc)
        return frc;
    /* A grower killed before it recorded the size may have left the file
     * larger; it never shrinks. */
    if (d->fd >= 0 && st_size < n && ftruncate(d->fd, (off_t)n) != 0)
        return fb_err_errno(FIBER_ESYS, "cannot grow the dict's memfd to "
                            "%llu bytes", (unsigned long long)n);
    crash_point(FB_SHDICT_CP_GROW_FILE);
    s->h->file_size = n;
    s->lim = n;
    crash_point(FB_SHDICT_CP_GROW_SIZE);
    return 0;
}

static void blk_push_free(struct shd *s, uint64_t off, uint32_t cls)
{
    blk(s, off)->next = s->h->free_head[cls];
    s->h->free_head[cls] = off;
}

/* Frees the block at off: FREE first (a commit point for a del), then on
 * its class's list. */
static void blk_free(struct shd *s, uint64_t off, uint32_t cls)
{
    __atomic_store_n(&blk(s, off)->state, ST_FREE, __ATOMIC_RELEASE);
    blk_push_free(s, off, cls);
}

/* Pops a block of class c off its free list into *off (0: the list is
 * empty).  Returns 0 or FIBER_EPROTO. */
static int blk_pop(struct shd *s, int c, uint64_t *off)
{
    uint64_t head = s->h->free_head[c];
    uint32_t cls;
    *off = 0;
    if (head == 0)
        return 0;
    if (blk_check(s, head, &cls) != 0 || cls != (uint32_t)c ||
        blk(s, head)->state != ST_FREE)
        return corrupt("the free list of %llu-byte blocks leads to offset "
                       "%llu, no free block of that size",
                       (unsigned long long)block_size((uint32_t)c),
                       (unsigned long long)head);
    s->h->free_head[c] = blk(s, head)->next; /* checked when it is popped */
    crash_point(FB_SHDICT_CP_ALLOC_POP);
    blk(s, head)->state = ST_BUSY;
    *off = head;
    return 0;
}

/* Takes a BUSY block of at least need bytes: from its class's free list
 * or, if any_larger, the first larger class's that has one; else from the
 * top, growing the file.  Returns 0, FIBER_ENOMEM, FIBER_ESYS or
 * FIBER_EPROTO. */
static int blk_alloc(struct shd *s, uint64_t need, int any_larger,
                     uint64_t *off)
{
    int c = class_for(need);
    if (c < 0)
        return fb_err(FIBER_ENOMEM, "the dict is full: %llu bytes would "
                      "pass its limit of %zu bytes",
                      (unsigned long long)need, s->d->reserve - s->d->off);
    for (int k = c; k < (any_larger ? SHD_CLASSES : c + 1); k++) {
        int rc = blk_pop(s, k, off);
        if (rc || *off)
            return rc;
    }
    uint64_t size = block_size((uint32_t)c);
    if (size > s->lim - s->top) {
        int rc = grow(s, size);
        if (rc)
            return rc;
    }
    struct shd_blk *b = blk(s, s->top);
    b->cls = (uint32_t)c;
    b->state = ST_BUSY;
    b->next = 0;
    crash_point(FB_SHDICT_CP_BUMP_HDR);
    *off = s->top;
    s->top += size;
    __atomic_store_n(&s->h->top, s->top, __ATOMIC_RELEASE);
    return 0;
}

/* ---- the index -------------------------------------------------------- */

static uint64_t index_bytes(uint64_t slots)
{
    return SHD_BLK_HDR + slots * sizeof(struct shd_slot);
}

/* Takes a new index block of at least `slots` slots, all empty (still
 * BUSY: its caller fills it, then makes it INDEX). */
static int index_new(struct shd *s, uint64_t slots, int any_larger,
                     struct shd_index *ix)
{
    if (slots < SHD_MIN_SLOTS)
        slots = SHD_MIN_SLOTS;
    uint64_t off;
    int rc = blk_alloc(s, index_bytes(slots), any_larger, &off);
    if (rc)
        return rc;
    ix->off = off;
    ix->b = blk(s, off);
    ix->slot = (struct shd_slot *)(s->base + off + SHD_BLK_HDR);
    ix->cap = (block_size(ix->b->cls) - SHD_BLK_HDR) / sizeof(struct shd_slot);
    ix->used = 0;
    memset(ix->slot, 0, ix->cap * sizeof(struct shd_slot));
    return 0;
}

/* Puts an entry known not to be in ix into its first free slot. */
static void index_put(struct shd_index *ix, uint64_t off, uint64_t hash)
{
    uint64_t i = hash % ix->cap;
    while (ix->slot[i].off != SLOT_EMPTY)
        i = i + 1 == ix->cap ? 0 : i + 1;
    ix->slot[i].off = off;
    ix->slot[i].hash = hash;
    ix->used++;
}

/* Makes ix, filled, the dict's index. */
static void index_publish(struct shd_index *ix)
{
    ix->b->vlen = ix->used;
    __atomic_store_n(&ix->b->state, ST_INDEX, __ATOMIC_RELEASE);
}

/* Replaces the index ix with one of room for 4 x (count + 1) entries (at
 * least), without its deleted slots.  On 0, ix is the new index. */
static int index_rehash(struct shd *s, struct shd_index *ix)
{
    struct shd_index nx;
    if (s->h->count > s->top / SHD_ALIGN)
        return corrupt("it counts %llu entries in a %llu-byte heap",
                       (unsigned long long)s->h->count,
                       (unsigned long long)(s->top - s->start));
    int rc = index_new(s, 4 * (s->h->count + 1), 0, &nx);
    if (rc)
        return rc;
    for (uint64_t i = 0; i < ix->cap; i++) {
        uint64_t off = ix->slot[i].off;
        struct shd_ent e;
        if (off == SLOT_EMPTY || off == SLOT_TOMB)
            continue;
        if ((rc = ent_read(s, off, &e)) != 0 || nx.used * 2 >= nx.cap) {
            blk_free(s, nx.off, nx.b->cls);
            return rc ? rc : corrupt("its index holds more entries than its "
                                     "count of %llu",
                                     (unsigned long long)s->h->count);
        }
        index_put(&nx, off, e.hash);
        if (nx.used == s->h->count / 2)
            crash_point(FB_SHDICT_CP_REHASH_HALF);
    }
    index_publish(&nx);
    crash_point(FB_SHDICT_CP_REHASH_FILLED);
    __atomic_store_n(&s->h->index, nx.off, __ATOMIC_RELEASE);
    crash_point(FB_SHDICT_CP_REHASH_SWITCHED);
    blk_free(s, ix->off, ix->b->cls);
    *ix = nx;
    return 0;
}

/* ---- repair ----------------------------------------------------------- */

/* Frees every block that is not an entry and rebuilds the free lists;
 * counts the entries and the highest seq and insertion number. */
static int repair_sweep(struct shd *s, uint64_t *live, uint64_t *max_seq,
                        uint64_t *max_order)
{
    memset(s->h->free_head, 0, sizeof s->h->free_head);
    for (uint64_t off = s->start; off < s->top;) {
        uint32_t cls, state;
        if (blk_check(s, off, &cls) != 0)
            return corrupt("its heap has no valid block at offset %llu",
                           (unsigned long long)off);
        state = blk(s, off)->state;
        if (state == ST_LIVE) {
            struct shd_ent e;
            int rc = ent_read(s, off, &e);
            if (rc)
                return rc;
            (*live)++;
            if (e.seq > *max_seq)
                *max_seq = e.seq;
            if (e.order > *max_order)
                *max_order = e.order;
        } else if (state == ST_FREE || state == ST_BUSY || state == ST_INDEX) {
            blk_free(s, off, cls);
        } else {
            return corrupt("the block at offset %llu has state %#x",
                           (unsigned long long)off, state);
        }
        off += block_size(cls);
    }
    return 0;
}

/* Puts every entry into nx, the newest of each key; frees the others. */
static int repair_fill(struct shd *s, struct shd_index *nx, uint64_t live,
                       uint64_t *count)
{
    for (uint64_t off = s->start; off < s->top;) {
        uint32_t cls;
        if (blk_check(s, off, &cls) != 0)
            return corrupt("its heap has no valid block at offset %llu",
                           (unsigned long long)off);
        struct shd_ent e, old;
        uint64_t at = 0, ins = 0;
        int rc = 0;
        if (blk(s, off)->state == ST_LIVE &&
            (rc = ent_read(s, off, &e)) == 0 &&
            (rc = index_find(s, nx, ent_key(s, &e), e.klen, e.hash, &old,
                             &at, &ins)) == 0) {
            if (old.off == 0) {
                nx->slot[ins].off = off;
                nx->slot[ins].hash = e.hash;
                nx->used++;
                if (++*count == live / 2)
                    crash_point(FB_SHDICT_CP_REPAIR_HALF);
            } else if (old.seq < e.seq) {
                nx->slot[at].off = off;
                blk_free(s, old.off, old.cls);
            } else {
                blk_free(s, off, cls);
            }
        }
        if (rc)
            return rc;
        off += block_size(cls);
    }
    return 0;
}

/* Rebuilds the dict's free lists, index and count from its heap (the top
 * comment says why that is enough).  Returns 0, FIBER_EPROTO,
 * FIBER_ENOMEM or FIBER_ESYS; needs_repair stays set on failure. */
static int repair(struct shd *s)
{
    struct shd_hdr *h = s->h;
    uint64_t st_size = 0;
    h->needs_repair = 1;
    int frc = file_bytes(s->d, &st_size);
    if (frc)
        return frc;
    if (st_size < s->lim)
        return corrupt("its recorded size %llu is past the file's %lld",
                       (unsigned long long)s->lim, (long long)st_size);
    uint64_t live = 0, max_seq = h->seq, max_order = h->next_order, count = 0;
    h->index = 0;
    int rc = repair_sweep(s, &live, &max_seq, &max_order);
    if (rc)
        return rc;
    crash_point(FB_SHDICT_CP_REPAIR_SWEPT);
    struct shd_index nx;
    if ((rc = index_new(s, 2 * live, 1, &nx)) != 0 ||
        (rc = repair_fill(s, &nx, live, &count)) != 0)
        return rc;
    index_publish(&nx);
    h->seq = max_seq;
    h->next_order = max_order + 1;
    h->count = count;
    h->index = nx.off;
    __atomic_store_n(&h->needs_repair, 0, __ATOMIC_RELEASE);
    return 0;
}

/* ---- locking ---------------------------------------------------------- */

static int view_open(const struct fb_shdict *d, struct shd *s)
{
    if (!d || !d->base || d->off % SHD_ALIGN || d->off > d->reserve ||
        d->reserve - d->off < SHD_HDR_SIZE)
        return fb_err(FIBER_EINVAL, "not a view of a shared dict (offset "
                      "%zu, reserve %zu)", d ? d->off : 0,
                      d ? d->reserve : 0);
    s->d = d;
    s->base = d->base;
    s->h = (struct shd_hdr *)(d->base + d->off);
    if (__atomic_load_n(&s->h->magic, __ATOMIC_ACQUIRE) != SHD_MAGIC ||
        s->h->layout != SHD_LAYOUT)
        return corrupt("no dict's header at offset %zu", d->off);
    return 0;
}

/* Checks the header's bounds into s (under the lock). */
static int view_load(struct shd *s)
{
    const struct fb_shdict *d = s->d;
    struct shd_hdr *h = s->h;
    uint64_t file_size = h->file_size, top = h->top;
    s->start = d->off + SHD_HDR_SIZE;
    s->lim = file_size < d->reserve ? file_size : d->reserve;
    if (h->heap_start != s->start)
        return corrupt("its heap starts at %llu, not %llu",
                       (unsigned long long)h->heap_start,
                       (unsigned long long)s->start);
    if (top < s->start || top > s->lim || top % SHD_ALIGN)
        return corrupt("its heap's top %llu is outside [%llu, %llu]",
                       (unsigned long long)top, (unsigned long long)s->start,
                       (unsigned long long)s->lim);
    s->top = top;
    return 0;
}

static void shd_unlock(struct shd *s) { pthread_mutex_unlock(&s->h->lock); }

/* Takes the lock of the dict s has opened, repairing the dict after a
 * holder died (or after a repair that failed).  On 0 the caller holds the
 * lock. */
static int shd_lock(struct shd *s)
{
    int rc, err = pthread_mutex_lock(&s->h->lock);
    if (err == EOWNERDEAD) {
        s->h->needs_repair = 1;
        pthread_mutex_consistent(&s->h->lock);
    } else if (err == ENOTRECOVERABLE) {
        return fb_err(FIBER_ESTATE, "the dict's lock is unrecoverable: a "
                      "process died holding it and it was released "
                      "without a repair");
    } else if (err) {
        errno = err;
        return fb_err_errno(FIBER_ESYS, "cannot take the dict's lock");
    }
    rc = view_load(s);
    if (rc == 0 && s->h->needs_repair)
        rc = repair(s);
    if (rc)
        shd_unlock(s);
    return rc;
}

static int shd_index(const struct shd *s, struct shd_index *ix)
{
    return index_read(s, s->h->index, ix);
}

static uint64_t key_hash(const struct shd *s, const void *k, size_t kl)
{
    unsigned char key[crypto_shorthash_KEYBYTES], out[8];
    memcpy(key, s->h->hash_key, sizeof key);
    crypto_shorthash(out, kl ? k : (const void *)key, kl, key);
    uint64_t v;
    memcpy(&v, out, sizeof v);
    return v;
}

/* Opens d, hashes k with its key (outside the lock: the key is fixed at
 * format) and takes the lock. */
static int lock_for_key(const struct fb_shdict *d, const void *k, size_t kl,
                        struct shd *s, uint64_t *hash)
{
    int rc = view_open(d, s);
    if (rc)
        return rc;
    *hash = key_hash(s, k, kl);
    return shd_lock(s);
}

/* ---- operations ------------------------------------------------------- */

int fb_shdict_format(const struct fb_shdict *d, const unsigned char *hash_key)
{
    if (!d || !d->base || !hash_key || d->off % SHD_ALIGN ||
        d->reserve < d->off || d->reserve - d->off < FB_SHDICT_INITIAL)
        return fb_err(FIBER_EINVAL, "cannot format a shared dict at offset "
                      "%zu of a %zu-byte reservation", d ? d->off : 0,
                      d ? d->reserve : 0);
    uint64_t st_size = 0;
    int frc = file_bytes(d, &st_size);
    if (frc)
        return frc;
    if (st_size < d->off + FB_SHDICT_INITIAL)
        return fb_err(FIBER_EINVAL, "the dict's memfd has %lld bytes, fewer "
                      "than %zu", (long long)st_size,
                      d->off + FB_SHDICT_INITIAL);
    struct shd s = {d, d->base, (struct shd_hdr *)(d->base + d->off), 0, 0, 0};
    struct shd_hdr *h = s.h;
    memset(h, 0, SHD_HDR_SIZE);
    h->layout = SHD_LAYOUT;
    h->file_size = st_size < d->reserve ? st_size
                                                     : d->reserve;
    h->heap_start = h->top = s.start = s.top = d->off + SHD_HDR_SIZE;
    s.lim = h->file_size;
    h->next_order = 1;
    memcpy(h->hash_key, hash_key, sizeof h->hash_key);
    pthread_mutexattr_t a;
    int err = pthread_mutexattr_init(&a);
    if (!err)
        err = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (!err)
        err = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    if (!err)
        err = pthread_mutex_init(&h->lock, &a);
    pthread_mutexattr_destroy(&a);
    if (err) {
        errno = err;
        return fb_err_errno(FIBER_ESYS, "cannot make the dict's lock");
    }
    struct shd_index ix;
    int rc = index_new(&s, SHD_MIN_SLOTS, 0, &ix);
    if (rc)
        return rc;
    index_publish(&ix);
    h->index = ix.off;
    __atomic_store_n(&h->magic, SHD_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

/* Writes a new entry for k (order: its insertion number) and makes it
 * LIVE; stores its offset and class. */
static int set_write(struct shd *s, const void *k, size_t kl, const void *v,
                     size_t vl, uint64_t hash, uint64_t order, uint64_t *off)
{
    int rc = blk_alloc(s, SHD_BLK_HDR + (uint64_t)kl + vl, 0, off);
    if (rc)
        return rc;
    struct shd_blk *b = blk(s, *off);
    uint8_t *p = s->base + *off + SHD_BLK_HDR;
    b->order = order;
    b->hash = hash;
    b->klen = kl;
    b->vlen = vl;
    b->next = 0;
    if (kl)
        memcpy(p, k, kl);
    if (vl)
        memcpy(p + kl, v, vl / 2);
    crash_point(FB_SHDICT_CP_SET_HALF);
    if (vl)
        memcpy(p + kl + vl / 2, (const uint8_t *)v + vl / 2, vl - vl / 2);
    crash_point(FB_SHDICT_CP_SET_WRITTEN);
    b->seq = ++s->h->seq;
    __atomic_store_n(&b->state, ST_LIVE, __ATOMIC_RELEASE);
    crash_point(FB_SHDICT_CP_SET_LIVE);
    return 0;
}

static int set_locked(struct shd *s, const void *k, size_t kl, const void *v,
                      size_t vl, uint64_t hash)
{
    struct shd_index ix;
    struct shd_ent old;
    uint64_t at = 0, ins = 0, off;
    int rc = shd_index(s, &ix);
    if (rc == 0)
        rc = index_find(s, &ix, k, kl, hash, &old, &at, &ins);
    if (rc == 0 && old.off == 0 && (ix.used + 1) * 2 > ix.cap &&
        (rc = index_rehash(s, &ix)) == 0)
        rc = index_find(s, &ix, k, kl, hash, &old, &at, &ins);
    if (rc)
        return rc;
    uint64_t order = old.off ? old.order : s->h->next_order;
    if ((rc = set_write(s, k, kl, v, vl, hash, order, &off)) != 0)
        return rc;
    if (old.off) {
        ix.slot[at].off = off;
        crash_point(FB_SHDICT_CP_SET_INDEXED);
        __atomic_store_n(&blk(s, old.off)->state, ST_FREE, __ATOMIC_RELEASE);
        crash_point(FB_SHDICT_CP_SET_OLD_FREE);
        blk_push_free(s, old.off, old.cls);
    } else {
        s->h->next_order = order + 1;
        if (ix.slot[ins].off == SLOT_EMPTY)
            ix.b->vlen = ++ix.used;
        ix.slot[ins].hash = hash;
        ix.slot[ins].off = off;
        crash_point(FB_SHDICT_CP_SET_INDEXED);
        s->h->count++;
    }
    crash_point(FB_SHDICT_CP_SET_DONE);
    return 0;
}

int fb_shdict_set(const struct fb_shdict *d, const void *k, size_t kl,
                  const void *v, size_t vl)
{
    if (kl > FB_SHDICT_MAX_KEY)
        return fb_err(FIBER_EINVAL, "a dict's key is at most %zu bytes, not "
                      "%zu", FB_SHDICT_MAX_KEY, kl);
    struct shd s;
    uint64_t hash;
    int rc = view_open(d, &s);
    if (rc)
        return rc;
    if (vl > d->reserve || vl > (size_t)1 << 60)
        return fb_err(FIBER_ENOMEM, "the dict is full: a %zu-byte value "
                      "would pass its limit of %zu bytes", vl,
                      d->reserve - d->off);
    if ((rc = lock_for_key(d, k, kl, &s, &hash)) != 0)
        return rc;
    rc = set_locked(&s, k, kl, v, vl, hash);
    shd_unlock(&s);
    return rc;
}

/* Takes d's lock and finds k: on 0 the caller holds the lock, e is k's
 * entry and *at its slot in ix; on failure (FIBER_ENOKEY too) the lock is
 * released. */
static int find_key(const struct fb_shdict *d, const void *k, size_t kl,
                    struct shd *s, struct shd_index *ix, struct shd_ent *e,
                    uint64_t *at)
{
    uint64_t hash, ins;
    int rc = lock_for_key(d, k, kl, s, &hash);
    if (rc)
        return rc;
    rc = shd_index(s, ix);
    if (rc == 0)
        rc = index_find(s, ix, k, kl, hash, e, at, &ins);
    if (rc == 0 && e->off == 0)
        rc = fb_err(FIBER_ENOKEY, "no such key (%zu bytes)", kl);
    if (rc)
        shd_unlock(s);
    return rc;
}

int fb_shdict_get(const struct fb_shdict *d, const void *k, size_t kl,
                  fiber_buf *out)
{
    struct shd s;
    struct shd_index ix;
    struct shd_ent e;
    uint64_t at;
    int rc = find_key(d, k, kl, &s, &ix, &e, &at);
    if (rc)
        return rc;
    if (fiber_buf_append(out, ent_key(&s, &e) + e.klen, e.vlen) != 0)
        rc = fb_err(FIBER_ENOMEM, "out of memory for a %llu-byte value",
                    (unsigned long long)e.vlen);
    shd_unlock(&s);
    return rc;
}

int fb_shdict_del(const struct fb_shdict *d, const void *k, size_t kl)
{
    struct shd s;
    struct shd_index ix;
    struct shd_ent e;
    uint64_t at;
    int rc = find_key(d, k, kl, &s, &ix, &e, &at);
    if (rc)
        return rc;
    __atomic_store_n(&blk(&s, e.off)->state, ST_FREE, __ATOMIC_RELEASE);
    crash_point(FB_SHDICT_CP_DEL_FREE);
    ix.slot[at].off = SLOT_TOMB;
    crash_point(FB_SHDICT_CP_DEL_UNINDEXED);
    s.h->count--;
    crash_point(FB_SHDICT_CP_DEL_COUNTED);
    blk_push_free(&s, e.off, e.cls);
    shd_unlock(&s);
    return 0;
}

int fb_shdict_len(const struct fb_shdict *d, size_t *n)
{
    struct shd s;
    int rc = view_open(d, &s);
    if (rc == 0)
        rc = shd_lock(&s);
    if (rc)
        return rc;
    *n = (size_t)s.h->count;
    shd_unlock(&s);
    return 0;
}

/* A key found by fb_shdict_keys: its insertion number and where its bytes
 * are in the copy. */
struct key_ref {
    uint64_t order;
    size_t at, len;
};

static int key_ref_cmp(const void *a, const void *b)
{
    const struct key_ref *x = a, *y = b;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* Copies every key and its insertion number out of the index. */
static int keys_copy(struct shd *s, fiber_buf *refs, fiber_buf *bytes)
{
    struct shd_index ix;
    int rc = shd_index(s, &ix);
    for (uint64_t i = 0; rc == 0 && i < ix.cap; i++) {
        uint64_t off = ix.slot[i].off;
        struct shd_ent e;
        if (off == SLOT_EMPTY || off == SLOT_TOMB)
            continue;
        if ((rc = ent_read(s, off, &e)) != 0)
            break;
        struct key_ref r = {e.order, bytes->len, (size_t)e.klen};
        if (fiber_buf_append(refs, &r, sizeof r) != 0 ||
            fiber_buf_append(bytes, ent_key(s, &e), e.klen) != 0)
            rc = fb_err(FIBER_ENOMEM, "out of memory for the dict's keys");
    }
    return rc;
}

int fb_shdict_keys(const struct fb_shdict *d, fiber_buf *out)
{
    struct shd s;
    fiber_buf refs = {0}, bytes = {0};
    int rc = view_open(d, &s);
    if (rc == 0)
        rc = shd_lock(&s);
    if (rc)
        return rc;
    rc = keys_copy(&s, &refs, &bytes);
    shd_unlock(&s);
    size_t n = refs.len / sizeof(struct key_ref);
    struct key_ref *r = (struct key_ref *)refs.data;
    if (rc == 0 && n)
        qsort(r, n, sizeof *r, key_ref_cmp);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        uint32_t len = (uint32_t)r[i].len;
        if (fiber_buf_append(out, &len, sizeof len) != 0 ||
            fiber_buf_append(out, bytes.data + r[i].at, r[i].len) != 0)
            rc = fb_err(FIBER_ENOMEM, "out of memory for the dict's keys");
    }
    fiber_buf_free(&refs);
    fiber_buf_free(&bytes);
    return rc;
}

/* ---- the full check --------------------------------------------------- */

/* Walks the heap: no BUSY block, exactly the one index, the entries
 * counted (each findable in the index), the free blocks counted. */
static int check_heap(struct shd *s, const struct shd_index *ix,
                      uint64_t *nfree, uint64_t *nblocks)
{
    uint64_t live = 0;
    for (uint64_t off = s->start; off < s->top;) {
        uint32_t cls, state;
        if (blk_check(s, off, &cls) != 0)
            return corrupt("its heap has no valid block at offset %llu",
                           (unsigned long long)off);
        state = blk(s, off)->state;
        (*nblocks)++;
        if (state == ST_LIVE) {
            struct shd_ent e, found;
            uint64_t at, ins;
            int rc = ent_read(s, off, &e);
            if (rc == 0)
                rc = index_find(s, ix, ent_key(s, &e), e.klen, e.hash,
                                &found, &at, &ins);
            if (rc)
                return rc;
            if (found.off != off)
                return corrupt("the entry at offset %llu is not in the "
                               "index", (unsigned long long)off);
            live++;
        } else if (state == ST_FREE) {
            (*nfree)++;
        } else if (!(state == ST_INDEX && off == ix->off)) {
            return corrupt("the block at offset %llu has state %#x",
                           (unsigned long long)off, state);
        }
        off += block_size(cls);
    }
    if (live != s->h->count)
        return corrupt("it counts %llu entries and holds %llu",
                       (unsigned long long)s->h->count,
                       (unsigned long long)live);
    return 0;
}

/* Walks every free list (at most nblocks steps in all). */
static int check_free_lists(struct shd *s, uint64_t nfree, uint64_t nblocks)
{
    uint64_t listed = 0;
    for (uint32_t c = 0; c < SHD_CLASSES; c++)
        for (uint64_t off = s->h->free_head[c]; off;
             off = blk(s, off)->next) {
            uint32_t cls;
            if (blk_check(s, off, &cls) != 0 || cls != c ||
                blk(s, off)->state != ST_FREE || ++listed > nblocks)
                return corrupt("the free list of %llu-byte blocks leads to "
                               "offset %llu, no free block of that size "
                               "(or it loops)",
                               (unsigned long long)block_size(c),
                               (unsigned long long)off);
        }
    if (listed != nfree)
        return corrupt("%llu free blocks and %llu on the free lists",
                       (unsigned long long)nfree,
                       (unsigned long long)listed);
    return 0;
}

static int check_locked(struct shd *s)
{
    uint64_t st_size = 0;
    int frc = file_bytes(s->d, &st_size);
    if (frc)
        return frc;
    if (st_size < s->lim)
        return corrupt("its recorded size %llu is past the file's %lld",
                       (unsigned long long)s->lim, (long long)st_size);
    struct shd_index ix;
    uint64_t nfree = 0, nblocks = 0, in_index = 0;
    int rc = shd_index(s, &ix);
    if (rc == 0)
        rc = check_heap(s, &ix, &nfree, &nblocks);
    if (rc == 0)
        rc = check_free_lists(s, nfree, nblocks);
    for (uint64_t i = 0; rc == 0 && i < ix.cap; i++)
        in_index += ix.slot[i].off != SLOT_EMPTY;
    if (rc == 0 && in_index != ix.used)
        rc = corrupt("its index has %llu slots in use, not %llu",
                     (unsigned long long)in_index,
                     (unsigned long long)ix.used);
    if (rc == 0 && ix.used * 2 > ix.cap)
        rc = corrupt("its index is more than half full");
    return rc;
}

int fb_shdict_check(const struct fb_shdict *d)
{
    struct shd s;
    int rc = view_open(d, &s);
    if (rc == 0)
        rc = shd_lock(&s);
    if (rc)
        return rc;
    rc = check_locked(&s);
    shd_unlock(&s);
    return rc;
}
