/*
 * hooks.h -- what the concepts above the runtime plug into it.
 *
 * runtime/ (the runtime, the child and the pool worker's loop) sits below
 * the concepts (store/, objsrv/, ...) and includes nothing from them
 * (docs/architecture.md, "Layers").  Where the runtime needs one of their
 * services (the shared-object store and its blob server, the master's
 * object server, the object clients' pipelined puts), it calls through
 * this table, which is registered before the runtime starts: fiber_init
 * (init/init.c) calls fb_rt_set_api_hooks, then fb_rt_init.  Until then (and in programs that never call fiber_init)
 * every member is a no-op.
 */
#ifndef FB_HOOKS_H
#define FB_HOOKS_H

#include <stdint.h>

struct fb_api_hooks {
    /* The master, in fiber_shutdown, before the service thread stops:
     * stops the API layer's servers (the object server, the blob
     * server). */
    void (*shutdown)(void);
    /* The master, for each child's boot environment (FIBER_BOOT_OBJECTS):
     * the blob server's address, starting it if needed ("" if it cannot
     * start). */
    const char *(*objects_address)(void);
    /* A child at boot: the master's blob server address (NULL: none). */
    void (*objects_master)(const char *addr);
    /* The worker loop: the shared argument of the chunks that follow
     * (NULL: none), and the end of a task that asked for it with
     * fb_task_owe_end (runtime/task.h): it unpins what the task
     * resolved. */
    void (*task_shared)(const uint8_t *ref);
    void (*task_end)(void);
    /* A child whose process target returned: waits until deadline_ms for
     * the pipelined puts of handles it never freed. */
    void (*drain)(uint64_t deadline_ms);
};

/* Registers h, every member set (kept, not copied: static storage). */
void fb_rt_set_api_hooks(const struct fb_api_hooks *h);
/* The registered table; never NULL, no member NULL. */
const struct fb_api_hooks *fb_rt_api(void);

#endif /* FB_HOOKS_H */
