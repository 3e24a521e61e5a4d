/*
 * init.c -- fiber_init: registers what the runtime calls of the blob
 * store and the object servers (runtime/hooks.h), then the runtime starts
 * (fb_rt_init, runtime.c).  It sits above every concept (init/ is the
 * layer that plugs them in: docs/architecture.md, "Layers").
 */
#include "base/common.h"
#include "objsrv/objsrv.h"
#include "pipe/pipe_ops.h"
#include "runtime/hooks.h"
#include "runtime/runtime.h"
#include "store/object_int.h"

/* fiber_shutdown: the master's object server, then its blob server. */
static void api_shutdown(void)
{
    fb_master_objsrv_stop();
    fb_objects_shutdown();
}

/* A child whose target returned: pipe ends' unwritten output, then the
 * pipelined puts of every connection (the pipes' relayed sends too). */
static void api_drain(uint64_t deadline_ms)
{
    fb_pipes_drain(deadline_ms);
    fb_oclients_drain(deadline_ms);
}

static const struct fb_api_hooks api_hooks = {
    .shutdown = api_shutdown,
    .objects_address = fb_objects_master_address,
    .objects_master = fb_objects_set_master,
    .task_shared = fb_objects_set_task_shared,
    .task_end = fb_objects_task_end,
    .drain = api_drain,
};

FIBER_API int fiber_init(int *argc, char ***argv)
{
    fb_rt_set_api_hooks(&api_hooks);
    return fb_rt_init(argc, argv);
}
