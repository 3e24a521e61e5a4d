/*
 * pathset.h -- a set of paths in insertion order, with an open-addressing
 * index: what the image builder collects (libraries, archive entries; a
 * Python environment puts tens of thousands of files in an image).
 */
#ifndef FB_DOCKER_PATHSET_H
#define FB_DOCKER_PATHSET_H

#include <stddef.h>

struct fb_pathset {
    char **items;
    size_t n, cap;
    size_t *slots; /* index + 1 into items, 0 = empty; nslots a power of 2 */
    size_t nslots;
};

/* Adds path[0..len) unless present.  Returns 0 or FIBER_ENOMEM. */
int fb_pathset_add(struct fb_pathset *l, const char *path, size_t len);

/* Returns 1 if path is in l. */
int fb_pathset_has(const struct fb_pathset *l, const char *path);

/* Frees l's contents; l is zeroed.  A zeroed l is fine. */
void fb_pathset_free(struct fb_pathset *l);

#endif /* FB_DOCKER_PATHSET_H */
