/*
 * listener.h -- the part of a server around its connections that the
 * object server (objsrv/objsrv.c) and the blob server (store/objserve.c)
 * share: the listening socket, one epoll set holding it and a stop
 * eventfd, and the thread that serves them.
 *
 * Lifecycle: fb_listener_serve (init, the server's gate, open, and for a
 * server with a thread of its own start); to stop, fb_listener_halt
 * (fb_listener_join wakes the thread through the stop eventfd and waits
 * for it; the gate is emptied), then the server closes its connections,
 * then fb_listener_close.  The server's thread returns once it sees the
 * stop tag among its events.
 */
#ifndef FB_NET_LISTENER_H
#define FB_NET_LISTENER_H

#include <pthread.h>
#include <stdint.h>

#include "net/gate.h"
#include "net/net.h"
#include "wire/wire.h"

struct fb_listener {
    int listen_fd, epfd, stop_fd; /* -1 when not open */
    char address[FB_WIRE_ADDR_MAX + 1]; /* as bound (the real port) */
    pthread_t thread;
    int has_thread;
};

/* Nothing open yet. */
void fb_listener_init(struct fb_listener *l);

/* Listens on addr ("unix:PATH" or "tcp:HOST:0") and makes the epoll set,
 * with the listener in it (its events carry listen_tag) and the stop
 * eventfd (stop_tag).  Returns 0, or a code with fiber_last_error()
 * ("WHAT setup: ..." when the epoll set or the eventfd fails); what is
 * open stays open for fb_listener_close. */
int fb_listener_open(struct fb_listener *l, const char *addr,
                     void *listen_tag, void *stop_tag, const char *what);

/* Starts the thread serving it (fb_thread_start: every signal blocked). */
int fb_listener_start(struct fb_listener *l, void *(*fn)(void *), void *arg,
                      const char *what);

/* Takes fd, a connection just accepted, as c: a conn over fd whose
 * frames may be at most FB_GATE_HELLO_MAX bytes until the server admits
 * it, encrypted when the address asks (fb_conn_secure_for as the server,
 * keyed with token), and watched for input (its events carry tag).
 * Returns 0, or -1 after closing it. */
int fb_listener_adopt(struct fb_listener *l, struct fb_conn *c, int fd,
                      void *tag, const uint8_t *token);

/* Writes what c has queued without blocking, and watches c for output
 * exactly while some is left (*want_out says whether it is watched).
 * Returns what fb_conn_flush does: 0 all sent, 1 some left, < 0 failed. */
int fb_listener_flush(struct fb_listener *l, struct fb_conn *c, void *tag,
                      int *want_out);

/* Stops watching c and closes it. */
void fb_listener_drop(struct fb_listener *l, struct fb_conn *c);

/* Tells the thread to stop (the stop eventfd) and waits for it; nothing
 * when none runs. */
void fb_listener_join(struct fb_listener *l);

/* Closes what is open and removes a unix socket's file. */
void fb_listener_close(struct fb_listener *l);

/* The start every server shares: l and its gate g set up (who names the
 * server in the gate's logs and the setup's errors; gate_close(peer, arg)
 * closes a peer the gate drops), l listening on addr (listen_tag,
 * stop_tag: fb_listener_open), and, when fn is not NULL, the thread
 * fn(arg) serving it (thread names it in errors).  Returns 0 or the code;
 * on failure what is open stays open: the server stops as usual
 * (fb_listener_halt, then fb_listener_close). */
int fb_listener_serve(struct fb_listener *l, struct fb_gate *g,
                      const char *addr, const char *who, void *listen_tag,
                      void *stop_tag,
                      void (*gate_close)(struct fb_gate_peer *p, void *arg),
                      void *(*fn)(void *), void *arg, const char *thread);

/* The first half of every server's stop: its thread stopped
 * (fb_listener_join) and the peers still in its gate closed. */
void fb_listener_halt(struct fb_listener *l, struct fb_gate *g);

#endif /* FB_NET_LISTENER_H */
