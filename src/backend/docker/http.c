/*
 * http.c -- the Docker Engine API client of http.h: libcurl over the
 * engine's unix socket, jansson for the JSON.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend/docker/http.h"
#include "core/common.h"

#define CONNECT_TIMEOUT_MS 5000L

int fb_http_open(struct fb_http *h, const char *socket_path)
{
    memset(h, 0, sizeof *h);
    if (strlen(socket_path) >= sizeof h->socket_path)
        return fb_err(FIBER_EINVAL, "docker socket path '%.80s' is too long",
                      socket_path);
    fb_strlcpy(h->socket_path, socket_path, sizeof h->socket_path);
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

void fb_http_close(struct fb_http *h)
{
    if (h->easy)
        curl_easy_cleanup(h->easy);
    if (h->multi)
        curl_multi_cleanup(h->multi);
    h->easy = NULL;
    h->multi = NULL;
}

void fb_http_set_version(struct fb_http *h, const char *version)
{
    snprintf(h->prefix, sizeof h->prefix, "/v%s", version);
}

void fb_http_reply_free(struct fb_http_reply *r)
{
    fiber_buf_free(&r->body);
}

/* ---- shared set-up ------------------------------------------------------- */

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    fiber_buf *b = ud;
    return fiber_buf_append(b, p, size * n) == 0 ? size * n : 0;
}

/* Sets what every request needs: the URL on the engine's socket, the
 * method, and an empty body for a POST without one. */
static int set_request(CURL *c, const struct fb_http *h, const char *method,
                       const char *path, const void *body, size_t len)
{
    char url[2048];
    int n = snprintf(url, sizeof url, "http://localhost%s%s", h->prefix, path);
    if (n < 0 || (size_t)n >= sizeof url)
        return fb_err(FIBER_EINVAL, "request path is too long: %.80s", path);
    CURLcode rc = curl_easy_setopt(c, CURLOPT_URL, url);
    if (rc == CURLE_OK)
        rc = curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, h->socket_path);
    if (rc == CURLE_OK)
        rc = curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (rc == CURLE_OK)
        rc = curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, CONNECT_TIMEOUT_MS);
    if (rc == CURLE_OK && strcmp(method, "GET") == 0) {
        rc = curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    } else if (rc == CURLE_OK && strcmp(method, "POST") == 0) {
        rc = curl_easy_setopt(c, CURLOPT_POST, 1L);
        if (rc == CURLE_OK)
            rc = curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE,
                                  (curl_off_t)len);
        if (rc == CURLE_OK)
            rc = curl_easy_setopt(c, CURLOPT_POSTFIELDS, body ? body : "");
    } else if (rc == CURLE_OK && strcmp(method, "HEAD") == 0) {
        rc = curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (rc == CURLE_OK) {
        rc = curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    }
    if (rc != CURLE_OK)
        return fb_err(FIBER_ENOMEM, "cannot set up a request: %s",
                      curl_easy_strerror(rc));
    return 0;
}

/* The headers every request sends: no "Expect: 100-continue" (the engine
 * does not need it and it costs a round trip for large bodies), and the
 * body's content type. */
static struct curl_slist *request_headers(const char *ctype)
{
    struct curl_slist *l = curl_slist_append(NULL, "Expect:");
    if (l && ctype) {
        char line[128];
        snprintf(line, sizeof line, "Content-Type: %s", ctype);
        struct curl_slist *more = curl_slist_append(l, line);
        if (!more) {
            curl_slist_free_all(l);
            return NULL;
        }
        l = more;
    }
    return l;
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

int fb_http_request(struct fb_http *h, const char *method, const char *path,
                    const void *body, size_t len, const char *ctype,
                    long timeout_ms, struct fb_http_reply *r)
{
    memset(r, 0, sizeof *r);
    CURL *c = h->easy;
    curl_easy_reset(c); /* options only: the connection is kept */
    int rc = set_request(c, h, method, path, body, len);
    if (rc)
        return rc;
    struct curl_slist *headers = request_headers(ctype);
    if (!headers)
        return fb_err(FIBER_ENOMEM, "out of memory building a request");
    h->error[0] = '\0';
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, h->error);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r->body);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_sync_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    CURLcode cr = curl_easy_perform(c);
    curl_slist_free_all(headers);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, NULL);
    if (cr == CURLE_OPERATION_TIMEDOUT)
        return fb_err(FIBER_EUNREACHABLE,
                      "the Docker engine at %s did not answer %s %s within "
                      "%ld ms",
                      h->socket_path, method, path, timeout_ms);
    if (cr != CURLE_OK) {
        /* curl words a failed connect as if to localhost:80; the socket's
         * errno says more. */
        long os_errno = 0;
        curl_easy_getinfo(c, CURLINFO_OS_ERRNO, &os_errno);
        return fb_err(FIBER_EUNREACHABLE,
                      "cannot reach the Docker engine at %s (%s %s): %s",
                      h->socket_path, method, path,
                      cr == CURLE_COULDNT_CONNECT && os_errno
                          ? strerror((int)os_errno)
                          : h->error[0] ? h->error : curl_easy_strerror(cr));
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    return 0;
}

int fb_http_json(struct fb_http *h, const char *method, const char *path,
                 json_t *body, long timeout_ms, long *status, json_t **out)
{
    char *text = NULL;
    if (body && !(text = json_dumps(body, JSON_COMPACT)))
        return fb_err(FIBER_ENOMEM, "out of memory encoding a request");
    struct fb_http_reply r;
    int rc = fb_http_request(h, method, path, text, text ? strlen(text) : 0,
                             text ? "application/json" : NULL, timeout_ms, &r);
    free(text);
    if (rc == 0) {
        *status = r.status;
        if (out)
            *out = r.body.len ? json_loadb((const char *)r.body.data,
                                           r.body.len, 0, NULL)
                              : NULL;
    }
    fb_http_reply_free(&r);
    return rc;
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
        memcpy(buf, body, n);
        buf[n] = '\0';
    }
    json_decref(j);
    size_t n = strlen(buf);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = '\0';
    return buf;
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
            return -1;
        if (plain) {
            buf[k++] = (char)*p;
        } else {
            buf[k++] = '%';
            buf[k++] = hex[*p >> 4];
            buf[k++] = hex[*p & 15];
        }
    }
    if (k >= size)
        return -1;
    buf[k] = '\0';
    return 0;
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

int fb_http_async_start(struct fb_http *h, struct fb_http_async *a,
                        const char *method, const char *path,
                        long header_timeout_ms)
{
    a->easy = curl_easy_init();
    a->headers = request_headers(NULL);
    if (!a->easy || !a->headers)
        return fb_err(FIBER_ENOMEM, "out of memory starting a request");
    CURL *c = a->easy;
    int rc = set_request(c, h, method, path, NULL, 0);
    if (rc)
        return rc;
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, a->headers);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, a->curl_error);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &a->body);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_async_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, a);
    curl_easy_setopt(c, CURLOPT_PRIVATE, a);
    if (curl_multi_add_handle(h->multi, c) != CURLM_OK)
        return fb_err(FIBER_ENOMEM, "cannot add a request to libcurl");
    a->in_multi = 1;
    uint64_t deadline = fb_deadline_ms((int)header_timeout_ms);
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
        return fb_err(FIBER_EUNREACHABLE,
                      "cannot reach the Docker engine at %s (%s %s): %s",
                      h->socket_path, method, path, a->curl_error);
    return fb_err(FIBER_EUNREACHABLE,
                  "the Docker engine at %s did not answer %s %s within %ld ms",
                  h->socket_path, method, path, header_timeout_ms);
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
        if (result != CURLE_OK) {
            a->failed = 1;
            if (!a->curl_error[0])
                fb_strlcpy(a->curl_error, curl_easy_strerror(result),
                           sizeof a->curl_error);
        }
        curl_easy_getinfo(a->easy, CURLINFO_RESPONSE_CODE, &a->status);
    }
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

void fb_http_async_free(struct fb_http *h, struct fb_http_async *a)
{
    if (a->easy) {
        if (a->in_multi)
            curl_multi_remove_handle(h->multi, a->easy);
        curl_easy_cleanup(a->easy);
    }
    curl_slist_free_all(a->headers);
    fiber_buf_free(&a->body);
    memset(a, 0, sizeof *a);
}
