/*
 * http.h -- a small HTTP client for the Docker Engine API on its unix
 * socket: libcurl (CURLOPT_UNIX_SOCKET_PATH) moves the bytes, jansson
 * reads and writes the JSON.
 *
 * Two kinds of request:
 *
 *   - synchronous (fb_http_request, fb_http_json): sent on one reused curl
 *     handle, so consecutive requests share a keep-alive connection; the
 *     call waits for the whole reply, up to its timeout;
 *   - long-lived (struct fb_http_async): requests the engine answers only
 *     when something happens (POST /containers/{id}/wait), driven without
 *     blocking by fb_http_pump() on a curl multi handle.
 *
 * Paths are the API's ("/containers/create"); once fb_http_set_version()
 * was called every path is prefixed with "/v<version>", as the Engine API
 * asks clients to do.
 *
 * Threads: an fb_http and its async requests belong to one thread at a
 * time (the docker backend calls it with the runtime lock held).  No
 * thread is started.
 */
#ifndef FB_DOCKER_HTTP_H
#define FB_DOCKER_HTTP_H

#include <stddef.h>

#include "backend/docker/curl_dl.h"
#include <jansson.h>

#include "fiber/fiber.h"

struct fb_http {
    CURL *easy;          /* synchronous requests */
    CURLM *multi;        /* async requests */
    char socket_path[108];
    char prefix[24];     /* "/v1.41", or "" before fb_http_set_version */
    char error[CURL_ERROR_SIZE];
};

/* A reply to a synchronous request. */
struct fb_http_reply {
    long status;             /* HTTP status */
    fiber_buf body;          /* the body, as received (owned) */
    char api_version[16];    /* the Api-Version header, "" if absent */
};

/* A long-lived request (see the top of this file).  Zero it before
 * fb_http_async_start; it must not move while it is in flight (curl keeps
 * a pointer to it). */
struct fb_http_async {
    CURL *easy;
    struct curl_slist *headers;
    int in_multi;      /* added to the multi handle */
    int got_headers;   /* the engine answered with a status line and headers */
    int done;          /* the reply is complete, or the transfer failed */
    int failed;        /* done, but the transfer broke (curl_error says why) */
    long status;       /* HTTP status, once got_headers */
    fiber_buf body;
    char curl_error[CURL_ERROR_SIZE];
};

/* Prepares h to talk to the engine at socket_path (libcurl's global
 * initialisation happens once per process).  Does not connect.  Returns 0,
 * FIBER_EINVAL (path too long) or FIBER_ENOMEM. */
int fb_http_open(struct fb_http *h, const char *socket_path);

/* Releases h.  Every async request must have been freed.  NULL-safe on a
 * zeroed h. */
void fb_http_close(struct fb_http *h);

/* From now on, prefixes every path with "/v<version>" ("1.41"). */
void fb_http_set_version(struct fb_http *h, const char *version);

/* Sends method path with body (len bytes of content type ctype; body may be
 * NULL) and waits up to timeout_ms for the whole reply, which it stores in
 * *r (the caller frees it with fb_http_reply_free, whatever the result).
 * path must already be URL-encoded (fb_http_escape).  Returns 0 when the
 * engine answered, whatever the status, or FIBER_EUNREACHABLE with a
 * message naming the socket when it could not be reached or did not
 * answer in time. */
int fb_http_request(struct fb_http *h, const char *method, const char *path,
                    const void *body, size_t len, const char *ctype,
                    long timeout_ms, struct fb_http_reply *r);

/* fb_http_request with a JSON body (NULL: none) and a JSON reply: *status
 * is the HTTP status and *out (if out is not NULL) the parsed reply, or
 * NULL when the body is empty or not JSON; the caller json_decref()s it.
 * Returns 0 or FIBER_EUNREACHABLE, FIBER_ENOMEM. */
int fb_http_json(struct fb_http *h, const char *method, const char *path,
                 json_t *body, long timeout_ms, long *status, json_t **out);

void fb_http_reply_free(struct fb_http_reply *r);

/* The engine's explanation in an error reply ({"message": "..."}), or the
 * body itself cut to fit, copied into buf.  Returns buf. */
const char *fb_http_message(const void *body, size_t len, char *buf,
                            size_t size);

/* URL-encodes s into buf (percent-encoding everything but unreserved
 * characters).  Returns 0, or -1 if it does not fit. */
int fb_http_escape(const char *s, char *buf, size_t size);

/* Starts a long-lived request and waits up to header_timeout_ms for the
 * engine to answer with its status line and headers (the engine sends
 * them once it has registered the request, which is what makes
 * POST /containers/{id}/wait safe to issue before the start).  Returns 0
 * with a->got_headers set (a->status tells whether the engine accepted
 * it; a->done may already be set), or FIBER_EUNREACHABLE / FIBER_ENOMEM;
 * in every case the caller frees a with fb_http_async_free. */
int fb_http_async_start(struct fb_http *h, struct fb_http_async *a,
                        const char *method, const char *path,
                        long header_timeout_ms);

/* Moves every async request forward without blocking and marks those that
 * finished (done, failed).  Cheap: one curl_multi_perform. */
void fb_http_pump(struct fb_http *h);

/* Like fb_http_pump, but waits up to timeout_ms until a->done. */
void fb_http_async_wait(struct fb_http *h, struct fb_http_async *a,
                        long timeout_ms);

/* Cancels a (if still in flight) and frees what it holds; a is zeroed. */
void fb_http_async_free(struct fb_http *h, struct fb_http_async *a);

#endif /* FB_DOCKER_HTTP_H */
