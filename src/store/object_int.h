/*
 * object_int.h -- shared objects inside: the store of blobs (object.c),
 * the blob server that serves them (objserve.c: in the master, with the
 * directory of holders; in a child, as a relay of what it caches), and
 * what the pool and the worker loop call.
 *
 * Locking: one mutex (fb_blobs_lock) guards the store and every blob's
 * fields, in the master and in a child.  The server thread takes it
 * briefly per request and per piece it queues; it is never held across a
 * system call that waits.
 */
#ifndef FB_OBJECT_INT_H
#define FB_OBJECT_INT_H

#include <stddef.h>
#include <stdint.h>

#include "fiber/fiber.h"
#include "wire/wire.h"

#define FB_BLOB_FANOUT 2        /* askers a holder serves at once */
#define FB_BLOB_MASTER_SLOTS 2  /* copies the master sends at once */
#define FB_BLOB_MASTER_COPIES 4 /* and in all, while holders remain */

struct fb_sconn;

/* A worker that holds a blob (master only). */
struct fb_holder {
    char addr[FB_WIRE_ADDR_MAX + 1];
    struct fb_sconn *owner; /* its connection to the master */
    int load;               /* askers sent to it, not yet settled */
    struct fb_holder *next;
};

/* An asker waiting until some holder or a master slot is free (master). */
struct fb_waiter {
    struct fb_sconn *conn;
    uint64_t id;
    struct fb_waiter *next;
};

struct fb_blob {
    uint8_t ref[FB_WIRE_REF_LEN];
    uint8_t *data;
    size_t len;
    int owners;      /* master: puts not yet released */
    int pins;        /* transfers, tasks, pool calls using it */
    int outer_pins;  /* child: fiber_object_get outside a task */
    int mapped;      /* data is a read-only (child) or shared (master)
                        mapping of shm_path: munmap, not free */
    int in_arena;    /* data is in the master's arena (arena.c): neither
                        munmap nor free.  Master: at arena_off of segment
                        arena_seg; child: a view it must OBJ_DROP */
    int arena_seg;
    uint64_t arena_off;
    int child_holds; /* master: children the arena region was placed for
                        that have not dropped it (objserve.c) */
    int orphan;      /* master: released, out of the table, kept only
                        while child_holds > 0 */
    char shm_path[128]; /* master: the file same-host children map;
                           child: the master's file it maps ("" if sent) */
    struct fb_blob *hnext;
    struct fb_blob *lru_prev, *lru_next; /* child: oldest use first */
    /* master: the directory */
    struct fb_holder *holders;
    struct fb_waiter *waiters;
    int master_active; /* copies being sent now */
    int master_sent;   /* copies sent in all */
};

/* ---- the store (object.c) ---- */
void fb_blobs_lock(void);
void fb_blobs_unlock(void);
/* Lock held.  NULL when absent. */
struct fb_blob *fb_blob_find(const uint8_t ref[FB_WIRE_REF_LEN]);
/* Lock held.  Pins keep a blob from being freed or evicted. */
void fb_blob_pin(struct fb_blob *b);
void fb_blob_unpin(struct fb_blob *b);
/* Lock held: counters the server keeps. */
void fb_blobs_note_sent(uint64_t bytes, int whole, int redirect);
void fb_blobs_note_map(void);
/* Visits every blob (lock held); for dropping a gone conn's holders. */
void fb_blobs_each(void (*fn)(struct fb_blob *b, void *arg), void *arg);

/* Master, lock held: a child was told to read b in the arena (OBJ_AT),
 * or has dropped it, or is gone; the last unhold of a released blob
 * frees its region. */
void fb_blob_hold(struct fb_blob *b);
void fb_blob_unhold(struct fb_blob *b);

/* Pins the blob of ref for a pool call (master; lock NOT held).  Returns
 * 0 or FIBER_ENOKEY. */
int fb_objects_pin_ref(const fiber_ref *ref);
void fb_objects_unpin_ref(const fiber_ref *ref);
/* The calling thread's shared argument for pool calls (fiber_pool_shared),
 * or NULL. */
const fiber_ref *fb_objects_call_shared(void);

/* The master's blob server address, starting it if needed ("" if it
 * cannot start).  For children's boot environment. */
const char *fb_objects_master_address(void);
/* In a child: the master's blob server address, from the boot
 * environment (child.c). */
void fb_objects_set_master(const char *addr);
/* Stops the master's server (fiber_shutdown). */
void fb_objects_shutdown(void);

/* The worker loop: the shared argument of the chunks that follow (NULL:
 * none), and the end of each task (unpins what it resolved). */
void fb_objects_set_task_shared(const uint8_t *ref);
void fb_objects_task_end(void);

/* ---- the arena (arena.c) ---- */
#define FB_ARENA_SEG_BYTES (64u << 20) /* one file of the arena */
#define FB_ARENA_SEGS 8                /* files at most */
#define FB_ARENA_MAX_BLOB (16u << 20)  /* larger blobs get their own file */
#define FB_ARENA_HEAD 64               /* a region's header, then the blob */

/* A region's header, in the shared file: children read it. */
struct fb_arena_head {
    uint32_t magic;
    uint32_t state; /* live; released (the master's release) */
    uint64_t len;
    uint8_t ref[FB_WIRE_REF_LEN];
    uint8_t pad[FB_ARENA_HEAD - 16 - FB_WIRE_REF_LEN];
};

/* Master, lock held: copies data (len bytes, named ref) into a free
 * region.  Returns 0 with the region's segment and offset and *out (the
 * bytes, read-only), or -1 (too large, no room, no arena: the caller
 * gives the blob a file of its own). */
int fb_arena_put(const uint8_t *ref, const void *data, size_t len, int *seg,
                 uint64_t *off, const uint8_t **out);
/* Master, lock held: children see the region's blob as released. */
void fb_arena_mark_released(int seg, uint64_t off);
/* Master, lock held: the region of a len-byte blob is free for reuse. */
void fb_arena_free(int seg, uint64_t off, size_t len);
/* Master: the file of segment seg ("" if none); free bytes in all
 * segments; segments made.  For OBJ_AT and for tests. */
const char *fb_arena_path(int seg);
size_t fb_arena_free_bytes(void);
int fb_arena_segments(void);
/* Master: unlinks the arena's files (fiber_shutdown). */
void fb_arena_shutdown(void);
/* Child: the len-byte blob ref at off in the master's arena file path
 * (mapped once per process, whole).  Returns 0 with *out; FIBER_ENOKEY
 * when the master released it already; FIBER_EPROTO when the region does
 * not hold that blob. */
int fb_arena_view(const char *path, uint64_t off, const uint8_t *ref,
                  size_t len, const uint8_t **out);
/* Child: maps the master's file path read-only (MAP_POPULATE if
 * populate), what naming it in errors.  *size: the length it must have,
 * or 0 for any length of at least a page; set to the length mapped.
 * Returns 0 with *out; FIBER_ENOKEY when it cannot be opened (gone);
 * FIBER_EPROTO otherwise. */
int fb_map_master_file(const char *path, const char *what, int populate,
                       const uint8_t **out, size_t *size);
/* Child: nonzero once the master has released the blob at data (a
 * pointer fb_arena_view gave). */
int fb_arena_released(const uint8_t *data);

/* ---- the server (objserve.c) ---- */
struct fb_oserve;
/* Starts a server thread on addr.  directory: the master's (holders,
 * redirects), else a child's relay, which serves only what it holds.
 * Returns 0 with *out, or a code. */
int fb_oserve_start(struct fb_oserve **out, const char *addr, int directory);
const char *fb_oserve_address(const struct fb_oserve *s);
void fb_oserve_stop(struct fb_oserve *s);

/* The server's frame handler, for the fuzz target: handles one frame
 * from an authenticated conn of s as the thread does.  Returns 0, or -1
 * when the conn must be dropped. */
int fb_oserve_frame(struct fb_oserve *s, struct fb_sconn *c,
                    const struct fb_wire_hdr *h, const uint8_t *p);

/* Lock held.  Releases the holds of gone connections whose process has
 * exited (all of them with all != 0: the master's shutdown). */
void fb_oserve_reap(int all);

/* For the fuzz target: a directory or relay server with no socket and no
 * thread; a conn over fd (already authenticated); one turn of the loop
 * for c (pump, then the conns others kicked; -1 when c was dropped); a
 * drop; and the directory's invariants (0, or -1 with why). */
struct fb_oserve *fb_oserve_detached(int directory);
struct fb_sconn *fb_oserve_adopt(struct fb_oserve *s, int fd);
int fb_oserve_step(struct fb_oserve *s, struct fb_sconn *c);
void fb_oserve_drop(struct fb_oserve *s, struct fb_sconn *c);
int fb_oserve_check(struct fb_oserve *s, char *why, size_t size);

#endif /* FB_OBJECT_INT_H */
