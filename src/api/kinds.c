/*
 * kinds.c -- the kinds of object an object server can host.  A new kind
 * is a struct fb_obj_kind in its own file, listed here.
 */
#include <stddef.h>

#include "api/objsrv.h"

extern const struct fb_obj_kind fb_kind_queue;

const struct fb_obj_kind *const fb_obj_kinds[] = {
    &fb_kind_queue,
    NULL,
};
