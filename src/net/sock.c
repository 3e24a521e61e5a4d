/*
 * sock.c -- listening, dialing and accepting on unix and TCP sockets.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "base/common.h"
#include "net/net.h"

struct addr {
    int is_unix;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char host[256];
    char port[16];
};

static int parse_addr(const char *s, struct addr *a)
{
    memset(a, 0, sizeof *a);
    if (strncmp(s, "unix:", 5) == 0) {
        const char *p = s + 5;
        if (!*p || strlen(p) >= sizeof a->path)
            return fb_err(FIBER_EINVAL,
                          "unix socket path '%s' is empty or longer than %zu "
                          "bytes",
                          p, sizeof a->path - 1);
        a->is_unix = 1;
        fb_strlcpy(a->path, p, sizeof a->path);
        return 0;
    }
    if (strncmp(s, "tcp:", 4) != 0)
        return fb_err(FIBER_EINVAL,
                      "address '%s' is neither unix:PATH nor tcp:HOST:PORT", s);
    const char *hp = s + 4;
    const char *colon = strrchr(hp, ':');
    if (!colon || colon == hp || !colon[1] || strlen(colon + 1) >= sizeof a->port)
        return fb_err(FIBER_EINVAL, "address '%s' lacks HOST:PORT", s);
    size_t hlen = (size_t)(colon - hp);
    if (hp[0] == '[' && hlen >= 2 && hp[hlen - 1] == ']') {
        hp++;
        hlen -= 2;
    }
    if (hlen >= sizeof a->host)
        return fb_err(FIBER_EINVAL, "host in '%s' is too long", s);
    memcpy(a->host, hp, hlen);
    a->host[hlen] = '\0';
    fb_strlcpy(a->port, colon + 1, sizeof a->port);
    return 0;
}

static void tune_tcp(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}

static int listen_unix(const struct addr *a, int backlog, int *fd,
                       char *bound, size_t bound_size)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    fb_strlcpy(sun.sun_path, a->path, sizeof sun.sun_path);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return fb_err_errno(FIBER_ESYS, "socket(AF_UNIX)");
    unlink(a->path); /* a stale socket from a crashed run of ours */
    if (bind(s, (struct sockaddr *)&sun, sizeof sun) != 0 ||
        listen(s, backlog) != 0) {
        int rc = fb_err_errno(FIBER_ESYS, "cannot listen on unix:%s", a->path);
        close(s);
        return rc;
    }
    snprintf(bound, bound_size, "unix:%s", a->path);
    *fd = s;
    return 0;
}

static int bound_tcp_name(int s, char *bound, size_t bound_size)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char host[NI_MAXHOST], port[NI_MAXSERV];
    if (getsockname(s, (struct sockaddr *)&ss, &len) != 0)
        return fb_err_errno(FIBER_ESYS, "getsockname");
    if (getnameinfo((struct sockaddr *)&ss, len, host, sizeof host, port,
                    sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        return fb_err(FIBER_ESYS, "getnameinfo failed");
    if (ss.ss_family == AF_INET6)
        snprintf(bound, bound_size, "tcp:[%s]:%s", host, port);
    else
        snprintf(bound, bound_size, "tcp:%s:%s", host, port);
    return 0;
}

static int listen_tcp(const struct addr *a, int backlog, int *fd, char *bound,
                      size_t bound_size)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res;
    int gai = getaddrinfo(a->host, a->port, &hints, &res);
    if (gai != 0)
        return fb_err(FIBER_EINVAL, "cannot resolve listen address %s:%s: %s",
                      a->host, a->port, gai_strerror(gai));
    int rc = fb_err(FIBER_ESYS, "no usable address for %s", a->host);
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int s = socket(ai->ai_family,
                       ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (s < 0)
            continue;
        int one = 1;
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(s, ai->ai_addr, ai->ai_addrlen) == 0 &&
            listen(s, backlog) == 0) {
            rc = bound_tcp_name(s, bound, bound_size);
            if (rc == 0) {
                *fd = s;
                break;
            }
        } else {
            rc = fb_err_errno(FIBER_ESYS, "cannot listen on tcp:%s:%s",
                              a->host, a->port);
        }
        close(s);
    }
    freeaddrinfo(res);
    return rc;
}

int fb_sock_listen(const char *addr, int backlog, int *fd, char *bound,
                   size_t bound_size)
{
    struct addr a;
    int rc = parse_addr(addr, &a);
    if (rc)
        return rc;
    return a.is_unix ? listen_unix(&a, backlog, fd, bound, bound_size)
                     : listen_tcp(&a, backlog, fd, bound, bound_size);
}

/* Waits for a non-blocking connect to finish. */
static int finish_connect(int s, uint64_t deadline_ms)
{
    struct pollfd p = {.fd = s, .events = POLLOUT};
    for (;;) {
        int n = poll(&p, 1, fb_ms_left(deadline_ms));
        if (n > 0)
            break;
        if (n == 0)
            return ETIMEDOUT;
        if (errno != EINTR)
            return errno;
    }
    int soerr = 0;
    socklen_t len = sizeof soerr;
    if (getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0)
        return errno;
    return soerr;
}

/* One connect attempt; returns 0 or an errno value. */
static int try_connect(const struct sockaddr *sa, socklen_t salen, int family,
                       uint64_t deadline_ms, int *fd)
{
    int s = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return errno;
    int err = 0;
    if (connect(s, sa, salen) != 0) {
        err = errno;
        if (err == EINPROGRESS)
            err = finish_connect(s, deadline_ms);
    }
    if (err) {
        close(s);
        return err;
    }
    if (family != AF_UNIX)
        tune_tcp(s);
    *fd = s;
    return 0;
}

static int dial_unix(const struct addr *a, uint64_t deadline_ms, int *fd)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    fb_strlcpy(sun.sun_path, a->path, sizeof sun.sun_path);
    for (;;) {
        int err = try_connect((struct sockaddr *)&sun, sizeof sun, AF_UNIX,
                              deadline_ms, fd);
        if (err == 0)
            return 0;
        /* EAGAIN: the listener's backlog is full; it is busy, not gone. */
        if (err != EAGAIN || fb_ms_left(deadline_ms) == 0) {
            errno = err;
            return fb_err_errno(FIBER_EUNREACHABLE, "cannot connect to unix:%s",
                                a->path);
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

static int dial_tcp(const struct addr *a, uint64_t deadline_ms, int *fd)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res;
    int gai = getaddrinfo(a->host, a->port, &hints, &res);
    if (gai != 0)
        return fb_err(FIBER_EUNREACHABLE, "cannot resolve %s: %s", a->host,
                      gai_strerror(gai));
    int err = EHOSTUNREACH;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        err = try_connect(ai->ai_addr, ai->ai_addrlen, ai->ai_family,
                          deadline_ms, fd);
        if (err == 0)
            break;
    }
    freeaddrinfo(res);
    if (err) {
        errno = err;
        return fb_err_errno(FIBER_EUNREACHABLE, "cannot connect to tcp:%s:%s",
                            a->host, a->port);
    }
    return 0;
}

int fb_dial_again(unsigned *attempt, uint64_t deadline_ms)
{
    unsigned shift = *attempt < 8 ? *attempt : 8;
    uint64_t base_us = 1000ull << shift;
    /* 50-150 %: children cut together do not dial again together. */
    uint64_t us = base_us / 2 + randombytes_uniform((uint32_t)base_us + 1);
    uint64_t now = fb_now_ms();
    if (now + us / 1000 + 1 >= deadline_ms)
        return 0;
    (*attempt)++;
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    return 1;
}

int fb_sock_dial(const char *addr, uint64_t deadline_ms, int *fd)
{
    struct addr a;
    int rc = parse_addr(addr, &a);
    if (rc)
        return rc;
    return a.is_unix ? dial_unix(&a, deadline_ms, fd)
                     : dial_tcp(&a, deadline_ms, fd);
}

int fb_sock_accept(int listen_fd, int *fd)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int s = accept4(listen_fd, (struct sockaddr *)&ss, &len,
                        SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (s >= 0) {
            if (ss.ss_family != AF_UNIX)
                tune_tcp(s);
            *fd = s;
            return 0;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 1;
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        return fb_err_errno(FIBER_ESYS, "accept");
    }
}
