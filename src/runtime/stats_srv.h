/*
 * stats_srv.h -- the master's side of `fiber top`: monitors, clients that
 * watch a run (wire.h: HELLO with job id 0, then STATS -> SNAPSHOT).
 *
 * A monitor dials the master's own socket and passes the same gate as a
 * job: the service thread (service.c) holds it until its HELLO carries
 * the run's token; only then does it hand the connection here
 * (fb_stats_adopt).  A peer without the token never reaches this file.
 *
 * What a monitor needs to find the master, the master publishes in its
 * run directory (mode 0700), each file mode 0600, this user's only:
 *   master.addr   the address monitors dial (a line), then "encrypted"
 *                 or "plain" (a line): whether its connections are
 *                 (net/secure.c; a watcher has no configuration of its
 *                 own to tell)
 *   master.token  the run's token, 64 lowercase hex digits (a line)
 * They are written when the listener starts and removed when it stops.
 *
 * Threading: everything here runs on the service thread, with the
 * runtime lock held, except the pools' counters, which are read with it
 * released (pool code takes its pool's lock before the runtime's, so the
 * service thread must never wait for a pool's lock while holding it).
 */
#ifndef FB_STATS_SRV_H
#define FB_STATS_SRV_H

#include <stddef.h>

#include "fiber/fiber.h"
#include "net/gate.h"
#include "net/net.h"

/* The job id a monitor's HELLO carries: no job has it. */
#define FB_MONITOR_JOB_ID FB_GATE_WATCHER_JOB
/* The epoll tag of a monitor's events (the low 3 bits of the event data,
 * beside service.c's EV_*). */
#define FB_EV_MONITOR 6u
#define FB_MONITOR_ADDR_FILE "master.addr"
#define FB_MONITOR_TOKEN_FILE "master.token"

/* One pool as a monitor sees it. */
struct fb_monitor_pool {
    char name[64];
    fiber_pool_stats st;
};

/* Fills up to max rows with the live pools, returns how many.  Called
 * without the runtime lock. */
typedef size_t (*fb_monitor_pools_fn)(struct fb_monitor_pool *rows,
                                      size_t max);

/* Sets the function that lists the live pools (pool/pool.c sets it when
 * its first pool is made).  Safe from any thread. */
void fb_stats_set_pools(fb_monitor_pools_fn fn);

/* Writes master.addr and master.token into the run directory.  Lock
 * held.  A failure is logged, not returned: the run works without. */
void fb_stats_publish(void);

/* Takes over an authenticated monitor's connection (the service thread's
 * pending connection, already registered in its epoll): sends WELCOME and
 * answers its STATS from now on.  *conn is moved (the caller forgets
 * it).  Lock held. */
void fb_stats_adopt(struct fb_conn *conn);

/* The service thread's epoll said something about monitor m (the event
 * data without its tag).  Lock held; may release and retake it. */
void fb_stats_on_event(void *m, unsigned events);

/* Closes every monitor and removes the published files.  Lock held. */
void fb_stats_stop(void);

#endif /* FB_STATS_SRV_H */
