/*
 * image.h -- the Docker Engine calls behind fiber_image_build() and the run
 * tools (fiber_runs_list, fiber_run_logs, fiber_run_kill, fiber_run_clean,
 * fiber_run_start, fiber_backend_check): a small client for the Engine API
 * over its unix socket (libcurl), and the demultiplexer for container log
 * streams.
 *
 * The docker backend (docker.c) has an HTTP helper of its own (http.c),
 * written at the same time as this one; when both have settled they should
 * become one.
 *
 * Every function here blocks on the daemon (a connect timeout of a few
 * seconds; requests until the daemon answers).  None keeps global state
 * besides libcurl's one-time global initialisation.
 */
#ifndef FB_DOCKER_IMAGE_H
#define FB_DOCKER_IMAGE_H

#include <stddef.h>

#include <jansson.h>

#include "fiber/fiber.h"

/* The newest Engine API version these calls are written against.  A client
 * uses min(this, what the daemon reports), as the docker CLI does. */
#define FB_ENGINE_API_MAX "1.41"

/* The connection-free state of one conversation with the daemon. */
struct fb_engine {
    char socket[512];     /* the daemon's unix socket (docker_socket) */
    char api[16];         /* the version in request paths: "1.41" */
    char daemon_api[16];  /* what the daemon reported on /_ping */
    void *curl;           /* CURL *, reused between requests */
};

/* Reads the docker_socket configuration key (default
 * /var/run/docker.sock), pings the daemon (GET /_ping) and chooses the API
 * version.  Returns 0, or FIBER_EUNREACHABLE with a message naming the
 * socket, why it could not be used and what to do; FIBER_ECONFIG when the
 * configuration itself is broken.  On failure e needs no fb_engine_close. */
int fb_engine_open(struct fb_engine *e);

/* Releases the connection.  A zeroed or already closed e is a no-op. */
void fb_engine_close(struct fb_engine *e);

/* Sends one request.  path is the API path without the version prefix
 * ("/containers/json?all=1"); body (len bytes, may be NULL) is sent with
 * content_type.  The response body is appended to resp (may be NULL) and
 * its HTTP status stored in *status.  timeout_ms bounds the whole request
 * (<= 0: none).  Returns 0 when the daemon answered, whatever the status;
 * FIBER_ETIMEDOUT when timeout_ms passed first; FIBER_EUNREACHABLE
 * (message says why) when it could not be reached. */
int fb_engine_request(struct fb_engine *e, const char *method,
                      const char *path, const char *content_type,
                      const void *body, size_t len, fiber_buf *resp,
                      long *status, long timeout_ms);

/* As fb_engine_request, with a JSON body (NULL: none) and a JSON answer:
 * on a 2xx status *out (may be NULL) is the parsed answer (NULL when the
 * body was empty), which the caller json_decref()s.  A status outside
 * 2xx fails with FIBER_EBACKEND and a message "<what>: <daemon's
 * message>", except 404, which fails with FIBER_ENOKEY so callers can
 * tell "no such image or container". */
int fb_engine_json(struct fb_engine *e, const char *method, const char *path,
                   json_t *body, json_t **out, const char *what);

/* Receives the response to a request as it arrives: sink(ud, data, len) is
 * called for each piece (a nonzero return stops the transfer and becomes
 * the result).  For streams that end when something ends (a followed log).
 * Returns 0, the sink's code, FIBER_EBACKEND for a status outside 2xx
 * (with the daemon's message), FIBER_EUNREACHABLE. */
typedef int (*fb_engine_sink)(void *ud, const void *data, size_t len);
int fb_engine_stream(struct fb_engine *e, const char *method,
                     const char *path, fb_engine_sink sink, void *ud,
                     const char *what);

/* URL-encodes text into out (size bytes, NUL-terminated).  Returns 0, or
 * FIBER_EINVAL when it does not fit. */
int fb_engine_escape(const char *text, char *out, size_t size);

/* Container log streams (no TTY) are multiplexed: each frame is an 8-byte
 * header (stream: 1 stdout, 2 stderr; three zero bytes; a big-endian
 * 32-bit length) and then that many bytes.  fb_demux_feed takes the stream
 * in pieces of any size and calls out(ud, stream, data, len) for each run
 * of payload bytes.  A nonzero return from out stops and is returned. */
struct fb_demux {
    unsigned char hdr[8];
    size_t hdr_have; /* header bytes seen of the current frame */
    size_t left;     /* payload bytes left in the current frame */
    int stream;
};
typedef int (*fb_demux_out)(void *ud, int stream, const void *data,
                            size_t len);
int fb_demux_feed(struct fb_demux *d, const void *data, size_t len,
                  fb_demux_out out, void *ud);

/* Checks the Docker backend: fills detail with the Engine's version and
 * API version and where it was reached.  Returns 0 or fb_engine_open's
 * error (detail then holds the message). */
int fb_engine_describe(char *detail, size_t size);

#endif /* FB_DOCKER_IMAGE_H */
