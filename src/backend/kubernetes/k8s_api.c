/*
 * k8s_api.c -- the Kubernetes REST API client of k8s_api.h.
 */
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "backend/kubernetes/k8s_api.h"
#include "core/common.h"

#define CONNECT_TIMEOUT_MS 10000L
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
    if (!force && k->token[0] && now - k->token_read_ms < TOKEN_REREAD_MS)
        return 0;
    char token[sizeof k->token];
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
    memcpy(k->token, token, sizeof token);
    k->token_read_ms = now;
    return 0;
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

static void openssl_init_once(void)
{
    void *lib = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return;
    int (*init)(uint64_t, const void *);
    void *sym = dlsym(lib, "OPENSSL_init_crypto");
    if (!sym)
        return;
    memcpy(&init, &sym, sizeof init);
    init(0x00080000ull /* OPENSSL_INIT_NO_ATEXIT */, NULL);
    /* lib stays loaded: libcurl uses it. */
}

/* libcurl's TLS library, OpenSSL 3, cleans itself up in an atexit handler
 * that it registers when libcurl first initialises: after fiber_init
 * registered fiber_shutdown, so at exit OpenSSL is torn down first, and
 * fiber_shutdown's requests (deleting the run's pods and Secret) and the
 * pod watcher would run on a dead OpenSSL and crash.  Initialising OpenSSL
 * before libcurl with OPENSSL_INIT_NO_ATEXIT (its documented purpose)
 * leaves the cleanup to the kernel.  Nothing happens if libcurl uses
 * another TLS library or was initialised already. */
static void openssl_without_atexit(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, openssl_init_once);
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
    rc = load_token(k, 1);
    if (rc == 0) {
        openssl_without_atexit();
        rc = fb_curl_load();
    }
    if (rc == 0 && !(k->easy = curl_easy_init()))
        rc = fb_err(FIBER_ENOMEM, "out of memory starting libcurl");
    return rc;
}

int fb_k8s_clone(struct fb_k8s *dst, const struct fb_k8s *src)
{
    *dst = *src;
    dst->easy = curl_easy_init();
    if (!dst->easy)
        return fb_err(FIBER_ENOMEM, "out of memory starting libcurl");
    return 0;
}

void fb_k8s_close(struct fb_k8s *k)
{
    if (k->easy)
        curl_easy_cleanup(k->easy);
    k->easy = NULL;
    sodium_memzero(k->token, sizeof k->token);
}

/* ---- requests ------------------------------------------------------------ */

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    return fiber_buf_append(ud, p, size * n) == 0 ? size * n : 0;
}

/* The headers of every request: the token, JSON, no 100-continue. */
static struct curl_slist *headers_for(struct fb_k8s *k, const char *ctype)
{
    char line[sizeof k->token + 32];
    struct curl_slist *l = curl_slist_append(NULL, "Expect:");
    struct curl_slist *m = l ? curl_slist_append(l, "Accept: application/json")
                             : NULL;
    if (m && k->token[0]) {
        snprintf(line, sizeof line, "Authorization: Bearer %s", k->token);
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

/* What every request sets on its handle. */
static int set_common(struct fb_k8s *k, CURL *c, const char *method,
                      const char *path, char *errbuf)
{
    char url[4096];
    int n = snprintf(url, sizeof url, "%s%s", k->server, path);
    if (n < 0 || (size_t)n >= sizeof url)
        return fb_err(FIBER_EINVAL, "request path is too long: %.80s", path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, CONNECT_TIMEOUT_MS);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
    if (k->ca_file[0])
        curl_easy_setopt(c, CURLOPT_CAINFO, k->ca_file);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    if (strcmp(method, "GET") == 0)
        curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    else
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    return 0;
}

/* The message for a transfer that failed before the server answered. */
static int transfer_failed(const struct fb_k8s *k, CURL *c, CURLcode cr,
                           const char *method, const char *path,
                           long timeout_ms, const char *errbuf)
{
    const char *why = errbuf && errbuf[0] ? errbuf : curl_easy_strerror(cr);
    char what[200];
    const char *q = strchr(path, '?');
    snprintf(what, sizeof what, "%s %.*s", method,
             (int)(q ? (size_t)(q - path) : strlen(path)), path);
    switch (cr) {
    case CURLE_OPERATION_TIMEDOUT:
        return fb_err(FIBER_EUNREACHABLE,
                      "the Kubernetes API server at %s did not answer %s "
                      "within %ld ms",
                      k->server, what, timeout_ms);
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SSL_CERTPROBLEM:
        return fb_err(FIBER_EUNREACHABLE,
                      "cannot talk to the Kubernetes API server at %s (%s): "
                      "TLS verification failed: %s; the server's certificate "
                      "must be signed by the CA in %s (k8s_ca_file, or "
                      "ca.crt in k8s_config_dir)",
                      k->server, what, why,
                      k->ca_file[0] ? k->ca_file : "the system's CA bundle");
    case CURLE_COULDNT_CONNECT: {
        long os_errno = 0;
        curl_easy_getinfo(c, CURLINFO_OS_ERRNO, &os_errno);
        return fb_err(FIBER_EUNREACHABLE,
                      "cannot reach the Kubernetes API server at %s (%s): "
                      "%s; is k8s_server right and the server up?",
                      k->server, what, os_errno ? strerror((int)os_errno) : why);
    }
    default:
        return fb_err(FIBER_EUNREACHABLE,
                      "cannot reach the Kubernetes API server at %s (%s): %s",
                      k->server, what, why);
    }
}

int fb_k8s_request(struct fb_k8s *k, const char *method, const char *path,
                   const char *ctype, const void *body, size_t len,
                   long timeout_ms, long *status, fiber_buf *reply)
{
    *status = 0;
    int rc = load_token(k, 0);
    if (rc)
        return rc;
    CURL *c = k->easy;
    curl_easy_reset(c); /* options only: the connection is kept */
    k->error[0] = '\0';
    if ((rc = set_common(k, c, method, path, k->error)) != 0)
        return rc;
    struct curl_slist *h = headers_for(k, body ? ctype : NULL);
    if (!h)
        return fb_err(FIBER_ENOMEM, "out of memory building a request");
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, reply);
    CURLcode cr = curl_easy_perform(c);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, NULL);
    curl_slist_free_all(h);
    if (cr != CURLE_OK)
        return transfer_failed(k, c, cr, method, path, timeout_ms, k->error);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    return 0;
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

static const char *status_name(long status)
{
    switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return status >= 500 ? "Server Error" : "Error";
    }
}

int fb_k8s_refused(const struct fb_k8s *k, int code, const char *what,
                   long status, json_t *reply)
{
    const char *msg = fb_k8s_status_message(reply);
    const char *reason = json_string_value(json_object_get(reply, "reason"));
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
    /* The reason, unless it only repeats the status ("Forbidden"). */
    char name[40];
    size_t n = 0;
    for (const char *p = status_name(status); *p && n + 1 < sizeof name; p++)
        if (*p != ' ')
            name[n++] = *p;
    name[n] = '\0';
    if (!reason || strcmp(reason, name) == 0)
        reason = "";
    return fb_err(code,
                  "%s was refused by the Kubernetes API server at %s (HTTP "
                  "%ld %s%s%s): %s%s",
                  what, k->server, status, status_name(status),
                  reason[0] ? ", " : "", reason,
                  msg[0] ? msg : "no reason given", hint);
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

static size_t on_watch_body(char *p, size_t size, size_t n, void *ud)
{
    struct fb_k8s_watch *w = ud;
    size_t len = size * n;
    if (!w->status)
        curl_easy_getinfo(w->easy, CURLINFO_RESPONSE_CODE, &w->status);
    if (w->status != 200)
        return fiber_buf_append(&w->error_body, p, len) == 0 ? len : 0;
    if (fiber_buf_append(&w->line, p, len) != 0)
        return 0;
    if (w->on_event)
        split_lines(w);
    return len;
}

int fb_k8s_watch_start(struct fb_k8s *k, struct fb_k8s_watch *w,
                       const char *path, fb_k8s_event_fn on_event, void *ud)
{
    int rc = load_token(k, 0);
    if (rc)
        return rc;
    w->on_event = on_event;
    w->ud = ud;
    w->easy = curl_easy_init();
    w->multi = curl_multi_init();
    w->headers = headers_for(k, NULL);
    if (!w->easy || !w->multi || !w->headers)
        return fb_err(FIBER_ENOMEM, "out of memory starting a watch");
    if ((rc = set_common(k, w->easy, "GET", path, w->curl_error)) != 0)
        return rc;
    curl_easy_setopt(w->easy, CURLOPT_HTTPHEADER, w->headers);
    curl_easy_setopt(w->easy, CURLOPT_WRITEFUNCTION, on_watch_body);
    curl_easy_setopt(w->easy, CURLOPT_WRITEDATA, w);
    /* A dead connection is noticed even if the server says nothing. */
    curl_easy_setopt(w->easy, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(w->easy, CURLOPT_TCP_KEEPIDLE, 30L);
    curl_easy_setopt(w->easy, CURLOPT_TCP_KEEPINTVL, 10L);
    if (curl_multi_add_handle(w->multi, w->easy) != CURLM_OK)
        return fb_err(FIBER_ENOMEM, "cannot add a watch to libcurl");
    return 0;
}

int fb_k8s_watch_pump(struct fb_k8s_watch *w, int wake_fd, int timeout_ms)
{
    if (w->done)
        return 1;
    struct curl_waitfd extra = {.fd = wake_fd, .events = CURL_WAIT_POLLIN};
    curl_multi_poll(w->multi, wake_fd >= 0 ? &extra : NULL,
                    wake_fd >= 0 ? 1u : 0u, timeout_ms, NULL);
    int running = 0;
    curl_multi_perform(w->multi, &running);
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(w->multi, &left))) {
        if (m->msg != CURLMSG_DONE)
            continue;
        w->done = 1;
        if (m->data.result != CURLE_OK) {
            w->failed = 1;
            if (!w->curl_error[0])
                fb_strlcpy(w->curl_error,
                           curl_easy_strerror(m->data.result),
                           sizeof w->curl_error);
        }
        if (!w->status)
            curl_easy_getinfo(w->easy, CURLINFO_RESPONSE_CODE, &w->status);
    }
    return w->done;
}

void fb_k8s_watch_free(struct fb_k8s_watch *w)
{
    if (w->multi && w->easy)
        curl_multi_remove_handle(w->multi, w->easy);
    if (w->easy)
        curl_easy_cleanup(w->easy);
    if (w->multi)
        curl_multi_cleanup(w->multi);
    if (w->headers)
        curl_slist_free_all(w->headers);
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
