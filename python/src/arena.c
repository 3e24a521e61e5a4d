/* Freed pymalloc arenas kept for reuse (pymalloc_keep_mb).
 *
 * CPython's small-object allocator takes memory from the system in arenas
 * (1 MiB on 3.11) and gives an arena back (munmap) as soon as every object
 * in it is freed, keeping at most one empty arena.  A map's results are
 * made together and die together: a 100,000-item map of ints fills three
 * or four fresh arenas in the master, all returned when the result list
 * goes, so the next map maps them again and takes a page fault on each of
 * their 4 KiB pages (about 670 faults a map, measured with
 * `perf record -e page-faults`: 84 % of the master's faults were in
 * _PyObject_Malloc on new arenas).  multiprocessing's master escapes this
 * by accident: its results land in arenas shared with long-lived objects.
 *
 * This keeps freed arenas, up to the configuration's pymalloc_keep_mb
 * (8 MiB by default; the extension's import installs it with
 * PyObject_SetArenaAllocator, wrapping the allocator it finds) and hands
 * them out again before asking the system: a steady program faults its
 * arenas in once.  No more than that stays resident; the rest goes back
 * as before.  The bound is read at import and at fiber_init (before the
 * call, for a job, whose fiber_init never returns: its FIBER_* variables
 * are read then; after it, for a master) and after each config_set; 0
 * turns the cache off and frees what it held.  Arenas are allocated and
 * freed under the GIL, so the cache needs no lock. */
#include "binding.h"

#include <string.h>

#define KEEP_MB_DEFAULT 8
#define KEEP_MAX 256 /* arenas: 64 MiB of 256 KiB arenas (1 MiB on 64-bit) */

static PyObjectArenaAllocator system_arenas; /* the allocator we wrap */
static void *kept[KEEP_MAX];
static size_t kept_size;          /* an arena's size; 0: none seen yet */
static int nkept;
static size_t keep_bytes = (size_t)KEEP_MB_DEFAULT << 20;

/* CPython also takes its frames' stack chunks (16 KiB and up, 3.11) from
 * this allocator; only arenas, the first size of 256 KiB or more it asks
 * for (1 MiB on 64-bit builds of 3.11), are kept. */
#define ARENA_MIN (256u << 10)

static int may_keep(size_t size)
{
    if (kept_size == 0 && size >= ARENA_MIN)
        kept_size = size;
    return size == kept_size && nkept < KEEP_MAX &&
           (size_t)(nkept + 1) * size <= keep_bytes;
}

static void *arena_alloc(void *ctx, size_t size)
{
    (void)ctx;
    if (nkept > 0 && size == kept_size)
        return kept[--nkept];
    return system_arenas.alloc(system_arenas.ctx, size);
}

static void arena_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    if (ptr && may_keep(size)) {
        kept[nkept++] = ptr;
        return;
    }
    system_arenas.free(system_arenas.ctx, ptr, size);
}

void fbp_arena_init(void)
{
    static int installed;
    if (!installed) {
        PyObject_GetArenaAllocator(&system_arenas);
        PyObjectArenaAllocator mine = {NULL, arena_alloc, arena_free};
        PyObject_SetArenaAllocator(&mine);
        installed = 1;
    }
    fbp_arena_config_changed("pymalloc_keep_mb");
}

void fbp_arena_config_changed(const char *key)
{
    if (strcmp(key, "pymalloc_keep_mb") != 0)
        return;
    long long mb = fbp_config_int(key, -1);
    if (mb < 0 || mb > 64)
        return; /* unreadable (a bad .fiberconfig): the bound stays */
    keep_bytes = (size_t)mb << 20;
    while (nkept > 0 && (size_t)nkept * kept_size > keep_bytes) {
        nkept--;
        system_arenas.free(system_arenas.ctx, kept[nkept], kept_size);
    }
}

/* _fiber.arenas_kept() -> (arenas kept now, bytes each, bytes at most) */
PyObject *fbp_arenas_kept(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return Py_BuildValue("inn", nkept, (Py_ssize_t)kept_size,
                         (Py_ssize_t)keep_bytes);
}
