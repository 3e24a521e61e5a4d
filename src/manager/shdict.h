/*
 * shdict.h -- a manager's dict in shared memory: bytes to bytes, keys in
 * insertion order, kept in a memfd that the manager and its local clients
 * all map, so a local client runs an operation itself under a
 * process-shared lock instead of a round trip to the manager.
 *
 * Semantics are those of the in-process dict (mobj_srv.c): a set on an
 * existing key replaces its value and keeps its place in the order; a get
 * or del of a missing key fails with FIBER_ENOKEY; the empty key and the
 * empty value are allowed; keys are listed as (u32 length | key bytes) x n
 * in insertion order.
 *
 * A view.  The region is the memfd `fd`, mapped at `base` from offset 0
 * with `reserve` bytes of address space (MAP_SHARED | MAP_NORESERVE,
 * PROT_READ | PROT_WRITE).  The dict starts at base + off (off a multiple
 * of 64; the bytes before it are the caller's) and everything after it up
 * to the file's end is the dict's.  Each process maps the region at its own
 * address: the region holds file offsets, never pointers.  When the dict
 * needs room, the process holding its lock grows the file (ftruncate,
 * doubling, never past its reserve) and records the new size in the
 * dict's header; the mappings already cover the reserve, so nobody remaps.
 * Every view of one dict should have the same reserve: a view never
 * touches memory past its own.
 *
 * Locking and crashes.  Every operation, reads included, runs under a
 * robust process-shared mutex in the dict's header.  A process may die
 * (SIGKILL) at any instruction while it holds it: the next locker repairs
 * the dict from its heap, so the interrupted operation is wholly done or
 * not done at all and every other key is intact (shdict.c says how).
 *
 * Trust.  The region is writable by other processes, so its contents are
 * checked before use: every offset and length read from it is bounded by
 * the recorded file size and the view's reserve, and a region that does
 * not add up fails with FIBER_EPROTO ("the dict's shared memory is
 * corrupt ..."), never a crash.  One thing the check takes on trust: that
 * the recorded file size is not larger than the file (a process that
 * shrank the memfd would make an access past its end fault with SIGBUS);
 * fb_shdict_check compares the two.
 *
 * Threads: a view is only read by these calls, so threads of one process
 * may share one; the lock serialises them like processes.
 */
#ifndef FB_SHDICT_H
#define FB_SHDICT_H

#include <stddef.h>
#include <stdint.h>

#include "fiber/fiber.h"

struct fb_shdict {
    uint8_t *base;  /* the mapping of fd, from file offset 0 */
    size_t reserve; /* bytes of address space mapped at base */
    int fd;         /* the memfd (grown with ftruncate by the lock holder);
                       -1: private memory, all of the reservation usable */
    size_t off;     /* file offset of the dict's header; a multiple of 64 */
};

/* The file size (past off) that the creator ftruncates the memfd to before
 * fb_shdict_format: the header, the first index and room for a few
 * hundred small entries. */
#define FB_SHDICT_INITIAL ((size_t)64 * 1024)

/* The longest key: its length is a u32 in fb_shdict_keys' format. */
#define FB_SHDICT_MAX_KEY ((size_t)UINT32_MAX)

/* Formats a new empty dict at d->off, in a file of FB_SHDICT_INITIAL +
 * d->off bytes or more; hash_key is crypto_shorthash_KEYBYTES random
 * bytes, the dict's SipHash key for its lifetime.  Nobody else may use the
 * region until it returns.  Returns 0, FIBER_EINVAL (a bad view: off not a
 * multiple of 64, a file or reserve too small) or FIBER_ESYS. */
int fb_shdict_format(const struct fb_shdict *d, const unsigned char *hash_key);

/* Sets key k (kl bytes) to value v (vl bytes).  Returns 0, FIBER_EINVAL
 * (a key longer than FB_SHDICT_MAX_KEY), FIBER_ENOMEM (the dict would
 * pass its reserve: the message names its limit in bytes; the dict is
 * unchanged), FIBER_ESYS (the file could not grow), FIBER_EPROTO (the
 * region is corrupt) or FIBER_ESTATE (the lock is unrecoverable). */
int fb_shdict_set(const struct fb_shdict *d, const void *k, size_t kl,
                  const void *v, size_t vl);

/* Appends k's value to out.  Returns 0, FIBER_ENOKEY ("no such key (%zu
 * bytes)"), FIBER_ENOMEM (out could not grow; out is unchanged),
 * FIBER_EPROTO or FIBER_ESTATE. */
int fb_shdict_get(const struct fb_shdict *d, const void *k, size_t kl,
                  fiber_buf *out);

/* Removes k.  Returns 0, FIBER_ENOKEY, FIBER_EPROTO or FIBER_ESTATE. */
int fb_shdict_del(const struct fb_shdict *d, const void *k, size_t kl);

/* Stores the number of keys in *n.  Returns 0, FIBER_EPROTO or
 * FIBER_ESTATE. */
int fb_shdict_len(const struct fb_shdict *d, size_t *n);

/* Appends every key to out as (u32 length, native order | key bytes), in
 * insertion order.  Returns 0, FIBER_ENOMEM (out may hold part of the
 * list), FIBER_EPROTO or FIBER_ESTATE. */
int fb_shdict_keys(const struct fb_shdict *d, fiber_buf *out);

/* Checks the whole dict under its lock: the recorded size against the
 * file's, every block of the heap, the free lists, the index and the
 * count.  For tests and for a manager that wants to know.  Returns 0,
 * FIBER_EPROTO naming the first inconsistency, FIBER_ESTATE or
 * FIBER_ESYS. */
int fb_shdict_check(const struct fb_shdict *d);

/* Test hook: when nonzero, the operation that reaches crash point number
 * fb_shdict_crash_at (FB_SHDICT_CP_*) kills its process with SIGKILL
 * there, with the lock held.  0 (the default) turns it off. */
extern volatile int fb_shdict_crash_at;

enum {
    FB_SHDICT_CP_ALLOC_POP = 1,   /* a free block taken off its list */
    FB_SHDICT_CP_BUMP_HDR,        /* a new block's header written, top not */
    FB_SHDICT_CP_GROW_FILE,       /* the file grown, its size not recorded */
    FB_SHDICT_CP_GROW_SIZE,       /* the new size recorded */
    FB_SHDICT_CP_SET_HALF,        /* half an entry's bytes written */
    FB_SHDICT_CP_SET_WRITTEN,     /* all its bytes, not yet LIVE */
    FB_SHDICT_CP_SET_LIVE,        /* LIVE, not yet in the index */
    FB_SHDICT_CP_SET_INDEXED,     /* in the index, old entry not freed */
    FB_SHDICT_CP_SET_OLD_FREE,    /* old entry FREE, not on its list */
    FB_SHDICT_CP_SET_DONE,        /* every step done, lock still held */
    FB_SHDICT_CP_DEL_FREE,        /* the entry FREE, still in the index */
    FB_SHDICT_CP_DEL_UNINDEXED,   /* out of the index, count not updated */
    FB_SHDICT_CP_DEL_COUNTED,     /* count updated, not on its free list */
    FB_SHDICT_CP_REHASH_HALF,     /* a new index half filled */
    FB_SHDICT_CP_REHASH_FILLED,   /* filled, not yet the header's */
    FB_SHDICT_CP_REHASH_SWITCHED, /* the header's, old index not freed */
    FB_SHDICT_CP_REPAIR_SWEPT,    /* a repair's heap sweep done */
    FB_SHDICT_CP_REPAIR_HALF,     /* a repair's new index half filled */
    FB_SHDICT_CP_COUNT = FB_SHDICT_CP_REPAIR_HALF
};

#endif /* FB_SHDICT_H */
