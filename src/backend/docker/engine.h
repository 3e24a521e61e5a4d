/*
 * engine.h -- the Docker Engine client that the docker backend
 * (docker.c), the image builder (image.c) and the run tools
 * (fiber_runs_list, fiber_run_logs, fiber_run_kill, fiber_run_clean,
 * fiber_run_start, fiber_backend_check) share: the HTTP layer
 * (backend/http/http.h) on the engine's unix socket, plus what is the
 * Engine's own: finding its socket, the /_ping API-version negotiation
 * (written here once), messages that say what to do when it cannot be
 * reached, and the demultiplexer of container log streams.
 *
 * Errors follow the HTTP layer's contract (http.h): FIBER_EUNREACHABLE,
 * FIBER_ETIMEDOUT, and for a refusal FIBER_ENOKEY (404: no such image or
 * container), FIBER_EAUTH (401, 403) or FIBER_EBACKEND, with the daemon's
 * message quoted.
 *
 * Every function here blocks on the daemon (a connect timeout of 10 s;
 * requests until the daemon answers or their timeout).  None keeps global
 * state besides libcurl's one-time global initialisation.  An fb_engine
 * belongs to one thread at a time.
 */
#ifndef FB_DOCKER_ENGINE_H
#define FB_DOCKER_ENGINE_H

#include <stddef.h>

#include <jansson.h>

#include "backend/http/http.h"
#include "fiber/fiber.h"

/* The newest Engine API version these calls are written against.  A client
 * uses min(this, what the daemon reports), as the docker CLI does. */
#define FB_ENGINE_API_MAX "1.41"
/* The oldest the daemon may speak: wait conditions need 1.30. */
#define FB_ENGINE_API_MIN_MINOR 30

#define FB_DEFAULT_DOCKER_SOCKET "/var/run/docker.sock"

/* One conversation with the daemon. */
struct fb_engine {
    struct fb_http http;  /* "the Docker Engine" on socket */
    char socket[512];     /* the daemon's unix socket (docker_socket) */
    char api[16];         /* the version in request paths: "1.41" */
    char daemon_api[16];  /* what the daemon reported on /_ping */
    int api_minor;        /* api is 1.<api_minor> */
};

/* Reads the docker_socket configuration key (fiber_config_get, which
 * takes the runtime lock: never call this from a backend op) and does
 * fb_engine_open_at.  FIBER_ECONFIG when the configuration is broken. */
int fb_engine_open(struct fb_engine *e);

/* Pings the daemon at socket (GET /_ping) and chooses the API version:
 * the daemon's, but no newer than FB_ENGINE_API_MAX; a daemon older than
 * 1.FB_ENGINE_API_MIN_MINOR, or one that names no version, is
 * FIBER_EBACKEND.  Needs no lock.  Returns 0, or FIBER_EUNREACHABLE /
 * FIBER_ETIMEDOUT with a message naming the socket, why it could not be
 * used and what to do.  On failure e needs no fb_engine_close, and
 * e->socket still names the socket. */
int fb_engine_open_at(struct fb_engine *e, const char *socket);

/* Releases the connection.  A zeroed or already closed e is a no-op. */
void fb_engine_close(struct fb_engine *e);

/* Sends one request.  path is the API path without the version prefix
 * ("/containers/json?all=1"); body (len bytes, may be NULL) is sent with
 * content_type (NULL: application/json).  The response body is appended
 * to resp (may be NULL) and its HTTP status stored in *status.
 * timeout_ms bounds the whole request (<= 0: none).  Returns 0 when the
 * daemon answered, whatever the status; else a code of the contract
 * (FIBER_ETIMEDOUT when timeout_ms passed first). */
int fb_engine_request(struct fb_engine *e, const char *method,
                      const char *path, const char *content_type,
                      const void *body, size_t len, fiber_buf *resp,
                      long *status, long timeout_ms);

/* As fb_engine_request, with a JSON body (NULL: none) and a JSON answer,
 * within 60 s: on a 2xx status *out (may be NULL) is the parsed answer
 * (NULL when the body was empty), which the caller json_decref()s.  A
 * status outside 2xx fails as the contract says (404: FIBER_ENOKEY, so
 * callers can tell "no such image or container"), the message naming
 * `what` and quoting the daemon. */
int fb_engine_json(struct fb_engine *e, const char *method, const char *path,
                   json_t *body, json_t **out, const char *what);

/* Receives the response to a request as it arrives: sink(ud, data, len) is
 * called for each piece (a nonzero return stops the transfer and becomes
 * the result).  For streams that end when something ends (a followed log).
 * Returns 0, the sink's code, or a code of the contract. */
typedef fb_http_sink fb_engine_sink;
int fb_engine_stream(struct fb_engine *e, const char *method,
                     const char *path, fb_engine_sink sink, void *ud,
                     const char *what);

/* URL-encodes text into out (size bytes, NUL-terminated): fb_http_escape.
 * Returns 0, or FIBER_EINVAL when it does not fit. */
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

#endif /* FB_DOCKER_ENGINE_H */
