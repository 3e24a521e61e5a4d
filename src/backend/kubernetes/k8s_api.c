/*
 * k8s_api.c -- the Kubernetes REST API client of k8s_api.h.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "backend/kubernetes/k8s_api.h"
#include "base/common.h"

#define SERVER_NAME "the Kubernetes API server"
#define TOKEN_REREAD_MS 60000u /* service-account tokens are rotated */

/* ---- configuration ------------------------------------------------------- */

/* Reads a small text file into buf without its trailing white space.
 * Returns 0, or -1 with errno set (E2BIG if it does not fit). */
static int read_text(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t got = 0;
    for (;;) {
        ssize_t n = read(fd, buf + got, size - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
        if (n == 0)
            break;
        got += (size_t)n;
        if (got == size - 1) {
            char extra;
            if (read(fd, &extra, 1) == 1) {
                close(fd);
                errno = E2BIG;
                return -1;
            }
            break;
        }
    }
    close(fd);
    while (got > 0 && isspace((unsigned char)buf[got - 1]))
        got--;
    buf[got] = '\0';
    return 0;
}

static int readable(const char *path) { return access(path, R_OK) == 0; }

/* Loads (or re-loads, once a minute) the bearer token. */
static int load_token(struct fb_k8s *k, int force)
{
    if (!k->token_file[0])
        return 0;
    uint64_t now = fb_now_ms();
    if (!force && k->http.token[0] && now - k->token_read_ms < TOKEN_REREAD_MS)
        return 0;
    char token[sizeof k->http.token];
    if (read_text(k->token_file, token, sizeof token) != 0)
        return fb_err_errno(FIBER_ECONFIG,
                            "cannot read the Kubernetes token file %s "
                            "(k8s_token_file, or token in k8s_config_dir)",
                            k->token_file);
    if (!token[0])
        return fb_err(FIBER_ECONFIG, "the Kubernetes token file %s is empty",
                      k->token_file);
    for (const char *p = token; *p; p++)
        if (*p < 0x21 || *p > 0x7e)
            return fb_err(FIBER_ECONFIG,
                          "the Kubernetes token file %s holds more than one "
                          "token (white space or control characters)",
                          k->token_file);
    int rc = fb_http_set_token(&k->http, token);
    sodium_memzero(token, sizeof token);
    k->token_read_ms = now;
    return rc;
}

/* Is the host of an http:// URL this machine (kubectl proxy)? */
static int loopback_url(const char *url)
{
    const char *h = url + strlen("http://");
    return strncmp(h, "127.", 4) == 0 || strncmp(h, "localhost", 9) == 0 ||
           strncmp(h, "[::1]", 5) == 0;
}

static int set_server(struct fb_k8s *k, const struct fb_config *cfg)
{
    const char *dir = cfg->k8s_config_dir;
    if (cfg->k8s_server[0]) {
        const char *s = cfg->k8s_server;
        if (strncmp(s, "https://", 8) != 0 &&
            !(strncmp(s, "http://", 7) == 0 && loopback_url(s)))
            return fb_err(FIBER_ECONFIG,
                          "k8s_server '%s' is not an https:// URL (plain "
                          "http is accepted only on this host, for kubectl "
                          "proxy)",
                          s);
        fb_strlcpy(k->server, s, sizeof k->server);
        size_t n = strlen(k->server);
        while (n > 0 && k->server[n - 1] == '/')
            k->server[--n] = '\0';
        return 0;
    }
    const char *host = getenv("KUBERNETES_SERVICE_HOST");
    const char *port = getenv("KUBERNETES_SERVICE_PORT");
    if (!host || !host[0])
        return fb_err(FIBER_ECONFIG,
                      "the kubernetes backend has no API server: set "
                      "k8s_server (with k8s_token_file and k8s_ca_file), or "
                      "run inside a cluster (KUBERNETES_SERVICE_HOST is "
                      "unset here; the service account is read from %s)",
                      dir);
    k->in_cluster = 1;
    snprintf(k->server, sizeof k->server, strchr(host, ':') ? "https://[%s]:%s"
                                                            : "https://%s:%s",
             host, port && port[0] ? port : "443");
    return 0;
}

int fb_k8s_open(struct fb_k8s *k, const struct fb_config *cfg)
{
    memset(k, 0, sizeof *k);
    int rc = set_server(k, cfg);
    if (rc)
        return rc;
    const char *dir = cfg->k8s_config_dir;
    char path[600];
    /* The token: explicit file, else the folder's (required in-cluster). */
    snprintf(path, sizeof path, "%s/token", dir);
    if (cfg->k8s_token_file[0])
        fb_strlcpy(k->token_file, cfg->k8s_token_file, sizeof k->token_file);
    else if (k->in_cluster || readable(path))
        fb_strlcpy(k->token_file, path, sizeof k->token_file);
    /* The CA: explicit, else the folder's, else the system's bundle. */
    snprintf(path, sizeof path, "%s/ca.crt", dir);
    if (cfg->k8s_ca_file[0]) {
        if (!readable(cfg->k8s_ca_file))
            return fb_err_errno(FIBER_ECONFIG,
                                "cannot read the Kubernetes CA file %s "
                                "(k8s_ca_file)",
                                cfg->k8s_ca_file);
        fb_strlcpy(k->ca_file, cfg->k8s_ca_file, sizeof k->ca_file);
    } else if (readable(path)) {
        fb_strlcpy(k->ca_file, path, sizeof k->ca_file);
    } else if (k->in_cluster) {
        return fb_err_errno(FIBER_ECONFIG,
                            "cannot read the cluster's CA certificate %s "
                            "(in-cluster configuration; set k8s_config_dir "
                            "or k8s_ca_file)",
                            path);
    }
    /* The namespace: explicit, else the folder's, else "default". */
    snprintf(path, sizeof path, "%s/namespace", dir);
    if (cfg->k8s_namespace[0])
        fb_strlcpy(k->ns, cfg->k8s_namespace, sizeof k->ns);
    else if (read_text(path, k->ns, sizeof k->ns) != 0 || !k->ns[0])
        fb_strlcpy(k->ns, "default", sizeof k->ns);
    rc = fb_http_open_url(&k->http, SERVER_NAME, k->server, k->ca_file);
    if (rc == 0 && (rc = load_token(k, 1)) != 0)
        fb_http_close(&k->http);
    return rc;
}

int fb_k8s_clone(struct fb_k8s *dst, const struct fb_k8s *src)
{
    *dst = *src;
    return fb_http_clone(&dst->http, &src->http);
}

void fb_k8s_close(struct fb_k8s *k)
{
    fb_http_close(&k->http);
}

/* ---- requests ------------------------------------------------------------ */

/* Adds what to check to a transfer failure of the HTTP layer. */
static int with_hint(const struct fb_k8s *k, int rc)
{
    char why[1200];
    fb_strlcpy(why, fiber_last_error(), sizeof why);
    if (rc == FIBER_EAUTH)
        return fb_err(rc, "%s (k8s_ca_file, or ca.crt in k8s_config_dir)",
                      why);
    if (rc == FIBER_EUNREACHABLE)
        return fb_err(rc, "%s; is k8s_server right (%s) and the server up?",
                      why, k->server);
    return rc;
}

int fb_k8s_request(struct fb_k8s *k, const char *method, const char *path,
                   const char *ctype, const void *body, size_t len,
                   long timeout_ms, long *status, fiber_buf *reply)
{
    *status = 0;
    int rc = load_token(k, 0);
    if (rc)
        return rc;
    struct fb_http_reply r;
    rc = fb_http_request(&k->http, method, path, body, len, ctype,
                         timeout_ms, &r);
    if (rc == 0) {
        *status = r.status;
        /* The body moves to the caller's buffer, as received. */
        if (reply->len == 0) {
            fiber_buf_free(reply);
            *reply = r.body;
            memset(&r.body, 0, sizeof r.body);
        } else if (fiber_buf_append(reply, r.body.data, r.body.len) != 0) {
            rc = fb_err(FIBER_ENOMEM, "out of memory reading a reply");
        }
    } else {
        rc = with_hint(k, rc);
    }
    fb_http_reply_free(&r);
    return rc;
}

int fb_k8s_json(struct fb_k8s *k, const char *method, const char *path,
                json_t *body, const char *ctype, long timeout_ms,
                long *status, json_t **out)
{
    char *text = NULL;
    if (out)
        *out = NULL;
    if (body && !(text = json_dumps(body, JSON_COMPACT)))
        return fb_err(FIBER_ENOMEM, "out of memory encoding a request");
    fiber_buf reply = {0};
    int rc = fb_k8s_request(k, method, path,
                            ctype ? ctype : "application/json", text,
                            text ? strlen(text) : 0, timeout_ms, status,
                            &reply);
    free(text);
    if (rc == 0 && out && reply.len)
        *out = json_loadb((const char *)reply.data, reply.len, 0, NULL);
    if (rc == 0 && out && !*out && reply.len && *status >= 300) {
        /* Not JSON (a proxy's page): keep the text as the message. */
        *out = json_pack("{s:s%}", "message", (const char *)reply.data,
                         reply.len < 300 ? reply.len : (size_t)300);
    }
    fiber_buf_free(&reply);
    return rc;
}

const char *fb_k8s_status_message(json_t *reply)
{
    const char *m = json_string_value(json_object_get(reply, "message"));
    return m ? m : "";
}

int fb_k8s_refused(const struct fb_k8s *k, int code, const char *what,
                   long status, json_t *reply)
{
    char hint[700] = "";
    if (status == 401)
        snprintf(hint, sizeof hint,
                 "; the server does not accept the token of %s: is it this "
                 "cluster's, and still valid? (k8s_token_file, or token in "
                 "k8s_config_dir)",
                 k->token_file[0] ? k->token_file : "(none: no token is set)");
    else if (status == 403)
        snprintf(hint, sizeof hint,
                 "; the account lacks that right in namespace '%s': grant "
                 "it with a Role and RoleBinding (pods, pods/log, secrets), "
                 "or set k8s_namespace to one where it has them",
                 k->ns);
    else if (status == 404)
        snprintf(hint, sizeof hint,
                 "; it does not exist (nor, perhaps, namespace '%s')",
                 k->ns);
    else if (status == 409)
        snprintf(hint, sizeof hint, "; an object of that name exists");
    else if (status == 422)
        snprintf(hint, sizeof hint,
                 "; the server found the object invalid: check the job's "
                 "options, image and k8s_volumes");
    else if (status >= 500)
        snprintf(hint, sizeof hint,
                 "; the API server failed: try again, or see its logs");
    char *text = reply ? json_dumps(reply, JSON_COMPACT) : NULL;
    int rc = fb_http_refused(&k->http, code == FIBER_EBACKEND ? 0 : code,
                             what, status, text, text ? strlen(text) : 0,
                             hint);
    free(text);
    return rc;
}

/* ---- watches ------------------------------------------------------------- */

/* Hands every complete line of w->line to on_event and keeps the rest. */
static void split_lines(struct fb_k8s_watch *w)
{
    unsigned char *p = w->line.data;
    size_t start = 0;
    for (size_t i = 0; i < w->line.len; i++) {
        if (p[i] != '\n')
            continue;
        if (i > start) {
            json_t *ev = json_loadb((const char *)p + start, i - start, 0,
                                    NULL);
            const char *type = json_string_value(json_object_get(ev, "type"));
            json_t *obj = json_object_get(ev, "object");
            if (type && obj)
                w->on_event(w->ud, type, obj);
            json_decref(ev);
        }
        start = i + 1;
    }
    if (start > 0) {
        memmove(p, p + start, w->line.len - start);
        w->line.len -= start;
    }
}

/* The body of a 2xx answer, as it arrives. */
static int on_watch_body(void *ud, const void *data, size_t len)
{
    struct fb_k8s_watch *w = ud;
    if (fiber_buf_append(&w->line, data, len) != 0)
        return FIBER_ENOMEM;
    if (w->on_event)
        split_lines(w);
    return 0;
}

int fb_k8s_watch_start(struct fb_k8s *k, struct fb_k8s_watch *w,
                       const char *path, fb_k8s_event_fn on_event, void *ud)
{
    int rc = load_token(k, 0);
    if (rc)
        return rc;
    w->on_event = on_event;
    w->ud = ud;
    rc = fb_http_clone(&w->http, &k->http);
    if (rc == 0)
        rc = fb_http_async_start(&w->http, &w->a, "GET", path, on_watch_body,
                                 w);
    return rc;
}

int fb_k8s_watch_pump(struct fb_k8s_watch *w, int wake_fd, int timeout_ms)
{
    if (w->done)
        return 1;
    fb_http_poll(&w->http, wake_fd, timeout_ms);
    w->status = w->a.status;
    if (w->a.done) {
        w->done = 1;
        w->failed = w->a.failed;
        fb_strlcpy(w->curl_error, w->a.curl_error, sizeof w->curl_error);
        fiber_buf_free(&w->error_body);
        w->error_body = w->a.body; /* a non-2xx answer's body */
        memset(&w->a.body, 0, sizeof w->a.body);
    }
    return w->done;
}

void fb_k8s_watch_free(struct fb_k8s_watch *w)
{
    if (w->http.multi)
        fb_http_async_free(&w->http, &w->a);
    fb_http_close(&w->http);
    fiber_buf_free(&w->line);
    fiber_buf_free(&w->error_body);
    memset(w, 0, sizeof *w);
}

/* ---- names --------------------------------------------------------------- */

char *fb_k8s_dns_name(const char *s, char *buf, size_t size)
{
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && k + 1 < size;
         p++) {
        char c = (char)tolower(*p);
        if (!isalnum((unsigned char)c))
            c = '-';
        if (c == '-' && (k == 0 || buf[k - 1] == '-'))
            continue; /* no leading or doubled dashes */
        buf[k++] = c;
    }
    while (k > 0 && buf[k - 1] == '-')
        k--;
    buf[k] = '\0';
    return buf;
}
