/*
 * k8s_api.h -- a small client of the Kubernetes REST API: where the API
 * server is and how to prove who we are (in-cluster service account, or
 * an explicit server, token and CA), synchronous requests, watch streams,
 * and errors that say what the server refused and why.
 *
 * The HTTP layer (backend/http/http.h) moves the bytes over TLS, always
 * verified against the cluster's CA, with the bearer token; its error
 * contract holds here: FIBER_EUNREACHABLE (no connection), FIBER_ETIMEDOUT
 * (no answer in time), FIBER_EAUTH (TLS verification failed); a refusal
 * (fb_k8s_refused) FIBER_EAUTH for 401/403, FIBER_ENOKEY for 404, else
 * FIBER_EBACKEND, unless the caller names its own code.  What is the
 * Kubernetes API's own is here: finding the server, token and CA, the
 * token's rotation, the Status object's hints, and watches (a stream of
 * JSON lines).
 *
 * Threads: a struct fb_k8s (one curl handle) belongs to one thread at a
 * time; fb_k8s_clone() makes another for a second thread.  No thread is
 * started here.
 */
#ifndef FB_K8S_API_H
#define FB_K8S_API_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "backend/http/http.h"

#include "fiber/fiber.h"
#include "runtime/config.h"

#define FB_K8S_SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"

struct fb_k8s {
    struct fb_http http;   /* "the Kubernetes API server" at server */
    char server[300];      /* "https://10.96.0.1:443", no trailing slash */
    char ca_file[512];     /* "" = the system's CA bundle */
    char token_file[512];  /* "" = no token */
    char ns[64];           /* the namespace jobs go to */
    int in_cluster;        /* configured from the service-account folder */
    uint64_t token_read_ms; /* the token (in http) is re-read every minute */
};

/* Works out the server, token, CA and namespace from the configuration:
 * with k8s_server set, explicit (k8s_token_file, k8s_ca_file, with the
 * service-account folder k8s_config_dir as fallback for what is unset);
 * without, in-cluster (KUBERNETES_SERVICE_HOST/PORT and the folder's
 * token, ca.crt and namespace).  k8s_namespace overrides the folder's
 * namespace; "default" is the last resort.  Loads libcurl.  Returns 0 or
 * FIBER_ECONFIG / FIBER_ENOTSUP / FIBER_ENOMEM with a message saying what
 * is missing and what to set.  Does not contact the server. */
int fb_k8s_open(struct fb_k8s *k, const struct fb_config *cfg);

/* Another handle to the same server, for another thread.  Returns 0 or
 * FIBER_ENOMEM. */
int fb_k8s_clone(struct fb_k8s *dst, const struct fb_k8s *src);

/* Releases k; a zeroed k is fine. */
void fb_k8s_close(struct fb_k8s *k);

/* Sends method path (already URL-encoded, starting with "/api") with body
 * (len bytes of content type ctype; may be NULL) and waits up to
 * timeout_ms for the whole reply: *status and the body in *reply (the
 * caller frees it, whatever the result).  Returns 0 when the server
 * answered, whatever the status; else the contract's code
 * (FIBER_EUNREACHABLE, FIBER_ETIMEDOUT, FIBER_EAUTH for a certificate that
 * did not verify) with a message naming the server and what to check. */
int fb_k8s_request(struct fb_k8s *k, const char *method, const char *path,
                   const char *ctype, const void *body, size_t len,
                   long timeout_ms, long *status, fiber_buf *reply);

/* fb_k8s_request with a JSON body (NULL: none; sent as ctype, default
 * application/json) and a JSON reply in *out (NULL if empty or not JSON;
 * the caller json_decref()s it; on a status >= 300 it is the server's
 * Status object, for fb_k8s_refused).  Returns as fb_k8s_request. */
int fb_k8s_json(struct fb_k8s *k, const char *method, const char *path,
                json_t *body, const char *ctype, long timeout_ms,
                long *status, json_t **out);

/* Makes the message for a request the server refused: what was asked
 * (`what`, "creating pod x"), the status and its name, the server's own
 * reason (the Status object's message, or the body), and what to check
 * (401: the token; 403: the rights in the namespace; 422: the spec...).
 * code FIBER_EBACKEND (or 0) means the HTTP layer's code for the status
 * (fb_http_status_code: FIBER_EAUTH for 401 and 403, FIBER_ENOKEY for
 * 404, else FIBER_EBACKEND); any other code is used as given (create:
 * FIBER_ESPAWN).  Sets fiber_last_error() and returns the code. */
int fb_k8s_refused(const struct fb_k8s *k, int code, const char *what,
                   long status, json_t *reply);

/* The Status object's message in reply (or "" when there is none). */
const char *fb_k8s_status_message(json_t *reply);

/* A watch: a long-lived GET whose body is one JSON event a line
 * ({"type": "ADDED", "object": {...}}).  Driven without blocking by
 * fb_k8s_watch_pump.  Zero it before start; it must not move while
 * running. */
typedef void (*fb_k8s_event_fn)(void *ud, const char *type, json_t *object);

struct fb_k8s_watch {
    struct fb_http http;     /* a handle of its own (fb_http_clone) */
    struct fb_http_async a;
    fb_k8s_event_fn on_event;
    void *ud;
    fiber_buf line;  /* a line not yet complete (on_event NULL: the body) */
    fiber_buf error_body; /* the body of a non-2xx answer, once done */
    long status;     /* once known */
    int done;        /* the stream ended (the server closed it, or failed) */
    int failed;      /* the transfer broke: curl_error says why */
    char curl_error[CURL_ERROR_SIZE];
};

/* Starts watching path (which must carry watch=1); does not wait.
 * With on_event NULL the request is an ordinary GET whose whole body
 * collects in w->line (a list that a thread must be able to abandon at
 * once).  Returns 0 or FIBER_ENOMEM. */
int fb_k8s_watch_start(struct fb_k8s *k, struct fb_k8s_watch *w,
                       const char *path, fb_k8s_event_fn on_event, void *ud);

/* Moves the watch forward, waiting up to timeout_ms for data or for
 * wake_fd (if >= 0) to become readable, and calls on_event for every
 * complete line.  Returns 1 once the stream has ended (w->done), else 0. */
int fb_k8s_watch_pump(struct fb_k8s_watch *w, int wake_fd, int timeout_ms);

/* Stops the watch (if running) and frees what it holds; w is zeroed. */
void fb_k8s_watch_free(struct fb_k8s_watch *w);

/* Turns s into a DNS-1123 label part: lower case, [a-z0-9-], at most
 * size-1 bytes.  Returns buf. */
char *fb_k8s_dns_name(const char *s, char *buf, size_t size);

#endif /* FB_K8S_API_H */
