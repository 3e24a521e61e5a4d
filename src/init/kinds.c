/*
 * kinds.c -- the kinds of object an object server can host.  A new kind
 * is a struct fb_obj_kind in its own file, listed here.
 */
#include <stddef.h>

#include "manager/mobj_ops.h" /* what a manager hosts */
#include "objsrv/objsrv.h"

extern const struct fb_obj_kind fb_kind_queue;
extern const struct fb_obj_kind fb_kind_rendezvous; /* ring_rdv.c */
extern const struct fb_obj_kind fb_kind_pipe_rdv;   /* pipe_rdv.c */

const struct fb_obj_kind *const fb_obj_kinds[] = {
    &fb_kind_queue,
    &fb_kind_rendezvous,
    &fb_kind_pipe_rdv,
    &fb_kind_dict,
    &fb_kind_list,
    &fb_kind_value,
    &fb_kind_lock,
    &fb_kind_rlock,
    &fb_kind_event,
    &fb_kind_semaphore,
    &fb_kind_barrier,
    &fb_kind_condition,
    &fb_kind_custom,
    NULL,
};
