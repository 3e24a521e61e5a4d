/*
 * test_http.c -- the HTTP layer's error contract (backend/http/http.h)
 * against real endpoints: a unix socket where nothing listens, one that
 * accepts and never answers, a small server of this test that answers
 * 503, streams, and the Docker Engine's own 404 with its message.  The
 * TLS cases (a certificate that does not verify, a token the server
 * refuses) run against the Kubernetes test cluster in test_kubernetes
 * (http_layer_*).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "backend/docker/engine.h"
#include "backend/http/http.h"
#include "base/common.h"
#include "harness.h"

static void socket_path(char *buf, size_t size, const char *what)
{
    snprintf(buf, size, "/tmp/fiber-test-http-%s-%d.sock", what,
             (int)getpid());
    unlink(buf);
}

/* A listening unix socket at path; returns its descriptor. */
static int listen_at(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    fb_strlcpy(a.sun_path, path, sizeof a.sun_path);
    CHECK(fd >= 0);
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(listen(fd, 8) == 0);
    return fd;
}

static struct fb_http open_unix(const char *path)
{
    struct fb_http h;
    CHECK_OK(fb_http_open_unix(&h, "the test server", path));
    return h;
}

TEST(no_such_socket_is_unreachable)
{
    char path[108];
    socket_path(path, sizeof path, "absent");
    struct fb_http h = open_unix(path);
    struct fb_http_reply r;
    CHECK_ERR(fb_http_request(&h, "GET", "/_ping", NULL, 0, NULL, 2000, &r),
              FIBER_EUNREACHABLE);
    fb_http_reply_free(&r);
    CHECK_CONTAINS(fiber_last_error(), "cannot reach the test server at");
    CHECK_CONTAINS(fiber_last_error(), path);
    CHECK_CONTAINS(fiber_last_error(), "(GET /_ping)");
    CHECK_CONTAINS(fiber_last_error(), "No such file or directory");
    CHECK_EQ(h.os_errno, ENOENT);
    fb_http_close(&h);
}

/* Bound, then closed: the file stays, nothing listens. */
TEST(socket_where_nothing_listens_is_unreachable)
{
    char path[108];
    socket_path(path, sizeof path, "dead");
    close(listen_at(path));
    struct fb_http h = open_unix(path);
    struct fb_http_reply r;
    int rc = fb_http_request(&h, "POST", "/containers/create?name=x", "{}", 2,
                             "application/json", 2000, &r);
    fb_http_reply_free(&r);
    unlink(path);
    CHECK_ERR(rc, FIBER_EUNREACHABLE);
    CHECK_CONTAINS(fiber_last_error(), path);
    CHECK_CONTAINS(fiber_last_error(), "(POST /containers/create)");
    CHECK_CONTAINS(fiber_last_error(), "Connection refused");
    fprintf(stderr, "message: %s\n", fiber_last_error());
    fb_http_close(&h);
}

/* The engine client words it for a user: what to do. */
TEST(engine_socket_where_nothing_listens_says_what_to_do)
{
    char path[108];
    socket_path(path, sizeof path, "engine");
    close(listen_at(path));
    struct fb_engine e;
    int rc = fb_engine_open_at(&e, path);
    unlink(path);
    CHECK_ERR(rc, FIBER_EUNREACHABLE);
    CHECK_CONTAINS(fiber_last_error(), path);
    CHECK_CONTAINS(fiber_last_error(), "connection refused");
    CHECK_CONTAINS(fiber_last_error(), "is dockerd running?");
    CHECK_CONTAINS(fiber_last_error(), "FIBER_DOCKER_SOCKET");
}

/* ---- a server of our own ------------------------------------------------- */

struct server {
    int listen_fd;
    const char *answer; /* NULL: accept, read, and never answer */
    pthread_t thread;
    int conn_fd;
};

static void *serve(void *arg)
{
    struct server *s = arg;
    s->conn_fd = accept(s->listen_fd, NULL, NULL);
    if (s->conn_fd < 0)
        return NULL;
    char req[4096];
    ssize_t got = read(s->conn_fd, req, sizeof req); /* the request */
    (void)got;
    if (s->answer) {
        size_t n = strlen(s->answer);
        if (write(s->conn_fd, s->answer, n) != (ssize_t)n)
            return NULL;
        close(s->conn_fd);
        s->conn_fd = -1;
    }
    return NULL;
}

static void server_start(struct server *s, const char *path,
                         const char *answer)
{
    memset(s, 0, sizeof *s);
    s->listen_fd = listen_at(path);
    s->answer = answer;
    s->conn_fd = -1;
    CHECK(pthread_create(&s->thread, NULL, serve, s) == 0);
}

static void server_stop(struct server *s)
{
    shutdown(s->listen_fd, SHUT_RDWR); /* wakes an accept still waiting */
    pthread_join(s->thread, NULL);
    if (s->conn_fd >= 0)
        close(s->conn_fd);
    close(s->listen_fd);
}

TEST(server_that_never_answers_times_out)
{
    char path[108];
    socket_path(path, sizeof path, "silent");
    struct server s;
    server_start(&s, path, NULL);
    struct fb_http h = open_unix(path);
    struct fb_http_reply r;
    uint64_t t0 = fb_now_ms();
    int rc = fb_http_request(&h, "GET", "/info?x=1", NULL, 0, NULL, 500, &r);
    uint64_t took = fb_now_ms() - t0;
    fb_http_reply_free(&r);
    CHECK_ERR(rc, FIBER_ETIMEDOUT);
    CHECK(took >= 450 && took < 5000);
    CHECK_CONTAINS(fiber_last_error(), path);
    CHECK_CONTAINS(fiber_last_error(), "did not answer GET /info within 500 ms");
    fprintf(stderr, "message: %s\n", fiber_last_error());
    fb_http_close(&h);
    server_stop(&s);
    unlink(path);
}

TEST(async_request_that_never_answers_times_out)
{
    char path[108];
    socket_path(path, sizeof path, "silent-async");
    struct server s;
    server_start(&s, path, NULL);
    struct fb_http h = open_unix(path);
    struct fb_http_async a = {0};
    CHECK_OK(fb_http_async_start(&h, &a, "POST", "/containers/x/wait", NULL,
                                 NULL));
    CHECK_ERR(fb_http_async_headers(&h, &a, 400), FIBER_ETIMEDOUT);
    CHECK_CONTAINS(fiber_last_error(),
                   "did not answer POST /containers/x/wait within 400 ms");
    fb_http_async_free(&h, &a);
    fb_http_close(&h);
    server_stop(&s);
    unlink(path);
}

#define JSON_503                                                               \
    "HTTP/1.1 503 Service Unavailable\r\n"                                     \
    "Content-Type: application/json\r\nContent-Length: 27\r\n"                 \
    "Connection: close\r\n\r\n"                                                \
    "{\"message\":\"overloaded\\n\"}\n"

TEST(server_error_is_ebackend_with_its_message)
{
    char path[108];
    socket_path(path, sizeof path, "503");
    struct server s;
    server_start(&s, path, JSON_503);
    struct fb_http h = open_unix(path);
    json_t *out = (json_t *)1;
    CHECK_ERR(fb_http_call(&h, "GET", "/version", NULL, 2000, &out,
                           "asking the version"),
              FIBER_EBACKEND);
    CHECK(out == NULL);
    CHECK_CONTAINS(fiber_last_error(),
                   "asking the version was refused by the test server at");
    CHECK_CONTAINS(fiber_last_error(), "(HTTP 503 Service Unavailable)");
    CHECK_CONTAINS(fiber_last_error(), ": overloaded");
    fprintf(stderr, "message: %s\n", fiber_last_error());
    fb_http_close(&h);
    server_stop(&s);
    unlink(path);
}

static int collect(void *ud, const void *data, size_t len)
{
    return fiber_buf_append(ud, data, len);
}

#define CHUNKED_200                                                            \
    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"                        \
    "Connection: close\r\n\r\n"                                                \
    "6\r\nfirst \r\n6\r\nsecond\r\n0\r\n\r\n"

TEST(stream_hands_the_body_to_the_sink)
{
    char path[108];
    socket_path(path, sizeof path, "stream");
    struct server s;
    server_start(&s, path, CHUNKED_200);
    struct fb_http h = open_unix(path);
    fiber_buf got = {0};
    CHECK_OK(fb_http_stream(&h, "GET", "/logs?follow=1", 2000, collect, &got,
                            "following"));
    CHECK_EQ(got.len, 12);
    CHECK(memcmp(got.data, "first second", 12) == 0);
    fiber_buf_free(&got);
    fb_http_close(&h);
    server_stop(&s);
    unlink(path);
}

TEST(status_codes_of_the_contract)
{
    CHECK_EQ(fb_http_status_code(200), 0);
    CHECK_EQ(fb_http_status_code(204), 0);
    CHECK_EQ(fb_http_status_code(401), FIBER_EAUTH);
    CHECK_EQ(fb_http_status_code(403), FIBER_EAUTH);
    CHECK_EQ(fb_http_status_code(404), FIBER_ENOKEY);
    CHECK_EQ(fb_http_status_code(409), FIBER_EBACKEND);
    CHECK_EQ(fb_http_status_code(422), FIBER_EBACKEND);
    CHECK_EQ(fb_http_status_code(500), FIBER_EBACKEND);
    char buf[16];
    CHECK_OK(fb_http_escape("a b/c~", buf, sizeof buf));
    CHECK_STR(buf, "a%20b%2Fc~");
    CHECK_ERR(fb_http_escape("0123456789", buf, 8), FIBER_EINVAL);
}

/* ---- the Docker Engine -------------------------------------------------- */

TEST(engine_404_is_enokey_with_the_daemons_message)
{
    char sock[512];
    CHECK_OK(fiber_config_get("docker_socket", sock, sizeof sock));
    if (access(sock, W_OK) != 0)
        TH_SKIP_ENGINE("no Docker Engine socket at %s", sock);
    struct fb_engine e;
    CHECK_OK(fb_engine_open(&e));
    char path[128];
    snprintf(path, sizeof path, "/images/fiber-test-http-none-%d:x/json",
             (int)getpid());
    json_t *out = NULL;
    CHECK_ERR(fb_engine_json(&e, "GET", path, NULL, &out, "inspecting it"),
              FIBER_ENOKEY);
    CHECK(out == NULL);
    const char *m = fiber_last_error();
    fprintf(stderr, "message: %s\n", m);
    CHECK_CONTAINS(m, "inspecting it was refused by the Docker Engine at");
    CHECK_CONTAINS(m, sock);
    CHECK_CONTAINS(m, "(HTTP 404 Not Found)");
    /* The daemon's own words, quoted. */
    CHECK_CONTAINS(m, "No such image: fiber-test-http-none-");
    fb_engine_close(&e);
}

TH_MAIN()
