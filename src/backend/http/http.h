/*
 * http.h -- the one HTTP client of fiber: the Docker Engine API on its
 * unix socket and the Kubernetes API over TLS with a bearer token.
 * libcurl (opened with dlopen, curl_dl.h) moves the bytes; jansson reads
 * and writes the JSON.  The docker engine client (docker/engine.h) and
 * the kubernetes client (kubernetes/k8s_api.h) are thin layers over it.
 *
 * Transports (chosen when the handle is opened):
 *   - unix: fb_http_open_unix, plain HTTP on a unix-domain socket;
 *   - url:  fb_http_open_url, https:// (the peer's certificate always
 *     verified, against ca_file or the system's bundle) or http://, with
 *     an optional bearer token (fb_http_set_token).
 *
 * Requests:
 *   - synchronous (fb_http_request, fb_http_json): sent on one reused curl
 *     handle, so consecutive requests share a keep-alive connection; the
 *     call waits for the whole reply, up to its timeout;
 *   - streamed (fb_http_stream): synchronous, the body handed to a sink as
 *     it arrives (a followed log);
 *   - long-lived (struct fb_http_async): requests answered only when
 *     something happens (a container's wait, a watch), driven without
 *     blocking by fb_http_pump() / fb_http_poll() on the handle's multi
 *     handle.
 * Paths are the API's ("/containers/create", "/api/v1/..."), already
 * URL-encoded (fb_http_escape); after fb_http_set_version every path is
 * prefixed with "/v<version>", as the Engine API asks.
 *
 * THE ERROR CONTRACT (every function here that talks to a server):
 *   - the server could not be reached -- no such socket, connection
 *     refused, permission denied, unknown host, no connection within the
 *     connect timeout (10 s) -- FIBER_EUNREACHABLE;
 *   - it was reached but did not answer (completely) within the
 *     request's timeout: FIBER_ETIMEDOUT;
 *   - TLS failed: the server's certificate did not verify against the CA,
 *     or the handshake failed: FIBER_EAUTH;
 *   - the reply's body could not be stored (out of memory): FIBER_ENOMEM;
 *   - it answered: fb_http_request, fb_http_json and async requests
 *     return 0 whatever the status, and the caller decides; the checked
 *     calls (fb_http_call, fb_http_stream) and fb_http_refused turn a
 *     status outside 2xx into fb_http_status_code(status):
 *     401 and 403 (the token was refused, or lacks the right) FIBER_EAUTH;
 *     404 FIBER_ENOKEY; any other 4xx and every 5xx FIBER_EBACKEND.
 *     A backend op whose own contract names another code (create_job:
 *     FIBER_ESPAWN) re-codes the error and keeps its message.
 * Every message names the server and its endpoint ("the Docker Engine at
 * /var/run/docker.sock", "the Kubernetes API server at https://...:6443"),
 * the request (method and path without its query), and, for a refusal,
 * the status, its name and the server's own explanation (Docker's
 * {"message": ...}, or a Kubernetes Status object's message and reason).
 *
 * Threads: an fb_http and its async requests belong to one thread at a
 * time; fb_http_clone makes another handle for another thread.  No thread
 * is started.
 */
#ifndef FB_HTTP_H
#define FB_HTTP_H

#include <stddef.h>

#include "backend/http/curl_dl.h"
#include <jansson.h>

#include "fiber/fiber.h"

#define FB_HTTP_CONNECT_TIMEOUT_MS 10000L

struct fb_http {
    CURL *easy;            /* synchronous requests */
    CURLM *multi;          /* async requests */
    char name[48];         /* "the Docker Engine": for messages */
    char endpoint[512];    /* the socket path or the server's URL */
    char socket_path[108]; /* unix transport, else "" */
    char base[300];        /* "http://localhost" or "https://host:port" */
    char prefix[24];       /* "/v1.41", or "" before fb_http_set_version */
    char ca_file[512];     /* TLS: the CA bundle; "" = the system's */
    char token[4096];      /* bearer token, "" = none */
    long os_errno;         /* errno of the last failed connect, or 0 */
    char error[CURL_ERROR_SIZE];
};

/* A reply to a synchronous request. */
struct fb_http_reply {
    long status;             /* HTTP status */
    fiber_buf body;          /* the body, as received (owned) */
    char api_version[16];    /* the Api-Version header, "" if absent */
};

/* Receives a streamed body: nonzero stops the transfer and is returned. */
typedef int (*fb_http_sink)(void *ud, const void *data, size_t len);

/* A long-lived request (see the top of this file).  Zero it before
 * fb_http_async_start; it must not move while it is in flight (curl keeps
 * a pointer to it). */
struct fb_http_async {
    CURL *easy;
    struct curl_slist *headers;
    fb_http_sink sink; /* NULL: the body collects in body */
    void *ud;
    int in_multi;      /* added to the multi handle */
    int got_headers;   /* the server answered with a status line and headers */
    int done;          /* the reply is complete, or the transfer failed */
    int failed;        /* done, but the transfer broke (curl_error says why) */
    int result;        /* the CURLcode when failed */
    int sink_rc;       /* what the sink returned, when it stopped it */
    long status;       /* HTTP status, once got_headers */
    fiber_buf body;    /* the body (sink NULL, or a status outside 2xx) */
    char method[8];
    char path[200];    /* without the query, for messages */
    char curl_error[CURL_ERROR_SIZE];
};

/* Prepares h to talk to `name` ("the Docker Engine") on the unix socket
 * socket_path.  Loads libcurl; does not connect.  Returns 0, FIBER_EINVAL
 * (path too long), FIBER_ENOTSUP (no libcurl) or FIBER_ENOMEM; on failure
 * h needs no fb_http_close. */
int fb_http_open_unix(struct fb_http *h, const char *name,
                      const char *socket_path);

/* Prepares h to talk to `name` at url ("https://10.96.0.1:443", no
 * trailing slash), verifying an https server's certificate against
 * ca_file ("" or NULL: the system's bundle).  Returns as
 * fb_http_open_unix. */
int fb_http_open_url(struct fb_http *h, const char *name, const char *url,
                     const char *ca_file);

/* Another handle to the same server (version, token), for another thread.
 * Returns 0 or FIBER_ENOMEM. */
int fb_http_clone(struct fb_http *dst, const struct fb_http *src);

/* Releases h (every async request must have been freed) and wipes the
 * token.  A zeroed or closed h is a no-op. */
void fb_http_close(struct fb_http *h);

/* From now on, prefixes every path with "/v<version>" ("1.41"). */
void fb_http_set_version(struct fb_http *h, const char *version);

/* Sends "Authorization: Bearer <token>" with every request from now on
 * ("" or NULL: none).  Returns 0, or FIBER_EINVAL if it is too long. */
int fb_http_set_token(struct fb_http *h, const char *token);

/* Sends method path with body (len bytes of content type ctype; body may be
 * NULL) and waits up to timeout_ms (<= 0: no limit) for the whole reply,
 * which it stores in *r (the caller frees it with fb_http_reply_free,
 * whatever the result).  Returns 0 when the server answered, whatever the
 * status, else a code of the error contract. */
int fb_http_request(struct fb_http *h, const char *method, const char *path,
                    const void *body, size_t len, const char *ctype,
                    long timeout_ms, struct fb_http_reply *r);

/* fb_http_request with a JSON body (NULL: none) and a JSON reply: *status
 * is the HTTP status and *out (if out is not NULL) the parsed reply, or
 * NULL when the body is empty or not JSON; the caller json_decref()s it.
 * Returns as fb_http_request. */
int fb_http_json(struct fb_http *h, const char *method, const char *path,
                 json_t *body, long timeout_ms, long *status, json_t **out);

/* The checked call: fb_http_json, and a status outside 2xx becomes
 * fb_http_refused(h, 0, what, ...).  On success *out (may be NULL) is the
 * parsed reply (NULL when empty); a 2xx body that is not JSON is
 * FIBER_EBACKEND. */
int fb_http_call(struct fb_http *h, const char *method, const char *path,
                 json_t *body, long timeout_ms, json_t **out,
                 const char *what);

/* Streams the reply to method path into sink as it arrives, for up to
 * timeout_ms (<= 0: until the server ends it).  A status outside 2xx is
 * fb_http_refused(h, 0, what, ...) (the sink is not called).  Returns 0,
 * the sink's nonzero code, or a code of the contract. */
int fb_http_stream(struct fb_http *h, const char *method, const char *path,
                   long timeout_ms, fb_http_sink sink, void *ud,
                   const char *what);

void fb_http_reply_free(struct fb_http_reply *r);

/* The code of the contract for an HTTP status: 0 for 2xx, FIBER_EAUTH for
 * 401 and 403, FIBER_ENOKEY for 404, else FIBER_EBACKEND. */
int fb_http_status_code(long status);

/* Says that the server refused a request: "<what> was refused by <name>
 * at <endpoint> (HTTP <status> <status name>[, <reason>]): <the server's
 * message><hint>", the message read from the error body (body, len bytes)
 * by fb_http_message, the reason being a Kubernetes Status object's when
 * it adds to the status name.  hint (may be NULL) is appended as is
 * ("; check the token").  code 0: fb_http_status_code(status).  Sets
 * fiber_last_error() and returns the code. */
int fb_http_refused(const struct fb_http *h, int code, const char *what,
                    long status, const void *body, size_t len,
                    const char *hint);

/* The server's explanation in an error body: the "message" of a JSON
 * object (Docker's {"message": "..."}; a Kubernetes Status object), or
 * the body itself cut to fit, without trailing new lines, copied into
 * buf.  Returns buf. */
const char *fb_http_message(const void *body, size_t len, char *buf,
                            size_t size);

/* URL-encodes s into buf (percent-encoding everything but unreserved
 * characters).  Returns 0, or FIBER_EINVAL if it does not fit. */
int fb_http_escape(const char *s, char *buf, size_t size);

/* Starts a long-lived request; does not wait.  sink (may be NULL: the
 * body collects in a->body) receives a 2xx body as it arrives; another
 * status's body collects in a->body.  Returns 0 or FIBER_ENOMEM /
 * FIBER_EINVAL; in every case the caller frees a with fb_http_async_free. */
int fb_http_async_start(struct fb_http *h, struct fb_http_async *a,
                        const char *method, const char *path,
                        fb_http_sink sink, void *ud);

/* Waits up to timeout_ms for the server to answer a with its status line
 * and headers (the Docker Engine sends them once it has registered the
 * request, which is what makes POST /containers/{id}/wait safe to issue
 * before the start).  Returns 0 with a->got_headers set (a->status tells
 * whether the request was accepted; a->done may already be set), or a
 * code of the contract. */
int fb_http_async_headers(struct fb_http *h, struct fb_http_async *a,
                          long timeout_ms);

/* Moves every async request of h forward without blocking and marks those
 * that finished (done, failed).  Cheap: one curl_multi_perform. */
void fb_http_pump(struct fb_http *h);

/* Waits up to timeout_ms for data on h's async requests or for wake_fd
 * (if >= 0) to become readable, then pumps. */
void fb_http_poll(struct fb_http *h, int wake_fd, int timeout_ms);

/* Like fb_http_pump, but waits up to timeout_ms until a->done. */
void fb_http_async_wait(struct fb_http *h, struct fb_http_async *a,
                        long timeout_ms);

/* The contract's error for a transfer that failed (a->failed), naming
 * what was asked; sets fiber_last_error() and returns the code. */
int fb_http_async_error(const struct fb_http *h,
                        const struct fb_http_async *a);

/* Cancels a (if still in flight) and frees what it holds; a is zeroed. */
void fb_http_async_free(struct fb_http *h, struct fb_http_async *a);

#endif /* FB_HTTP_H */
