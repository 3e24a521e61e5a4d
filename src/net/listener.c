/*
 * listener.c -- a server's listening socket, epoll set, stop eventfd and
 * thread.  See listener.h.
 */
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/common.h"
#include "base/thread.h"
#include "net/gate.h"
#include "net/listener.h"
#include "net/net.h"
#include "net/secure.h"

void fb_listener_init(struct fb_listener *l)
{
    memset(l, 0, sizeof *l);
    l->listen_fd = l->epfd = l->stop_fd = -1;
}

int fb_listener_open(struct fb_listener *l, const char *addr,
                     void *listen_tag, void *stop_tag, const char *what)
{
    int rc = fb_sock_listen(addr, SOMAXCONN, &l->listen_fd, l->address,
                            sizeof l->address);
    if (rc == 0 && ((l->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
                    (l->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0))
        rc = fb_err_errno(FIBER_ESYS, "%s setup", what);
    if (rc == 0) {
        struct epoll_event a = {.events = EPOLLIN, .data.ptr = listen_tag};
        struct epoll_event b = {.events = EPOLLIN, .data.ptr = stop_tag};
        epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->listen_fd, &a);
        epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->stop_fd, &b);
    }
    return rc;
}

int fb_listener_start(struct fb_listener *l, void *(*fn)(void *), void *arg,
                      const char *what)
{
    int rc = fb_thread_start(&l->thread, fn, arg, what);
    l->has_thread = rc == 0;
    return rc;
}

int fb_listener_adopt(struct fb_listener *l, struct fb_conn *c, int fd,
                      void *tag, const uint8_t *token)
{
    fb_conn_init(c, fd, FB_GATE_HELLO_MAX);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = tag};
    if (fb_conn_secure_for(c, l->address, FB_SEC_SERVER, token) != 0 ||
        epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        fb_conn_close(c);
        return -1;
    }
    return 0;
}

int fb_listener_flush(struct fb_listener *l, struct fb_conn *c, void *tag,
                      int *want_out)
{
    int rc = fb_conn_flush(c);
    if (rc >= 0 && (rc == 1) != *want_out) {
        *want_out = rc == 1;
        struct epoll_event ev = {
            .events = EPOLLIN | (*want_out ? EPOLLOUT : 0), .data.ptr = tag};
        epoll_ctl(l->epfd, EPOLL_CTL_MOD, fb_conn_fd(c), &ev);
    }
    return rc;
}

void fb_listener_drop(struct fb_listener *l, struct fb_conn *c)
{
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, fb_conn_fd(c), NULL);
    fb_conn_close(c);
}

void fb_listener_join(struct fb_listener *l)
{
    if (!l->has_thread)
        return;
    uint64_t one = 1;
    if (write(l->stop_fd, &one, sizeof one) < 0) {
        /* saturated: it is stopping already */
    }
    pthread_join(l->thread, NULL);
    l->has_thread = 0;
}

int fb_listener_serve(struct fb_listener *l, struct fb_gate *g,
                      const char *addr, const char *who, void *listen_tag,
                      void *stop_tag,
                      void (*gate_close)(struct fb_gate_peer *p, void *arg),
                      void *(*fn)(void *), void *arg, const char *thread)
{
    fb_listener_init(l);
    fb_gate_init(g, who, 0, 0, gate_close, arg);
    int rc = fb_listener_open(l, addr, listen_tag, stop_tag, who);
    if (rc == 0 && fn)
        rc = fb_listener_start(l, fn, arg, thread);
    return rc;
}

void fb_listener_halt(struct fb_listener *l, struct fb_gate *g)
{
    fb_listener_join(l);
    fb_gate_clear(g);
}

void fb_listener_close(struct fb_listener *l)
{
    if (l->listen_fd >= 0)
        close(l->listen_fd);
    if (l->epfd >= 0)
        close(l->epfd);
    if (l->stop_fd >= 0)
        close(l->stop_fd);
    l->listen_fd = l->epfd = l->stop_fd = -1;
    if (strncmp(l->address, "unix:", 5) == 0)
        unlink(l->address + 5);
    l->address[0] = '\0';
}
