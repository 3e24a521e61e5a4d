/*
 * settings.c -- what net/ takes from the run's configuration, as the
 * runtime hands it down (net.h, fb_net_configure).
 *
 * The one piece of mutable state in net/: written by the runtime with its
 * lock held (fiber_init, a child's boot, fiber_config_set), read without
 * a lock by the gate and the dial and accept sites, as the runtime's own
 * configuration was read before it was handed down.
 */
#include "net/net.h"

static struct fb_net_config settings;

void fb_net_configure(const struct fb_net_config *c) { settings = *c; }

const struct fb_net_config *fb_net_config(void) { return &settings; }
