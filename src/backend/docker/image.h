/*
 * image.h -- the image builder behind fiber_image_build*(),
 * fiber_image_inspect() and fiber_image_remove() (image.c), for callers
 * inside the library.  Its parts: the program's ELF facts (elf.h), the
 * libraries its loader lists (ldso.h), the tar writer (tar.h), and the
 * Docker Engine client (engine.h), which this header also brings in for
 * the callers that included it for that (the run tools).
 */
#ifndef FB_DOCKER_IMAGE_H
#define FB_DOCKER_IMAGE_H

#include "backend/docker/engine.h"
#include "fiber/fiber.h"

/* fiber_image_build_with, talking to the daemon at socket (NULL: the
 * docker_socket configuration key, read through fiber_config_get, which
 * takes the runtime lock).  With socket given it needs no lock and reads
 * no configuration: the docker backend's init calls it with the lock
 * held (docker_build_image).  Returns as fiber_image_build_with. */
int fb_image_build(const char *socket, const char *program,
                   const fiber_image_build_opts *opts, fiber_buf *id_out);

#endif /* FB_DOCKER_IMAGE_H */
