/*
 * http.c -- the HTTP client of http.h: libcurl on a unix socket or over
 * TLS, jansson for the JSON, and the error contract written in http.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <sodium.h>

#include "backend/http/http.h"
#include "base/common.h"

/* ---- handles ------------------------------------------------------------- */

static int open_common(struct fb_http *h)
{
    int rc = fb_curl_load();
    if (rc)
        return rc;
    h->easy = curl_easy_init();
    h->multi = curl_multi_init();
    if (!h->easy || !h->multi) {
        fb_http_close(h);
        return fb_err(FIBER_ENOMEM, "out of memory starting libcurl");
    }
    return 0;
}

int fb_http_open_unix(struct fb_http *h, const char *name,
                      const char *socket_path)
{
    memset(h, 0, sizeof *h);
    fb_strlcpy(h->name, name, sizeof h->name);
    if (strlen(socket_path) >= sizeof h->socket_path)
        return fb_err(FIBER_EINVAL, "the socket path of %s, '%.200s', is too "
                                    "long (at most %zu bytes)",
                      name, socket_path, sizeof h->socket_path - 1);
    fb_strlcpy(h->socket_path, socket_path, sizeof h->socket_path);
    fb_strlcpy(h->endpoint, socket_path, sizeof h->endpoint);
    fb_strlcpy(h->base, "http://localhost", sizeof h->base);
    return open_common(h);
}

int fb_http_open_url(struct fb_http *h, const char *name, const char *url,
                     const char *ca_file)
{
    memset(h, 0, sizeof *h);
    fb_strlcpy(h->name, name, sizeof h->name);
    if (strlen(url) >= sizeof h->base ||
        (ca_file && strlen(ca_file) >= sizeof h->ca_file))
        return fb_err(FIBER_EINVAL, "the URL or CA file of %s is too long: "
                                    "%.200s",
                      name, url);
    fb_strlcpy(h->base, url, sizeof h->base);
    fb_strlcpy(h->endpoint, url, sizeof h->endpoint);
    if (ca_file)
        fb_strlcpy(h->ca_file, ca_file, sizeof h->ca_file);
    return open_common(h);
}

int fb_http_clone(struct fb_http *dst, const struct fb_http *src)
{
    *dst = *src;
    dst->easy = NULL;
    dst->multi = NULL;
    return open_common(dst);
}

void fb_http_close(struct fb_http *h)
{
    if (h->easy)
        curl_easy_cleanup(h->easy);
    if (h->multi)
        curl_multi_cleanup(h->multi);
    h->easy = NULL;
    h->multi = NULL;
    sodium_memzero(h->token, sizeof h->token);
}

void fb_http_set_version(struct fb_http *h, const char *version)
{
    snprintf(h->prefix, sizeof h->prefix, "/v%s", version);
}

int fb_http_set_token(struct fb_http *h, const char *token)
{
    if (token && strlen(token) >= sizeof h->token)
        return fb_err(FIBER_EINVAL, "the token for %s is too long", h->name);
    fb_strlcpy(h->token, token ? token : "", sizeof h->token);
    return 0;
}

void fb_http_reply_free(struct fb_http_reply *r)
{
    fiber_buf_free(&r->body);
}

/* ---- the error contract -------------------------------------------------- */

/* "GET /containers/json", without the query (which may be long). */
static void describe_request(const char *method, const char *path, char *buf,
                             size_t size)
{
    const char *q = strchr(path, '?');
    size_t n = q ? (size_t)(q - path) : strlen(path);
    snprintf(buf, size, "%s %.*s", method, (int)(n > 150 ? 150 : n), path);
}

/* Was a connection made (or reused) before the transfer failed? */
static int got_connected(CURL *c)
{
    curl_off_t connect = 0, pretransfer = 0;
    curl_easy_getinfo(c, CURLINFO_CONNECT_TIME_T, &connect);
    curl_easy_getinfo(c, CURLINFO_PRETRANSFER_TIME_T, &pretransfer);
    return connect > 0 || pretransfer > 0;
}

/* The contract's code and message for a transfer that failed with cr
 * before a reply was complete. */
static int transfer_failed(const struct fb_http *h, CURLcode cr, int connected,
                           long os_errno, const char *method,
                           const char *path, long timeout_ms,
                           const char *errbuf)
{
    char what[200];
    describe_request(method, path, what, sizeof what);
    const char *why = errbuf && errbuf[0] ? errbuf : curl_easy_strerror(cr);
    switch (cr) {
    case CURLE_OPERATION_TIMEDOUT:
        if (!connected)
            return fb_err(FIBER_EUNREACHABLE,
                          "cannot reach %s at %s (%s): no connection within "
                          "%ld ms",
                          h->name, h->endpoint, what,
                          FB_HTTP_CONNECT_TIMEOUT_MS);
        return fb_err(FIBER_ETIMEDOUT,
                      "%s at %s did not answer %s within %ld ms", h->name,
                      h->endpoint, what, timeout_ms);
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SSL_CERTPROBLEM:
        return fb_err(FIBER_EAUTH,
                      "cannot talk to %s at %s (%s): TLS verification "
                      "failed: %s; the server's certificate must be signed "
                      "by the CA in %s",
                      h->name, h->endpoint, what, why,
                      h->ca_file[0] ? h->ca_file : "the system's CA bundle");
    case CURLE_WRITE_ERROR:
        return fb_err(FIBER_ENOMEM, "out of memory reading the answer of %s "
                                    "at %s to %s",
                      h->name, h->endpoint, what);
    case CURLE_COULDNT_CONNECT:
        /* curl words a failed connect to a unix socket as if to
         * localhost:80; the socket's errno says more. */
        return fb_err(FIBER_EUNREACHABLE, "cannot reach %s at %s (%s): %s",
                      h->name, h->endpoint, what,
                      os_errno ? strerror((int)os_errno) : why);
    default:
        return fb_err(FIBER_EUNREACHABLE, "cannot reach %s at %s (%s): %s",
                      h->name, h->endpoint, what, why);
    }
}

int fb_http_status_code(long status)
{
    if (status >= 200 && status <= 299)
        return 0;
    if (status == 401 || status == 403)
        return FIBER_EAUTH;
    return status == 404 ? FIBER_ENOKEY : FIBER_EBACKEND;
}

static const char *status_name(long status)
{
    switch (status) {
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return status >= 500 ? "Server Error" : "Error";
    }
}

const char *fb_http_message(const void *body, size_t len, char *buf,
                            size_t size)
{
    json_t *j = len ? json_loadb(body, len, 0, NULL) : NULL;
    const char *m = j ? json_string_value(json_object_get(j, "message")) : NULL;
    if (m) {
        fb_strlcpy(buf, m, size);
    } else {
        size_t n = len < size - 1 ? len : size - 1;
        if (n)
            memcpy(buf, body, n);
        buf[n] = '\0';
    }
    json_decref(j);
    size_t n = strlen(buf);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = '\0';
    return buf;
}

/* A Kubernetes Status object's reason ("Invalid"), unless it only repeats
 * the status's name ("Forbidden" for 403); "" when none. */
static void status_reason(const void *body, size_t len, long status,
                          char *buf, size_t size)
{
    buf[0] = '\0';
    json_t *j = len ? json_loadb(body, len, 0, NULL) : NULL;
    const char *reason = json_string_value(json_object_get(j, "reason"));
    char name[40];
    size_t n = 0;
    for (const char *p = status_name(status); *p && n + 1 < sizeof name; p++)
        if (*p != ' ')
            name[n++] = *p;
    name[n] = '\0';
    if (reason && strcmp(reason, name) != 0)
        fb_strlcpy(buf, reason, size);
    json_decref(j);
}

int fb_http_refused(const struct fb_http *h, int code, const char *what,
                    long status, const void *body, size_t len,
                    const char *hint)
{
    char msg[1024], reason[64];
    fb_http_message(body, len, msg, sizeof msg);
    status_reason(body, len, status, reason, sizeof reason);
    if (!code)
        code = fb_http_status_code(status);
    if (!code)
        code = FIBER_EBACKEND; /* a 2xx the caller did not expect */
    return fb_err(code, "%s was refused by %s at %s (HTTP %ld %s%s%s): %s%s",
                  what, h->name, h->endpoint, status, status_name(status),
                  reason[0] ? ", " : "", reason,
                  msg[0] ? msg : "no reason given", hint ? hint : "");
}

int fb_http_escape(const char *s, char *buf, size_t size)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                    (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' ||
                    *p == '.' || *p == '~';
        if (k + (plain ? 1 : 3) >= size)
            return fb_err(FIBER_EINVAL, "request parameter too long: %.80s",
                          s);
        if (plain) {
            buf[k++] = (char)*p;
        } else {
            buf[k++] = '%';
            buf[k++] = hex[*p >> 4];
            buf[k++] = hex[*p & 15];
        }
    }
    if (k >= size)
        return fb_err(FIBER_EINVAL, "request parameter too long");
    buf[k] = '\0';
    return 0;
}

/* ---- shared set-up ------------------------------------------------------- */

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    fiber_buf *b = ud;
    return fiber_buf_append(b, p, size * n) == 0 ? size * n : 0;
}

/* Sets what every request needs: the URL, the transport, the method, and
 * an empty body for a POST without one. */
static int set_request(CURL *c, const struct fb_http *h, const char *method,
                       const char *path, const void *body, size_t len,
                       char *errbuf)
{
    char url[4096];
    int n = snprintf(url, sizeof url, "%s%s%s", h->base, h->prefix, path);
    if (n < 0 || (size_t)n >= sizeof url)
        return fb_err(FIBER_EINVAL, "request path is too long: %.80s", path);
    errbuf[0] = '\0';
    CURLcode rc = curl_easy_setopt(c, CURLOPT_URL, url);
    if (rc == CURLE_OK && h->socket_path[0])
        rc = curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, h->socket_path);
    if (rc == CURLE_OK && h->ca_file[0])
        rc = curl_easy_setopt(c, CURLOPT_CAINFO, h->ca_file);
    if (rc == CURLE_OK)
        rc = curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
    if (rc == CURLE_OK)
        rc = curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
    if (rc == CURLE_OK)
        rc = curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (rc == CURLE_OK)
        rc = curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                              FB_HTTP_CONNECT_TIMEOUT_MS);
    if (rc == CURLE_OK)
        rc = curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    if (rc == CURLE_OK && strcmp(method, "GET") == 0) {
        rc = curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    } else if (rc == CURLE_OK && strcmp(method, "HEAD") == 0) {
        rc = curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (rc == CURLE_OK) {
        if (strcmp(method, "POST") != 0)
            rc = curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
        if (rc == CURLE_OK && (body || strcmp(method, "POST") == 0)) {
            rc = curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE,
                                  (curl_off_t)len);
            if (rc == CURLE_OK)
                rc = curl_easy_setopt(c, CURLOPT_POSTFIELDS,
                                      body ? body : "");
        }
    }
    if (rc != CURLE_OK)
        return fb_err(FIBER_ENOMEM, "cannot set up a request: %s",
                      curl_easy_strerror(rc));
    return 0;
}

/* The headers every request sends: no "Expect: 100-continue" (it costs a
 * round trip for large bodies), JSON accepted, the token, and the body's
 * content type. */
static struct curl_slist *request_headers(const struct fb_http *h,
                                          const char *ctype)
{
    char line[sizeof h->token + 32];
    struct curl_slist *l = curl_slist_append(NULL, "Expect:");
    struct curl_slist *m = l ? curl_slist_append(l, "Accept: application/json")
                             : NULL;
    if (m && h->token[0]) {
        snprintf(line, sizeof line, "Authorization: Bearer %s", h->token);
        m = curl_slist_append(m, line);
        sodium_memzero(line, sizeof line);
    }
    if (m && ctype) {
        snprintf(line, sizeof line, "Content-Type: %s", ctype);
        m = curl_slist_append(m, line);
    }
    if (!m && l)
        curl_slist_free_all(l);
    return m ? l : NULL;
}

/* ---- synchronous requests ------------------------------------------------ */

static size_t on_sync_header(char *p, size_t size, size_t n, void *ud)
{
    struct fb_http_reply *r = ud;
    size_t len = size * n;
    static const char name[] = "api-version:";
    if (len > sizeof name - 1 && strncasecmp(p, name, sizeof name - 1) == 0) {
        size_t i = sizeof name - 1, k = 0;
        while (i < len && (p[i] == ' ' || p[i] == '\t'))
            i++;
        while (i < len && p[i] != '\r' && p[i] != '\n' &&
               k + 1 < sizeof r->api_version)
            r->api_version[k++] = p[i++];
        r->api_version[k] = '\0';
    }
    return len;
}

/* Runs the transfer set up on h->easy; applies the contract. */
static int perform(struct fb_http *h, const char *method, const char *path,
                   long timeout_ms)
{
    CURL *c = h->easy;
    CURLcode cr = curl_easy_perform(c);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, NULL);
    h->os_errno = 0;
    if (cr == CURLE_OK)
        return 0;
    curl_easy_getinfo(c, CURLINFO_OS_ERRNO, &h->os_errno);
    return transfer_failed(h, cr, got_connected(c), h->os_errno, method,
                           path, timeout_ms, h->error);
}

int fb_http_request(struct fb_http *h, const char *method, const char *path,
                    const void *body, size_t len, const char *ctype,
                    long timeout_ms, struct fb_http_reply *r)
{
    memset(r, 0, sizeof *r);
    CURL *c = h->easy;
    curl_easy_reset(c); /* options only: the connection is kept */
    int rc = set_request(c, h, method, path, body, len, h->error);
    if (rc)
        return rc;
    struct curl_slist *headers = request_headers(h, body ? ctype : NULL);
    if (!headers)
        return fb_err(FIBER_ENOMEM, "out of memory building a request");
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    if (timeout_ms > 0)
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r->body);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_sync_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    rc = perform(h, method, path, timeout_ms);
    curl_slist_free_all(headers);
    if (rc == 0)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    return rc;
}

/* Sends body (NULL: none) as JSON; the reply in *r (the caller frees
 * it whatever the result). */
static int send_json(struct fb_http *h, const char *method, const char *path,
                     json_t *body, long timeout_ms, struct fb_http_reply *r)
{
    char *text = NULL;
    memset(r, 0, sizeof *r);
    if (body && !(text = json_dumps(body, JSON_COMPACT)))
        return fb_err(FIBER_ENOMEM, "out of memory encoding a request");
    int rc = fb_http_request(h, method, path, text, text ? strlen(text) : 0,
                             "application/json", timeout_ms, r);
    free(text);
    return rc;
}

int fb_http_json(struct fb_http *h, const char *method, const char *path,
                 json_t *body, long timeout_ms, long *status, json_t **out)
{
    if (out)
        *out = NULL;
    struct fb_http_reply r;
    int rc = send_json(h, method, path, body, timeout_ms, &r);
    if (rc == 0) {
        *status = r.status;
        if (out && r.body.len)
            *out = json_loadb((const char *)r.body.data, r.body.len, 0, NULL);
    }
    fb_http_reply_free(&r);
    return rc;
}

int fb_http_call(struct fb_http *h, const char *method, const char *path,
                 json_t *body, long timeout_ms, json_t **out,
                 const char *what)
{
    if (out)
        *out = NULL;
    struct fb_http_reply r;
    int rc = send_json(h, method, path, body, timeout_ms, &r);
    if (rc == 0 && fb_http_status_code(r.status))
        rc = fb_http_refused(h, 0, what, r.status, r.body.data, r.body.len,
                             NULL);
    if (rc == 0 && out && r.body.len) {
        json_error_t err;
        *out = json_loadb((const char *)r.body.data, r.body.len, 0, &err);
        if (!*out)
            rc = fb_err(FIBER_EBACKEND, "%s: the answer of %s at %s is not "
                                        "JSON: %s",
                        what, h->name, h->endpoint, err.text);
    }
    fb_http_reply_free(&r);
    return rc;
}

/* ---- streamed replies ---------------------------------------------------- */

struct stream_state {
    CURL *curl;
    fb_http_sink sink;
    void *ud;
    int sink_rc;
    long status;       /* 0 until the first piece of the body */
    fiber_buf error_body;
};

static size_t on_stream_body(char *p, size_t size, size_t n, void *ud)
{
    struct stream_state *s = ud;
    size_t len = size * n;
    if (!s->status)
        curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &s->status);
    if (fb_http_status_code(s->status))
        return on_body(p, size, n, &s->error_body);
    s->sink_rc = s->sink(s->ud, p, len);
    return s->sink_rc ? 0 : len;
}

int fb_http_stream(struct fb_http *h, const char *method, const char *path,
                   long timeout_ms, fb_http_sink sink, void *ud,
                   const char *what)
{
    CURL *c = h->easy;
    curl_easy_reset(c);
    int rc = set_request(c, h, method, path, NULL, 0, h->error);
    if (rc)
        return rc;
    struct curl_slist *headers = request_headers(h, NULL);
    if (!headers)
        return fb_err(FIBER_ENOMEM, "out of memory building a request");
    struct stream_state s = {.curl = c, .sink = sink, .ud = ud};
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    if (timeout_ms > 0)
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_stream_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    rc = perform(h, method, path, timeout_ms);
    curl_slist_free_all(headers);
    if (s.sink_rc) {
        rc = s.sink_rc;
    } else if (rc == 0) {
        long status = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        if (fb_http_status_code(status))
            rc = fb_http_refused(h, 0, what, status, s.error_body.data,
                                 s.error_body.len, NULL);
    }
    fiber_buf_free(&s.error_body);
    return rc;
}

/* ---- long-lived requests ------------------------------------------------- */

/* Notes the status line and the blank line that ends the headers. */
static size_t on_async_header(char *p, size_t size, size_t n, void *ud)
{
    struct fb_http_async *a = ud;
    size_t len = size * n;
    if (len > 9 && strncmp(p, "HTTP/", 5) == 0) {
        const char *sp = memchr(p, ' ', len);
        if (sp)
            a->status = strtol(sp + 1, NULL, 10);
    } else if ((len == 2 && p[0] == '\r' && p[1] == '\n') ||
               (len == 1 && p[0] == '\n')) {
        a->got_headers = 1;
    }
    return len;
}

static size_t on_async_body(char *p, size_t size, size_t n, void *ud)
{
    struct fb_http_async *a = ud;
    size_t len = size * n;
    if (!a->sink || fb_http_status_code(a->status))
        return on_body(p, size, n, &a->body);
    a->sink_rc = a->sink(a->ud, p, len);
    return a->sink_rc ? 0 : len;
}

int fb_http_async_start(struct fb_http *h, struct fb_http_async *a,
                        const char *method, const char *path,
                        fb_http_sink sink, void *ud)
{
    a->sink = sink;
    a->ud = ud;
    fb_strlcpy(a->method, method, sizeof a->method);
    const char *q = strchr(path, '?');
    size_t n = q ? (size_t)(q - path) : strlen(path);
    snprintf(a->path, sizeof a->path, "%.*s", (int)n, path);
    a->easy = curl_easy_init();
    a->headers = request_headers(h, NULL);
    if (!a->easy || !a->headers)
        return fb_err(FIBER_ENOMEM, "out of memory starting a request");
    CURL *c = a->easy;
    int rc = set_request(c, h, method, path, NULL, 0, a->curl_error);
    if (rc)
        return rc;
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, a->headers);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_async_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, a);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_async_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, a);
    curl_easy_setopt(c, CURLOPT_PRIVATE, a);
    /* A dead connection is noticed even if the server says nothing. */
    curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPIDLE, 30L);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPINTVL, 10L);
    if (curl_multi_add_handle(h->multi, c) != CURLM_OK)
        return fb_err(FIBER_ENOMEM, "cannot add a request to libcurl");
    a->in_multi = 1;
    return 0;
}

int fb_http_async_headers(struct fb_http *h, struct fb_http_async *a,
                          long timeout_ms)
{
    uint64_t deadline = fb_deadline_ms((int)timeout_ms);
    for (;;) {
        fb_http_pump(h);
        if (a->got_headers || a->done)
            break;
        int left = fb_ms_left(deadline);
        if (left == 0)
            break;
        curl_multi_poll(h->multi, NULL, 0, left < 50 ? left : 50, NULL);
    }
    if (a->got_headers)
        return 0;
    if (a->failed)
        return fb_http_async_error(h, a);
    char what[200];
    describe_request(a->method, a->path, what, sizeof what);
    if (!got_connected(a->easy))
        return fb_err(FIBER_EUNREACHABLE,
                      "cannot reach %s at %s (%s): no connection within "
                      "%ld ms",
                      h->name, h->endpoint, what, timeout_ms);
    return fb_err(FIBER_ETIMEDOUT, "%s at %s did not answer %s within %ld ms",
                  h->name, h->endpoint, what, timeout_ms);
}

void fb_http_pump(struct fb_http *h)
{
    int running = 0;
    curl_multi_perform(h->multi, &running);
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(h->multi, &left))) {
        if (m->msg != CURLMSG_DONE)
            continue;
        struct fb_http_async *a = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&a);
        CURLcode result = m->data.result;
        curl_multi_remove_handle(h->multi, m->easy_handle);
        if (!a)
            continue;
        a->in_multi = 0;
        a->done = 1;
        if (result != CURLE_OK && !a->sink_rc) {
            a->failed = 1;
            a->result = (int)result;
            if (!a->curl_error[0])
                fb_strlcpy(a->curl_error, curl_easy_strerror(result),
                           sizeof a->curl_error);
        }
        curl_easy_getinfo(a->easy, CURLINFO_RESPONSE_CODE, &a->status);
    }
}

void fb_http_poll(struct fb_http *h, int wake_fd, int timeout_ms)
{
    struct curl_waitfd extra = {.fd = wake_fd, .events = CURL_WAIT_POLLIN};
    curl_multi_poll(h->multi, wake_fd >= 0 ? &extra : NULL,
                    wake_fd >= 0 ? 1u : 0u, timeout_ms, NULL);
    fb_http_pump(h);
}

void fb_http_async_wait(struct fb_http *h, struct fb_http_async *a,
                        long timeout_ms)
{
    uint64_t deadline = fb_deadline_ms((int)timeout_ms);
    for (;;) {
        fb_http_pump(h);
        int left = fb_ms_left(deadline);
        if (a->done || !a->in_multi || left == 0)
            return;
        curl_multi_poll(h->multi, NULL, 0, left < 50 ? left : 50, NULL);
    }
}

int fb_http_async_error(const struct fb_http *h,
                        const struct fb_http_async *a)
{
    long os_errno = 0;
    if (a->easy)
        curl_easy_getinfo(a->easy, CURLINFO_OS_ERRNO, &os_errno);
    return transfer_failed(h, (CURLcode)a->result,
                           a->easy && got_connected(a->easy), os_errno,
                           a->method, a->path, 0, a->curl_error);
}

void fb_http_async_free(struct fb_http *h, struct fb_http_async *a)
{
    if (a->easy) {
        if (a->in_multi)
            curl_multi_remove_handle(h->multi, a->easy);
        curl_easy_cleanup(a->easy);
    }
    if (a->headers)
        curl_slist_free_all(a->headers);
    fiber_buf_free(&a->body);
    memset(a, 0, sizeof *a);
}
