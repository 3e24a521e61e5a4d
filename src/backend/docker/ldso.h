/*
 * ldso.h -- which shared libraries a program needs, and where they are,
 * asked of the program's own dynamic loader (`<interp> --list`, what ldd
 * does); see ldso.c for why the loader and not a resolver of our own.
 */
#ifndef FB_DOCKER_LDSO_H
#define FB_DOCKER_LDSO_H

#include "backend/docker/elf.h"
#include "backend/docker/pathset.h"

/* Adds to libs the path of every library pi->path (a program or a shared
 * object; pi->interp is the loader asked) needs.  A library the loader
 * cannot find is FIBER_EINVAL with a message saying how to make it
 * findable; lenient: it is left out, and a loader that fails adds
 * nothing.  Returns 0 or a code. */
int fb_ldso_list(const struct fb_program *pi, struct fb_pathset *libs,
                 int lenient);

/* The libraries of a program's image: what the loader lists, libcurl and
 * what it needs (fiber dlopen()s it: a master in a container talks to its
 * engine), and the loader itself.  Nothing for a static program. */
int fb_ldso_libraries(const struct fb_program *pi, struct fb_pathset *libs);

#endif /* FB_DOCKER_LDSO_H */
