/*
 * child.h -- what the child role (child.c) shares with the pool worker
 * loop (worker.c).
 */
#ifndef FB_CHILD_H
#define FB_CHILD_H

#include <pthread.h>

#include "net/net.h"
#include "runtime/config.h"

struct fb_child {
    struct fb_conn conn;
    /* Guards conn.out and every write to the socket: the watchdog thread
     * sends heartbeats while the main thread sends results. */
    pthread_mutex_t write_mu;
    uint32_t heartbeat_ms; /* from WELCOME; 0 = none */
    const struct fb_config *cfg;
};

/* Sends a NOTE (text) to the master from a running target.  Returns 0
 * or a code.  Only in a child running a process target. */
int fb_child_note(int32_t kind, const char *text);

/* The child's connection to the master (its fd, for a server that should
 * stop when the master goes), or -1. */
int fb_child_master_fd(void);

/* Logs at error level and exits with code at once. */
void fb_child_die(int code, const char *fmt, ...) FIBER_PRINTF(2, 3)
    __attribute__((noreturn));

/* Serves as a pool worker: h/payload is the POOL message.  Never
 * returns. */
void fb_worker_main(struct fb_child *ch, const struct fb_wire_hdr *h,
                    const uint8_t *payload) __attribute__((noreturn));

/* The worker loop's parts, without its exits, its fault handlers or its
 * waiting (also the fuzz targets' entry point, tests/fuzz/fuzz_worker.c).
 * fb_wloop_start takes POOL: runs the initializer and sends READY;
 * returns 0 with *out, or FIBER_ETASK after sending EXIT.  fb_wloop_frame
 * acts on one decoded frame: 0 to go on, 1 after STOP (all results
 * sent), FIBER_EPROTO for a frame a worker does not take.  fb_wloop_idle
 * sends the staged results, as the loop does before it waits. */
struct fb_wloop;
int fb_wloop_start(struct fb_child *ch, const struct fb_wire_hdr *h,
                   const uint8_t *payload, struct fb_wloop **out);
int fb_wloop_frame(struct fb_wloop *l, const struct fb_wire_hdr *h,
                   const uint8_t *payload);
void fb_wloop_idle(struct fb_wloop *l);
void fb_wloop_free(struct fb_wloop *l);

#endif /* FB_CHILD_H */
