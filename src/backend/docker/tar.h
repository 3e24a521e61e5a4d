/*
 * tar.h -- the image's file system as a tar archive in memory: ustar
 * headers, with a pax header when a name or a link target does not fit,
 * each entry named by its host path (without the leading '/'), owned by
 * root, written once.
 */
#ifndef FB_DOCKER_TAR_H
#define FB_DOCKER_TAR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "backend/docker/pathset.h"
#include "fiber/fiber.h"

struct fb_tar {
    fiber_buf buf;
    struct fb_pathset added; /* archive paths written, to write each once */
    size_t files;           /* regular files written */
    uint64_t file_bytes;    /* their content */
};

/* Adds one directory, symbolic link (to link_target) or regular file (its
 * content read now), as st describes it, named by its absolute host path;
 * once.  Returns 0, FIBER_ESYS or FIBER_ENOMEM. */
int fb_tar_add_entry(struct fb_tar *t, const char *host_path,
                     const struct stat *st, const char *link_target);

/* Adds the absolute host path: each directory on the way, each symbolic
 * link met (then what it points to, recursively; depth counts them) and
 * the regular file at the end, so that the path resolves in the image as
 * on the host.  Returns 0 or a code naming the path. */
int fb_tar_add_path(struct fb_tar *t, const char *path, int depth);

/* Ends the archive (two zero blocks). */
int fb_tar_finish(struct fb_tar *t);

void fb_tar_free(struct fb_tar *t);

#endif /* FB_DOCKER_TAR_H */
