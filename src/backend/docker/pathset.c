/*
 * pathset.c -- the path set of pathset.h.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/docker/pathset.h"
#include "base/common.h"

static size_t path_hash(const char *p, size_t len)
{
    size_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

/* The slot where path is, or the empty one where it would go. */
static size_t *path_slot(const struct fb_pathset *l, const char *path,
                         size_t len)
{
    size_t mask = l->nslots - 1;
    for (size_t i = path_hash(path, len) & mask;; i = (i + 1) & mask) {
        size_t *s = &l->slots[i];
        if (*s == 0)
            return s;
        const char *item = l->items[*s - 1];
        if (strlen(item) == len && memcmp(item, path, len) == 0)
            return s;
    }
}

static int pathset_grow(struct fb_pathset *l)
{
    size_t cap = l->cap ? 2 * l->cap : 32;
    char **items = realloc(l->items, cap * sizeof *items);
    size_t *slots = calloc(2 * cap, sizeof *slots);
    if (!items || !slots) {
        if (items)
            l->items = items;
        free(slots);
        return fb_err(FIBER_ENOMEM, "out of memory");
    }
    free(l->slots);
    l->items = items;
    l->cap = cap;
    l->slots = slots;
    l->nslots = 2 * cap;
    for (size_t i = 0; i < l->n; i++)
        *path_slot(l, l->items[i], strlen(l->items[i])) = i + 1;
    return 0;
}

int fb_pathset_add(struct fb_pathset *l, const char *path, size_t len)
{
    if (l->nslots && *path_slot(l, path, len))
        return 0;
    if (l->n == l->cap) {
        int rc = pathset_grow(l);
        if (rc)
            return rc;
    }
    if (!(l->items[l->n] = strndup(path, len)))
        return fb_err(FIBER_ENOMEM, "out of memory");
    l->n++;
    *path_slot(l, path, len) = l->n;
    return 0;
}

int fb_pathset_has(const struct fb_pathset *l, const char *path)
{
    return l->nslots && *path_slot(l, path, strlen(path)) != 0;
}

void fb_pathset_free(struct fb_pathset *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->items[i]);
    free(l->items);
    free(l->slots);
    memset(l, 0, sizeof *l);
}
