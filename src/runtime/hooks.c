/*
 * hooks.c -- the table of the hooks the concepts above the runtime plug
 * into it (hooks.h), and the no-ops it holds until fiber_init registers
 * theirs.
 */
#include <stddef.h>

#include "runtime/hooks.h"

static void no_shutdown(void) {}
static const char *no_objects_address(void) { return ""; }
static void no_objects_master(const char *addr) { (void)addr; }
static void no_task_shared(const uint8_t *ref) { (void)ref; }
static void no_task(void) {}
static void no_drain(uint64_t deadline_ms) { (void)deadline_ms; }

static const struct fb_api_hooks none = {
    .shutdown = no_shutdown,
    .objects_address = no_objects_address,
    .objects_master = no_objects_master,
    .task_shared = no_task_shared,
    .task_end = no_task,
    .drain = no_drain,
};

static const struct fb_api_hooks *hooks = &none;

void fb_rt_set_api_hooks(const struct fb_api_hooks *h)
{
    hooks = h ? h : &none;
}

const struct fb_api_hooks *fb_rt_api(void) { return hooks; }
