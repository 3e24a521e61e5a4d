/*
 * engine.c -- the Docker Engine client of engine.h, on the HTTP layer.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/docker/engine.h"
#include "base/common.h"

#define PING_TIMEOUT_MS 5000L
#define REQUEST_TIMEOUT_MS 60000L
#define ENGINE_NAME "the Docker Engine"
#define ELSEWHERE                                                              \
    "set docker_socket (FIBER_DOCKER_SOCKET) to the daemon's socket if it "    \
    "listens elsewhere"

/* Parses "1.41" into its minor number (the major must be 1); -1 if not. */
static int api_minor_of(const char *version)
{
    char *end;
    long major = strtol(version, &end, 10);
    if (major != 1 || *end != '.')
        return -1;
    long minor = strtol(end + 1, &end, 10);
    return *end == '\0' && minor >= 0 && minor < 1000 ? (int)minor : -1;
}

/* Rewords a failed ping (fiber_last_error() holds the HTTP layer's
 * message) to say what to do about it; keeps the code. */
static int unreachable(const struct fb_engine *e, int rc)
{
    long os_errno = e->http.os_errno;
    const char *what = os_errno == ENOENT ? "no such socket"
                      : os_errno == ECONNREFUSED
                          ? "connection refused, nothing listens there"
                          : NULL;
    if (rc == FIBER_EUNREACHABLE && what)
        return fb_err(rc,
                      "cannot reach the Docker Engine at %s: %s; is dockerd "
                      "running? (systemctl start docker); or " ELSEWHERE,
                      e->socket, what);
    if (rc == FIBER_EUNREACHABLE && os_errno == EACCES)
        return fb_err(rc,
                      "cannot reach the Docker Engine at %s: permission "
                      "denied; add your user to the socket's group, usually "
                      "docker (usermod -aG docker $USER, then log in again), "
                      "run as root, or set docker_socket "
                      "(FIBER_DOCKER_SOCKET) to a socket you may use",
                      e->socket);
    char why[700];
    fb_strlcpy(why, fiber_last_error(), sizeof why);
    return fb_err(rc, "%s; is dockerd running? is FIBER_DOCKER_SOCKET (the "
                      "docker_socket key) right?",
                  why);
}

/* GET /_ping: that the daemon answers, and its API version. */
static int ping(struct fb_engine *e)
{
    struct stat st;
    if (stat(e->socket, &st) == 0 && !S_ISSOCK(st.st_mode))
        return fb_err(FIBER_EUNREACHABLE,
                      "cannot reach the Docker Engine at %s: not a unix "
                      "socket; " ELSEWHERE,
                      e->socket);
    struct fb_http_reply r;
    int rc = fb_http_request(&e->http, "GET", "/_ping", NULL, 0, NULL,
                             PING_TIMEOUT_MS, &r);
    int daemon = -1, ours = api_minor_of(FB_ENGINE_API_MAX);
    if (rc) {
        rc = unreachable(e, rc);
    } else if (r.status != 200) {
        char msg[300];
        rc = fb_err(FIBER_EUNREACHABLE,
                    "%s answered GET /_ping with HTTP %ld (%s): is it a "
                    "Docker Engine socket? " ELSEWHERE,
                    e->socket, r.status,
                    fb_http_message(r.body.data, r.body.len, msg, sizeof msg));
    } else if ((daemon = api_minor_of(r.api_version)) < 0) {
        rc = fb_err(FIBER_EBACKEND,
                    "%s sent no usable API version ('%s') in its answer to "
                    "GET /_ping: is it a Docker Engine?",
                    e->socket, r.api_version);
    } else if (daemon < FB_ENGINE_API_MIN_MINOR) {
        rc = fb_err(FIBER_EBACKEND,
                    "the Docker Engine at %s speaks API %s; fiber needs "
                    "1.%d or newer (Docker 17.07+)",
                    e->socket, r.api_version, FB_ENGINE_API_MIN_MINOR);
    } else {
        /* The daemon's version, but no newer than the one these calls
         * were written against: negotiation as the docker CLI does it. */
        fb_strlcpy(e->daemon_api, r.api_version, sizeof e->daemon_api);
        fb_strlcpy(e->api, daemon < ours ? r.api_version : FB_ENGINE_API_MAX,
                   sizeof e->api);
        e->api_minor = daemon < ours ? daemon : ours;
        fb_http_set_version(&e->http, e->api);
    }
    fb_http_reply_free(&r);
    return rc;
}

int fb_engine_open_at(struct fb_engine *e, const char *socket)
{
    memset(e, 0, sizeof *e);
    fb_strlcpy(e->socket, socket && socket[0] ? socket
                                              : FB_DEFAULT_DOCKER_SOCKET,
               sizeof e->socket);
    int rc = fb_http_open_unix(&e->http, ENGINE_NAME, e->socket);
    if (rc == 0 && (rc = ping(e)) != 0)
        fb_http_close(&e->http);
    return rc;
}

int fb_engine_open(struct fb_engine *e)
{
    memset(e, 0, sizeof *e);
    char sock[sizeof e->socket];
    int rc = fiber_config_get("docker_socket", sock, sizeof sock);
    if (rc)
        return rc;
    return fb_engine_open_at(e, sock);
}

void fb_engine_close(struct fb_engine *e)
{
    if (e)
        fb_http_close(&e->http);
}

int fb_engine_request(struct fb_engine *e, const char *method,
                      const char *path, const char *content_type,
                      const void *body, size_t len, fiber_buf *resp,
                      long *status, long timeout_ms)
{
    struct fb_http_reply r;
    *status = 0;
    int rc = fb_http_request(&e->http, method, path, body, len,
                             content_type ? content_type : "application/json",
                             timeout_ms, &r);
    if (rc == 0) {
        *status = r.status;
        if (resp && r.body.len && fiber_buf_append(resp, r.body.data,
                                                   r.body.len) != 0)
            rc = fb_err(FIBER_ENOMEM, "out of memory reading the Docker "
                                      "Engine's answer");
    }
    fb_http_reply_free(&r);
    return rc;
}

int fb_engine_json(struct fb_engine *e, const char *method, const char *path,
                   json_t *body, json_t **out, const char *what)
{
    return fb_http_call(&e->http, method, path, body, REQUEST_TIMEOUT_MS, out,
                        what);
}

int fb_engine_stream(struct fb_engine *e, const char *method,
                     const char *path, fb_engine_sink sink, void *ud,
                     const char *what)
{
    return fb_http_stream(&e->http, method, path, 0, sink, ud, what);
}

int fb_engine_escape(const char *text, char *out, size_t size)
{
    return fb_http_escape(text, out, size);
}

int fb_demux_feed(struct fb_demux *d, const void *data, size_t len,
                  fb_demux_out out, void *ud)
{
    const unsigned char *p = data;
    while (len > 0) {
        if (d->left == 0) {
            size_t take = sizeof d->hdr - d->hdr_have;
            if (take > len)
                take = len;
            memcpy(d->hdr + d->hdr_have, p, take);
            d->hdr_have += take;
            p += take;
            len -= take;
            if (d->hdr_have < sizeof d->hdr)
                break;
            d->hdr_have = 0;
            d->stream = d->hdr[0];
            d->left = (size_t)d->hdr[4] << 24 | (size_t)d->hdr[5] << 16 |
                      (size_t)d->hdr[6] << 8 | (size_t)d->hdr[7];
            continue;
        }
        size_t take = d->left < len ? d->left : len;
        int rc = out(ud, d->stream, p, take);
        if (rc)
            return rc;
        d->left -= take;
        p += take;
        len -= take;
    }
    return 0;
}

int fb_engine_describe(char *detail, size_t size)
{
    struct fb_engine e;
    int rc = fb_engine_open(&e);
    if (rc) {
        fb_strlcpy(detail, fiber_last_error(), size);
        return rc;
    }
    json_t *v = NULL;
    rc = fb_engine_json(&e, "GET", "/version", NULL, &v, "GET /version");
    if (rc == 0) {
        const char *ver = json_string_value(json_object_get(v, "Version"));
        snprintf(detail, size,
                 "Docker Engine %s at %s, API %s (fiber uses %s)",
                 ver ? ver : "(unknown version)", e.socket, e.daemon_api,
                 e.api);
    } else {
        fb_strlcpy(detail, fiber_last_error(), size);
    }
    json_decref(v);
    fb_engine_close(&e);
    return rc;
}
