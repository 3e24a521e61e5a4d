/*
 * elf.h -- what the image builder needs to know of a program: where it is
 * (found as execvp would find it) and, from its ELF headers, which
 * dynamic loader it names (PT_INTERP) and its build id (the GNU build-id
 * note, or a BLAKE2b of the file as runtime/buildid.c computes it).
 */
#ifndef FB_DOCKER_ELF_H
#define FB_DOCKER_ELF_H

#include <limits.h>

struct fb_program {
    char path[PATH_MAX];   /* absolute, as given (symlinks not resolved) */
    char interp[PATH_MAX]; /* PT_INTERP, or "" for a static program */
    char id[65];           /* GNU build id in hex, or a BLAKE2b of the file */
    int has_build_id;
};

/* Finds program (a name without '/' is searched in PATH), makes its path
 * absolute without resolving symbolic links, and reads its ELF headers
 * into *pi.  Returns 0, or FIBER_EINVAL (not found, not an executable, not
 * ELF, corrupt headers) / FIBER_ESYS with a message naming the file. */
int fb_program_inspect(const char *program, struct fb_program *pi);

#endif /* FB_DOCKER_ELF_H */
