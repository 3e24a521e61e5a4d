/*
 * addr.h -- the address jobs dial the master on (see addr.c).
 */
#ifndef FB_ADDR_H
#define FB_ADDR_H

#include "runtime/config.h"

/* Replaces c->listen_host "auto" with a concrete IPv4 address: that of
 * listen_interface if set, else 127.0.0.1 if loopback_ok (the backend's
 * jobs share this host's network), else that of the default route's
 * interface.  Any other listen_host is left alone.  Returns 0 or
 * FIBER_ECONFIG with a message saying what to set. */
int fb_listen_host_resolve(struct fb_config *c, int loopback_ok);

#endif /* FB_ADDR_H */
