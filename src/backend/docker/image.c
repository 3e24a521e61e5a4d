/*
 * image.c -- fiber_image_build(): a minimal container image of a fiber
 * program, imported into the Docker Engine without any registry; and the
 * small Engine client (image.h) that it and the run tools share.
 *
 * The image is FROM scratch and holds exactly: the program, every shared
 * library the dynamic loader resolves for it, the loader itself, the
 * loader's cache (/etc/ld.so.cache) and an empty /tmp (mode 1777).  Each
 * file sits at the same path as on the host, and each symbolic link met on
 * the way to it (Debian's merged /usr: /lib64 -> usr/lib64, /lib ->
 * usr/lib) is recreated, so the program runs in a container exactly as the
 * master runs it on the host: the one-binary model holds.
 *
 * The tar is written in memory (ustar headers, with a pax header when a
 * name does not fit) and sent as the body of POST /images/create?fromSrc=-.
 */
#include <dlfcn.h>
#include <elf.h>
#include <dirent.h>
#include <errno.h>
#include <link.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/docker/curl_dl.h"
#include <sodium.h>

#include "backend/docker/image.h"
#include "core/common.h"

extern char **environ;

#define DEFAULT_DOCKER_SOCKET "/var/run/docker.sock"
#define CONNECT_TIMEOUT_MS 3000L
#define REQUEST_TIMEOUT_MS 60000L
#define IMPORT_TIMEOUT_MS 600000L
#define MAX_SYMLINKS 40

/* ======================================================================
 * The Engine client
 * ====================================================================== */


/* Says why the daemon could not be reached and what to do about it. */
static int unreachable(const struct fb_engine *e, CURLcode res, long os_errno,
                       const char *curl_msg)
{
    const char *what = "set docker_socket (FIBER_DOCKER_SOCKET) to the "
                       "daemon's socket if it listens elsewhere";
    if (res == CURLE_COULDNT_CONNECT && os_errno == ENOENT)
        return fb_err(FIBER_EUNREACHABLE,
                      "cannot reach the Docker Engine at %s: no such socket; "
                      "is dockerd installed and running (systemctl start "
                      "docker)? %s",
                      e->socket, what);
    if (res == CURLE_COULDNT_CONNECT && os_errno == ECONNREFUSED)
        return fb_err(FIBER_EUNREACHABLE,
                      "cannot reach the Docker Engine at %s: connection "
                      "refused, nothing listens there; start dockerd "
                      "(systemctl start docker), or %s",
                      e->socket, what);
    if (res == CURLE_COULDNT_CONNECT && os_errno == EACCES)
        return fb_err(FIBER_EUNREACHABLE,
                      "cannot reach the Docker Engine at %s: permission "
                      "denied; add your user to the docker group (usermod "
                      "-aG docker $USER, then log in again) or run as root",
                      e->socket);
    return fb_err(FIBER_EUNREACHABLE,
                  "cannot talk to the Docker Engine at %s: %s%s%s; %s",
                  e->socket, curl_easy_strerror(res), curl_msg[0] ? ": " : "",
                  curl_msg, what);
}

static size_t write_to_buf(char *p, size_t size, size_t n, void *ud)
{
    fiber_buf *b = ud;
    if (b && fiber_buf_append(b, p, size * n) != 0)
        return 0; /* out of memory: curl stops with CURLE_WRITE_ERROR */
    return size * n;
}

/* Captures the Api-Version header of /_ping. */
static size_t ping_header(char *p, size_t size, size_t n, void *ud)
{
    struct fb_engine *e = ud;
    size_t len = size * n;
    static const char name[] = "api-version:";
    if (len > sizeof name - 1 && strncasecmp(p, name, sizeof name - 1) == 0) {
        size_t i = sizeof name - 1, j = 0;
        while (i < len && (p[i] == ' ' || p[i] == '\t'))
            i++;
        while (i < len && j + 1 < sizeof e->daemon_api &&
               ((p[i] >= '0' && p[i] <= '9') || p[i] == '.'))
            e->daemon_api[j++] = p[i++];
        e->daemon_api[j] = '\0';
    }
    return len;
}

/* Prepares e->curl for one request to path (versioned unless raw). */
static CURL *prepare(struct fb_engine *e, const char *method, const char *path,
                     int raw, long timeout_ms, char *url, size_t url_size,
                     char *errbuf)
{
    CURL *c = e->curl;
    curl_easy_reset(c);
    if (raw)
        snprintf(url, url_size, "http://localhost%s", path);
    else
        snprintf(url, url_size, "http://localhost/v%s%s", e->api, path);
    errbuf[0] = '\0';
    curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, e->socket);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, CONNECT_TIMEOUT_MS);
    if (timeout_ms > 0)
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    return c;
}

static int api_minor(const char *v)
{
    int major = 0, minor = 0;
    if (sscanf(v, "%d.%d", &major, &minor) != 2 || major != 1)
        return -1;
    return minor;
}

int fb_engine_open(struct fb_engine *e)
{
    memset(e, 0, sizeof *e);
    char sock[sizeof e->socket];
    int rc = fiber_config_get("docker_socket", sock, sizeof sock);
    if (rc == FIBER_ECONFIG && strstr(fiber_last_error(), "unknown key"))
        fb_strlcpy(sock, DEFAULT_DOCKER_SOCKET, sizeof sock); /* older build */
    else if (rc != 0)
        return rc;
    if (!sock[0])
        fb_strlcpy(sock, DEFAULT_DOCKER_SOCKET, sizeof sock);
    fb_strlcpy(e->socket, sock, sizeof e->socket);
    rc = fb_curl_load();
    if (rc)
        return rc;
    e->curl = curl_easy_init();
    if (!e->curl)
        return fb_err(FIBER_ENOMEM, "curl_easy_init failed");
    char url[128], errbuf[CURL_ERROR_SIZE];
    CURL *c = prepare(e, "GET", "/_ping", 1, 5000, url, sizeof url, errbuf);
    fiber_buf body = {0};
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, write_to_buf);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, ping_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, e);
    CURLcode res = curl_easy_perform(c);
    long status = 0, os_errno = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(c, CURLINFO_OS_ERRNO, &os_errno);
    fiber_buf_free(&body);
    if (res != CURLE_OK)
        rc = unreachable(e, res, os_errno, errbuf);
    else if (status != 200)
        rc = fb_err(FIBER_EUNREACHABLE,
                    "%s answered /_ping with HTTP %ld: is it a Docker Engine "
                    "socket?",
                    e->socket, status);
    else if (api_minor(e->daemon_api) < 0)
        rc = fb_err(FIBER_EUNREACHABLE,
                    "%s did not say which API version it speaks (no "
                    "Api-Version header on /_ping): is it a Docker Engine?",
                    e->socket);
    if (rc) {
        fb_engine_close(e);
        return rc;
    }
    /* Speak the daemon's version, but no newer than the one these calls
     * were written against: version negotiation as the docker CLI does
     * it, and what keeps an old daemon usable. */
    int daemon = api_minor(e->daemon_api), ours = api_minor(FB_ENGINE_API_MAX);
    fb_strlcpy(e->api, daemon < ours ? e->daemon_api : FB_ENGINE_API_MAX,
               sizeof e->api);
    return 0;
}

void fb_engine_close(struct fb_engine *e)
{
    if (e && e->curl) {
        curl_easy_cleanup(e->curl);
        e->curl = NULL;
    }
}

int fb_engine_request(struct fb_engine *e, const char *method,
                      const char *path, const char *content_type,
                      const void *body, size_t len, fiber_buf *resp,
                      long *status, long timeout_ms)
{
    char url[4096], errbuf[CURL_ERROR_SIZE];
    CURL *c = prepare(e, method, path, 0, timeout_ms, url, sizeof url, errbuf);
    struct curl_slist *headers = NULL;
    char ct[128];
    if (body || strcmp(method, "POST") == 0) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
        snprintf(ct, sizeof ct, "Content-Type: %s",
                 content_type ? content_type : "application/json");
        headers = curl_slist_append(headers, ct);
        headers = curl_slist_append(headers, "Expect:");
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    }
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, write_to_buf);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, resp);
    CURLcode res = curl_easy_perform(c);
    long os_errno = 0;
    *status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    curl_easy_getinfo(c, CURLINFO_OS_ERRNO, &os_errno);
    curl_slist_free_all(headers);
    if (res == CURLE_WRITE_ERROR)
        return fb_err(FIBER_ENOMEM, "out of memory reading the Docker "
                                    "Engine's answer");
    if (res == CURLE_OPERATION_TIMEDOUT)
        return fb_err(FIBER_ETIMEDOUT, "%s %s: no complete answer within "
                                       "%ld ms",
                      method, path, timeout_ms);
    if (res != CURLE_OK)
        return unreachable(e, res, os_errno, errbuf);
    return 0;
}

/* Makes the message for a failed request: the daemon says why in
 * {"message": "..."}. */
static int engine_failure(long status, const fiber_buf *resp, const char *what)
{
    const char *msg = NULL;
    json_t *j = resp->len ? json_loadb((const char *)resp->data, resp->len, 0,
                                       NULL)
                          : NULL;
    if (j)
        msg = json_string_value(json_object_get(j, "message"));
    int code = status == 404 ? FIBER_ENOKEY : FIBER_EBACKEND;
    if (msg)
        fb_err(code, "%s: %s", what, msg);
    else
        fb_err(code, "%s: the Docker Engine answered HTTP %ld %.*s", what,
               status, (int)(resp->len > 200 ? 200 : resp->len),
               resp->len ? (const char *)resp->data : "");
    json_decref(j);
    return code;
}

int fb_engine_json(struct fb_engine *e, const char *method, const char *path,
                   json_t *body, json_t **out, const char *what)
{
    char *text = NULL;
    if (body && !(text = json_dumps(body, JSON_COMPACT)))
        return fb_err(FIBER_ENOMEM, "out of memory encoding a request");
    fiber_buf resp = {0};
    long status;
    int rc = fb_engine_request(e, method, path, "application/json", text,
                               text ? strlen(text) : 0, &resp, &status,
                               REQUEST_TIMEOUT_MS);
    free(text);
    if (rc == 0 && (status < 200 || status > 299))
        rc = engine_failure(status, &resp, what);
    if (rc == 0 && out) {
        *out = NULL;
        if (resp.len) {
            json_error_t err;
            *out = json_loadb((const char *)resp.data, resp.len, 0, &err);
            if (!*out)
                rc = fb_err(FIBER_EBACKEND,
                            "%s: the Docker Engine's answer is not JSON: %s",
                            what, err.text);
        }
    }
    fiber_buf_free(&resp);
    return rc;
}

struct stream_state {
    CURL *curl;
    fb_engine_sink sink;
    void *ud;
    int sink_rc;
    int checked; /* status looked at */
    int failed;  /* status outside 2xx: collect the body for the message */
    fiber_buf error_body;
};

static size_t write_to_sink(char *p, size_t size, size_t n, void *ud)
{
    struct stream_state *s = ud;
    size_t len = size * n;
    if (!s->checked) {
        long status = 0;
        curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &status);
        s->failed = status < 200 || status > 299;
        s->checked = 1;
    }
    if (s->failed)
        return write_to_buf(p, size, n, &s->error_body);
    s->sink_rc = s->sink(s->ud, p, len);
    return s->sink_rc ? 0 : len;
}

int fb_engine_stream(struct fb_engine *e, const char *method,
                     const char *path, fb_engine_sink sink, void *ud,
                     const char *what)
{
    char url[4096], errbuf[CURL_ERROR_SIZE];
    CURL *c = prepare(e, method, path, 0, 0, url, sizeof url, errbuf);
    struct stream_state s = {.curl = c, .sink = sink, .ud = ud};
    if (strcmp(method, "POST") == 0) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
    }
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, write_to_sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    CURLcode res = curl_easy_perform(c);
    long status = 0, os_errno = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(c, CURLINFO_OS_ERRNO, &os_errno);
    int rc = 0;
    if (s.sink_rc)
        rc = s.sink_rc;
    else if (res != CURLE_OK)
        rc = unreachable(e, res, os_errno, errbuf);
    else if (status < 200 || status > 299)
        rc = engine_failure(status, &s.error_body, what);
    fiber_buf_free(&s.error_body);
    return rc;
}

int fb_engine_escape(const char *text, char *out, size_t size)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t j = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        int plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                    (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' ||
                    *p == '.' || *p == '~';
        if (j + (plain ? 1 : 3) >= size)
            return fb_err(FIBER_EINVAL, "request parameter too long");
        if (plain) {
            out[j++] = (char)*p;
        } else {
            out[j++] = '%';
            out[j++] = hex[*p >> 4];
            out[j++] = hex[*p & 15];
        }
    }
    out[j] = '\0';
    return 0;
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

/* ======================================================================
 * The program: ELF facts
 * ====================================================================== */

struct program_info {
    char path[PATH_MAX];   /* absolute, as given (symlinks not resolved) */
    char interp[PATH_MAX]; /* PT_INTERP, or "" for a static program */
    char id[65];           /* GNU build id in hex, or a BLAKE2b of the file */
    int has_build_id;
};

/* Finds NT_GNU_BUILD_ID among the notes in p[0..len). */
static int find_build_id(const unsigned char *p, size_t len, size_t align,
                         char *out, size_t size)
{
    size_t off = 0;
    while (off + sizeof(Elf32_Nhdr) <= len) {
        Elf32_Nhdr nh; /* the same layout in ELF32 and ELF64 */
        memcpy(&nh, p + off, sizeof nh);
        size_t name_off = off + sizeof nh;
        size_t desc_off = name_off + ((nh.n_namesz + align - 1) & ~(align - 1));
        size_t next = desc_off + ((nh.n_descsz + align - 1) & ~(align - 1));
        if (desc_off > len || next > len || next <= off)
            return 0;
        if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
            memcmp(p + name_off, "GNU", 4) == 0 && nh.n_descsz > 0) {
            fb_hex(p + desc_off, nh.n_descsz > 32 ? 32 : nh.n_descsz, out,
                   size);
            return 1;
        }
        off = next;
    }
    return 0;
}

/* One program header, whichever the class. */
struct phdr {
    uint32_t type;
    uint64_t offset, filesz, align;
};

static int read_phdr(const unsigned char *m, size_t size, int is64, size_t i,
                     uint64_t phoff, struct phdr *ph)
{
    if (is64) {
        Elf64_Phdr p;
        if (phoff + (i + 1) * sizeof p > size)
            return -1;
        memcpy(&p, m + phoff + i * sizeof p, sizeof p);
        *ph = (struct phdr){p.p_type, p.p_offset, p.p_filesz, p.p_align};
    } else {
        Elf32_Phdr p;
        if (phoff + (i + 1) * sizeof p > size)
            return -1;
        memcpy(&p, m + phoff + i * sizeof p, sizeof p);
        *ph = (struct phdr){p.p_type, p.p_offset, p.p_filesz, p.p_align};
    }
    return 0;
}

/* Reads PT_INTERP and the build id from the mapped file. */
static int parse_elf(const unsigned char *m, size_t size,
                     struct program_info *pi)
{
    if (size < EI_NIDENT || memcmp(m, ELFMAG, SELFMAG) != 0)
        return fb_err(FIBER_EINVAL,
                      "%s is not an ELF executable: fiber image build packs "
                      "compiled programs (a script would need its "
                      "interpreter)",
                      pi->path);
    int is64 = m[EI_CLASS] == ELFCLASS64;
    uint64_t phoff;
    size_t phnum;
    if (is64 && size >= sizeof(Elf64_Ehdr)) {
        Elf64_Ehdr eh;
        memcpy(&eh, m, sizeof eh);
        phoff = eh.e_phoff;
        phnum = eh.e_phnum;
    } else if (!is64 && m[EI_CLASS] == ELFCLASS32 &&
               size >= sizeof(Elf32_Ehdr)) {
        Elf32_Ehdr eh;
        memcpy(&eh, m, sizeof eh);
        phoff = eh.e_phoff;
        phnum = eh.e_phnum;
    } else {
        return fb_err(FIBER_EINVAL, "%s: truncated or unknown ELF class",
                      pi->path);
    }
    for (size_t i = 0; i < phnum; i++) {
        struct phdr ph;
        if (read_phdr(m, size, is64, i, phoff, &ph) != 0 ||
            ph.offset > size || ph.filesz > size - ph.offset)
            return fb_err(FIBER_EINVAL, "%s: corrupt program headers",
                          pi->path);
        if (ph.type == PT_INTERP && ph.filesz > 1) {
            size_t n = ph.filesz < sizeof pi->interp ? ph.filesz
                                                     : sizeof pi->interp;
            memcpy(pi->interp, m + ph.offset, n);
            pi->interp[n - 1] = '\0';
        } else if (ph.type == PT_NOTE && !pi->has_build_id) {
            pi->has_build_id = find_build_id(m + ph.offset, ph.filesz,
                                             ph.align == 8 ? 8 : 4, pi->id,
                                             sizeof pi->id);
        }
    }
    if (!pi->has_build_id) {
        /* As the runtime does (core/buildid.c): no note, hash the file. */
        unsigned char digest[32];
        crypto_generichash(digest, sizeof digest, m, size, NULL, 0);
        fb_hex(digest, sizeof digest, pi->id, sizeof pi->id);
    }
    return 0;
}

/* Rewrites an absolute path without "." segments and repeated slashes
 * ("/a/./b//c" -> "/a/b/c"), in place.  ".." stays: with symbolic links
 * only the file system knows what it means. */
static void drop_dot_segments(char *path)
{
    char *w = path;
    for (const char *r = path; *r;) {
        if (r[0] == '/' && (r[1] == '/' || (r[1] == '.' && (r[2] == '/' ||
                                                            r[2] == '\0')))) {
            r += r[1] == '/' ? 1 : 2;
            continue;
        }
        *w++ = *r++;
    }
    if (w == path)
        *w++ = '/';
    *w = '\0';
}

/* Finds program as execvp would (a name without '/' is searched in PATH)
 * and makes the path absolute, without resolving symlinks: the image holds
 * the path as given and whatever it points to. */
static int locate_program(const char *program, char *out, size_t size)
{
    if (!program || !*program)
        return fb_err(FIBER_EINVAL, "no program given");
    if (!strchr(program, '/')) {
        const char *path = getenv("PATH");
        while (path && *path) {
            const char *end = strchr(path, ':');
            size_t n = end ? (size_t)(end - path) : strlen(path);
            char cand[PATH_MAX];
            snprintf(cand, sizeof cand, "%.*s/%s", (int)n, n ? path : ".",
                     program);
            if (access(cand, X_OK) == 0 && strlen(cand) < size) {
                memcpy(out, cand, strlen(cand) + 1);
                program = out;
                break;
            }
            path = end ? end + 1 : NULL;
        }
        if (program != out)
            return fb_err(FIBER_EINVAL,
                          "program '%s' not found in PATH; give its path "
                          "(./%s)",
                          program, program);
    }
    if (program[0] == '/') {
        if (program != out && fb_strlcpy(out, program, size) != strlen(program))
            return fb_err(FIBER_EINVAL, "program path too long");
    } else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd))
            return fb_err_errno(FIBER_ESYS, "getcwd");
        if ((size_t)snprintf(out, size, "%s/%s", cwd, program) >= size)
            return fb_err(FIBER_EINVAL, "program path too long");
    }
    drop_dot_segments(out);
    struct stat st;
    if (stat(out, &st) != 0)
        return fb_err_errno(FIBER_EINVAL, "cannot use program %s", out);
    if (!S_ISREG(st.st_mode) || access(out, X_OK) != 0)
        return fb_err(FIBER_EINVAL, "%s is not an executable file", out);
    return 0;
}

static int inspect_program(const char *program, struct program_info *pi)
{
    memset(pi, 0, sizeof *pi);
    int rc = locate_program(program, pi->path, sizeof pi->path);
    if (rc)
        return rc;
    int fd = open(pi->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fb_err_errno(FIBER_ESYS, "cannot open %s", pi->path);
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size == 0) {
        close(fd);
        return fb_err(FIBER_EINVAL, "%s is empty or unreadable", pi->path);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return fb_err_errno(FIBER_ESYS, "cannot map %s", pi->path);
    rc = parse_elf(m, (size_t)st.st_size, pi);
    munmap(m, (size_t)st.st_size);
    return rc;
}

/* ======================================================================
 * The libraries: asking the loader
 * ====================================================================== */

/*
 * Which libraries does the program need, and where are they?  The answer
 * must be the one the dynamic loader gives when the program starts, which
 * depends on DT_NEEDED recursively, DT_RPATH versus DT_RUNPATH (and which
 * object's applies to which dependency), $ORIGIN and $LIB expansion,
 * glibc-hwcaps subdirectories chosen by the CPU, /etc/ld.so.cache and the
 * loader's built-in directories.  Rewriting that resolver would be a
 * second, subtly different loader.  So we ask the loader itself: the
 * program's own PT_INTERP run as `<interp> --list <program>` (what ldd
 * does) loads the dependency tree without running any of the program's
 * code and prints each object's path.
 *
 * It runs with every LD_* variable removed from the environment: the
 * container will not have LD_LIBRARY_PATH or LD_PRELOAD either, so what it
 * resolves without them is what the image must hold (plus
 * /etc/ld.so.cache, which the image carries so that libraries found
 * through ld.so.conf are found the same way in the container).
 *
 * The caveat ldd's manual gives (never run it on an untrusted binary)
 * does not apply more than building an image of the program does: the
 * image exists to run it.
 */

/* A set of paths in insertion order, with an open-addressing index
 * (a Python environment puts tens of thousands of files in an image). */
struct path_list {
    char **items;
    size_t n, cap;
    size_t *slots; /* index + 1 into items, 0 = empty; nslots a power of 2 */
    size_t nslots;
};

static size_t path_hash(const char *p, size_t len)
{
    size_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

/* The slot where path is, or the empty one where it would go. */
static size_t *path_slot(const struct path_list *l, const char *path,
                         size_t len)
{
    size_t mask = l->nslots - 1;
    for (size_t i = path_hash(path, len) & mask;; i = (i + 1) & mask) {
        size_t *s = &l->slots[i];
        if (*s == 0)
            return s;
        const char *item = l->items[*s - 1];
        if (strlen(item) == len && memcmp(item, path, len) == 0)
            return s;
    }
}

static int path_list_grow(struct path_list *l)
{
    size_t cap = l->cap ? 2 * l->cap : 32;
    char **items = realloc(l->items, cap * sizeof *items);
    size_t *slots = calloc(2 * cap, sizeof *slots);
    if (!items || !slots) {
        if (items)
            l->items = items;
        free(slots);
        return fb_err(FIBER_ENOMEM, "out of memory");
    }
    free(l->slots);
    l->items = items;
    l->cap = cap;
    l->slots = slots;
    l->nslots = 2 * cap;
    for (size_t i = 0; i < l->n; i++)
        *path_slot(l, l->items[i], strlen(l->items[i])) = i + 1;
    return 0;
}

static int path_list_add(struct path_list *l, const char *path, size_t len)
{
    if (l->nslots && *path_slot(l, path, len))
        return 0;
    if (l->n == l->cap) {
        int rc = path_list_grow(l);
        if (rc)
            return rc;
    }
    if (!(l->items[l->n] = strndup(path, len)))
        return fb_err(FIBER_ENOMEM, "out of memory");
    l->n++;
    *path_slot(l, path, len) = l->n;
    return 0;
}

static int path_list_has(const struct path_list *l, const char *path)
{
    return l->nslots && *path_slot(l, path, strlen(path)) != 0;
}

static void path_list_free(struct path_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->items[i]);
    free(l->items);
    free(l->slots);
    memset(l, 0, sizeof *l);
}

/* The environment without LD_* variables. */
static char **loader_env(void)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 1, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "LD_", 3) != 0)
            env[k++] = environ[i];
    return env;
}

/* Runs `interp --list program` and collects its output and exit status. */
static int run_loader(const struct program_info *pi, fiber_buf *output,
                      int *status)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return fb_err_errno(FIBER_ESYS, "pipe");
    char **env = loader_env();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY,
                                     0);
    char *argv[] = {(char *)pi->interp, "--list", (char *)pi->path, NULL};
    pid_t pid;
    int err = env ? posix_spawn(&pid, pi->interp, &fa, NULL, argv, env)
                  : ENOMEM;
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    close(fds[1]);
    if (err) {
        close(fds[0]);
        errno = err;
        return fb_err_errno(FIBER_ESYS,
                            "cannot run %s's dynamic loader %s to list its "
                            "libraries",
                            pi->path, pi->interp);
    }
    int rc = 0;
    char chunk[4096];
    ssize_t n;
    while ((n = read(fds[0], chunk, sizeof chunk)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 || (rc == 0 && fiber_buf_append(output, chunk, (size_t)n)))
            rc = rc ? rc : fb_err(FIBER_ENOMEM, "out of memory");
        if (n < 0)
            break;
    }
    close(fds[0]);
    while (waitpid(pid, status, 0) < 0 && errno == EINTR)
        ;
    return rc;
}

/* Parses the loader's listing.  Lines look like
 *     libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)
 *     /lib64/ld-linux-x86-64.so.2 (0x...)
 *     linux-vdso.so.1 (0x...)              (in the kernel: skipped)
 *     libfoo.so.1 => not found             (an error) */
static int parse_listing(const struct program_info *pi, const char *text,
                         struct path_list *libs, int lenient)
{
    const char *line = text;
    while (*line) {
        const char *eol = strchr(line, '\n');
        size_t len = eol ? (size_t)(eol - line) : strlen(line);
        const char *p = line, *end = line + len;
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        const char *arrow = memmem(p, (size_t)(end - p), " => ", 4);
        const char *path = arrow ? arrow + 4 : p;
        if (arrow && end - path >= 9 && memcmp(path, "not found", 9) == 0 &&
            lenient) {
            line = eol ? eol + 1 : end; /* an optional module's library */
            continue;
        }
        if (arrow && end - path >= 9 && memcmp(path, "not found", 9) == 0)
            return fb_err(FIBER_EINVAL,
                          "%s needs %.*s, which the dynamic loader cannot "
                          "find (without LD_LIBRARY_PATH, as in a "
                          "container): install it in a system directory, "
                          "add its directory to /etc/ld.so.conf.d and run "
                          "ldconfig, or link the program with -Wl,-rpath",
                          pi->path, (int)(arrow - p), p);
        if (path < end && *path == '/') {
            const char *stop = memmem(path, (size_t)(end - path), " (0x", 4);
            size_t plen = stop ? (size_t)(stop - path) : (size_t)(end - path);
            int rc = path_list_add(libs, path, plen);
            if (rc)
                return rc;
        }
        line = eol ? eol + 1 : end;
    }
    return 0;
}

/* Adds what `interp --list` says pi->path needs (pi may be a library). */
static int loader_listing(const struct program_info *pi,
                          struct path_list *libs)
{
    fiber_buf out = {0};
    int status = 0;
    int rc = run_loader(pi, &out, &status);
    if (rc == 0)
        rc = fiber_buf_append(&out, "", 1); /* NUL-terminate */
    if (rc == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        rc = fb_err(FIBER_EINVAL,
                    "the dynamic loader %s could not list %s's libraries "
                    "(it said: %.400s)",
                    pi->interp, pi->path,
                    out.len > 1 ? (const char *)out.data : "nothing");
    if (rc == 0)
        rc = parse_listing(pi, (const char *)out.data, libs, 0);
    fiber_buf_free(&out);
    return rc;
}

/* libcurl, which fiber dlopen()s for its docker and kubernetes backends
 * (curl_dl.h), and the libraries it needs: a master in a container (fiber
 * run, a pod of the kubernetes backend) talks to its engine with it.
 * Where this host has no libcurl, nothing is added. */
static int add_libcurl(const struct program_info *pi, struct path_list *libs)
{
    if (fb_curl_load() != 0) {
        fb_err_clear(); /* no libcurl here: the image goes without */
        return 0;
    }
    void *h = dlopen("libcurl.so.4", RTLD_NOW | RTLD_NOLOAD);
    struct link_map *lm = NULL;
    if (!h)
        return 0;
    int found = dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name &&
                lm->l_name[0] == '/';
    struct program_info lib = *pi;
    if (found)
        fb_strlcpy(lib.path, lm->l_name, sizeof lib.path);
    dlclose(h);
    if (!found)
        return 0;
    int rc = loader_listing(&lib, libs);
    return rc ? rc : path_list_add(libs, lib.path, strlen(lib.path));
}

static int list_libraries(const struct program_info *pi,
                          struct path_list *libs)
{
    if (!pi->interp[0])
        return 0; /* statically linked: nothing to add */
    int rc = loader_listing(pi, libs);
    if (rc == 0)
        rc = add_libcurl(pi, libs);
    if (rc == 0)
        rc = path_list_add(libs, pi->interp, strlen(pi->interp));
    return rc;
}

/* ======================================================================
 * The tar archive
 * ====================================================================== */

struct tar {
    fiber_buf buf;
    struct path_list added; /* archive paths written, to write each once */
    size_t files;           /* regular files written */
    uint64_t file_bytes;    /* their content */
};

/* Writes value as width - 1 zero-padded octal digits and a NUL, as ustar
 * wants (values too big for the field were refused before). */
static void octal(char *field, size_t width, uint64_t value)
{
    field[width - 1] = '\0';
    for (size_t i = width - 1; i > 0; i--) {
        field[i - 1] = (char)('0' + (value & 7u));
        value >>= 3;
    }
}

static int tar_pad(struct tar *t)
{
    static const char zeros[512];
    size_t rem = t->buf.len % 512;
    return rem ? fiber_buf_append(&t->buf, zeros, 512 - rem) : 0;
}

/* Writes one 512-byte header.  name and linkname must fit (the caller
 * writes a pax header first when they do not). */
static int tar_raw_header(struct tar *t, const char *name, unsigned mode,
                          uint64_t size, int64_t mtime, char type,
                          const char *linkname)
{
    unsigned char h[512];
    memset(h, 0, sizeof h);
    size_t nlen = strlen(name);
    if (nlen <= 100) {
        memcpy(h, name, nlen);
    } else {
        /* ustar: prefix (155) '/' name (100), split at a slash. */
        const char *cut = name + nlen - 101;
        while (*cut && *cut != '/')
            cut++;
        size_t plen = (size_t)(cut - name);
        memcpy(h + 345, name, plen > 155 ? 155 : plen);
        memcpy(h, cut + 1, strlen(cut + 1) > 100 ? 100 : strlen(cut + 1));
    }
    octal((char *)h + 100, 8, mode & 07777);
    octal((char *)h + 108, 8, 0);
    octal((char *)h + 116, 8, 0);
    octal((char *)h + 124, 12, size);
    octal((char *)h + 136, 12, (uint64_t)(mtime > 0 ? mtime : 0));
    memset(h + 148, ' ', 8);
    h[156] = (unsigned char)type;
    if (linkname)
        memcpy(h + 157, linkname,
               strlen(linkname) > 100 ? 100 : strlen(linkname));
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    memcpy(h + 265, "root", 4);
    memcpy(h + 297, "root", 4);
    unsigned sum = 0;
    for (size_t i = 0; i < sizeof h; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    h[155] = ' ';
    return fiber_buf_append(&t->buf, h, sizeof h);
}

/* Does name fit ustar's name or prefix/name fields? */
static int ustar_fits(const char *name)
{
    size_t n = strlen(name);
    if (n <= 100)
        return 1;
    if (n > 256)
        return 0;
    const char *cut = name + n - 101;
    while (*cut && *cut != '/')
        cut++;
    return *cut == '/' && (size_t)(cut - name) <= 155;
}

/* Appends one pax record "<len> key=value\n" (len counts itself). */
static int pax_record(fiber_buf *b, const char *key, const char *value)
{
    size_t body = strlen(key) + strlen(value) + 3; /* ' ', '=', '\n' */
    size_t digits = 1, total;
    for (;;) {
        total = body + digits;
        size_t d = 1;
        for (size_t x = total; x >= 10; x /= 10)
            d++;
        if (d == digits)
            break;
        digits = d;
    }
    char head[32];
    snprintf(head, sizeof head, "%zu ", total);
    int rc = fiber_buf_append(b, head, strlen(head));
    if (rc == 0)
        rc = fiber_buf_append(b, key, strlen(key));
    if (rc == 0)
        rc = fiber_buf_append(b, "=", 1);
    if (rc == 0)
        rc = fiber_buf_append(b, value, strlen(value));
    if (rc == 0)
        rc = fiber_buf_append(b, "\n", 1);
    return rc;
}

static int tar_header(struct tar *t, const char *name, unsigned mode,
                      uint64_t size, int64_t mtime, char type,
                      const char *linkname)
{
    int long_name = !ustar_fits(name);
    int long_link = linkname && strlen(linkname) > 100;
    if (long_name || long_link) {
        fiber_buf pax = {0};
        int rc = 0;
        if (long_name)
            rc = pax_record(&pax, "path", name);
        if (rc == 0 && long_link)
            rc = pax_record(&pax, "linkpath", linkname);
        if (rc == 0)
            rc = tar_raw_header(t, "././@PaxHeader", 0644, pax.len, mtime,
                                'x', NULL);
        if (rc == 0)
            rc = fiber_buf_append(&t->buf, pax.data, pax.len);
        if (rc == 0)
            rc = tar_pad(t);
        fiber_buf_free(&pax);
        if (rc)
            return fb_err(FIBER_ENOMEM, "out of memory building the image");
    }
    if (tar_raw_header(t, name, mode, size, mtime, type, linkname) != 0)
        return fb_err(FIBER_ENOMEM, "out of memory building the image");
    return 0;
}

/* Appends the content of the regular file at path (size bytes). */
static int tar_content(struct tar *t, const char *path, uint64_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fb_err_errno(FIBER_ESYS, "cannot read %s", path);
    int rc = fiber_buf_reserve(&t->buf, size + 512);
    uint64_t left = size;
    while (rc == 0 && left > 0) {
        ssize_t n = read(fd, t->buf.data + t->buf.len, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = n < 0 ? fb_err_errno(FIBER_ESYS, "cannot read %s", path)
                       : fb_err(FIBER_ESYS, "%s shrank while being read",
                                path);
            break;
        }
        t->buf.len += (size_t)n;
        left -= (uint64_t)n;
    }
    close(fd);
    if (rc == 0)
        rc = tar_pad(t) ? fb_err(FIBER_ENOMEM, "out of memory") : 0;
    return rc;
}

/* Adds one directory, symlink or file, once, named by its host path. */
static int tar_add_entry(struct tar *t, const char *host_path,
                         const struct stat *st, const char *link_target)
{
    if (path_list_has(&t->added, host_path))
        return 0;
    char name[PATH_MAX + 2];
    int rc;
    if (S_ISDIR(st->st_mode)) {
        snprintf(name, sizeof name, "%s/", host_path + 1);
        rc = tar_header(t, name, st->st_mode, 0, st->st_mtime, '5', NULL);
    } else if (S_ISLNK(st->st_mode)) {
        rc = tar_header(t, host_path + 1, 0777, 0, st->st_mtime, '2',
                        link_target);
    } else {
        rc = tar_header(t, host_path + 1, st->st_mode, (uint64_t)st->st_size,
                        st->st_mtime, '0', NULL);
        if (rc == 0)
            rc = tar_content(t, host_path, (uint64_t)st->st_size);
        if (rc == 0) {
            t->files++;
            t->file_bytes += (uint64_t)st->st_size;
        }
    }
    if (rc == 0)
        rc = path_list_add(&t->added, host_path, strlen(host_path));
    return rc;
}

/* Adds the absolute host path to the archive: each directory on the way,
 * each symbolic link met (then what it points to, recursively) and the
 * regular file at the end, so the path resolves in the image as on the
 * host. */
static int tar_add_path(struct tar *t, const char *path, int depth)
{
    if (depth > MAX_SYMLINKS)
        return fb_err(FIBER_EINVAL, "too many symbolic links resolving %s",
                      path);
    char cur[PATH_MAX] = ""; /* resolved so far: no symlinks in it */
    const char *p = path;
    while (*p) {
        while (*p == '/')
            p++;
        if (!*p)
            break;
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 1 && p[0] == '.') {
            p += n;
            continue;
        }
        if (n == 2 && p[0] == '.' && p[1] == '.') {
            char *last = strrchr(cur, '/');
            if (last)
                *last = '\0';
            p += n;
            continue;
        }
        size_t used = strlen(cur);
        if (used + 1 + n >= sizeof cur)
            return fb_err(FIBER_EINVAL, "path too long: %s", path);
        cur[used] = '/';
        memcpy(cur + used + 1, p, n);
        cur[used + 1 + n] = '\0';
        p += n;
        struct stat st;
        if (lstat(cur, &st) != 0)
            return fb_err_errno(FIBER_ESYS, "cannot add %s to the image", cur);
        if (S_ISLNK(st.st_mode)) {
            char target[PATH_MAX];
            ssize_t tl = readlink(cur, target, sizeof target - 1);
            if (tl < 0)
                return fb_err_errno(FIBER_ESYS, "readlink %s", cur);
            target[tl] = '\0';
            int rc = tar_add_entry(t, cur, &st, target);
            if (rc)
                return rc;
            /* Continue from what the link points to, with the rest. */
            char next[PATH_MAX];
            char *dir_end = strrchr(cur, '/');
            *dir_end = '\0';
            int w = target[0] == '/'
                        ? snprintf(next, sizeof next, "%s%s", target, p)
                        : snprintf(next, sizeof next, "%s/%s%s", cur, target,
                                   p);
            if (w < 0 || (size_t)w >= sizeof next)
                return fb_err(FIBER_EINVAL, "path too long: %s", path);
            return tar_add_path(t, next, depth + 1);
        }
        if (S_ISDIR(st.st_mode)) {
            int rc = tar_add_entry(t, cur, &st, NULL);
            if (rc)
                return rc;
            continue;
        }
        if (S_ISREG(st.st_mode) && (!*p || strspn(p, "/") == strlen(p)))
            return tar_add_entry(t, cur, &st, NULL);
        return fb_err(FIBER_EINVAL,
                      "cannot add %s to the image: not a regular file, "
                      "directory or symbolic link",
                      cur);
    }
    return 0;
}

static int tar_finish(struct tar *t)
{
    static const char zeros[1024];
    return fiber_buf_append(&t->buf, zeros, sizeof zeros)
               ? fb_err(FIBER_ENOMEM, "out of memory")
               : 0;
}

static void tar_free(struct tar *t)
{
    fiber_buf_free(&t->buf);
    path_list_free(&t->added);
}

/* ---- trees: the extra directories of an interpreted program ---------- */

struct trees {
    const struct program_info *pi; /* whose loader lists a .so's libraries */
    const char *const *excludes;   /* absolute paths left out, or NULL */
    struct path_list *libs;        /* libraries the trees' objects need */
};

static int excluded(const struct trees *tr, const char *path)
{
    for (size_t i = 0; tr->excludes && tr->excludes[i]; i++)
        if (strcmp(tr->excludes[i], path) == 0)
            return 1;
    return 0;
}

static int is_shared_object(const char *name)
{
    size_t n = strlen(name);
    return (n > 3 && strcmp(name + n - 3, ".so") == 0) || strstr(name, ".so.");
}

/* Adds the libraries a shared object of a tree needs (a Python extension
 * module's libsodium, say).  A library the loader cannot find is left
 * out: the module is one the program may never import (tkinter without
 * Tk), and if it does, the import fails in the container as on a host
 * without that library. */
static int tree_object_libraries(const struct trees *tr, const char *path)
{
    if (!tr->pi->interp[0])
        return 0;
    struct program_info so = *tr->pi;
    fb_strlcpy(so.path, path, sizeof so.path);
    fiber_buf out = {0};
    int status = 0;
    int rc = run_loader(&so, &out, &status);
    if (rc == 0)
        rc = fiber_buf_append(&out, "", 1);
    if (rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        rc = parse_listing(&so, (const char *)out.data, tr->libs, 1);
    fiber_buf_free(&out);
    return rc;
}

static int tar_add_tree(struct tar *t, const struct trees *tr,
                        const char *dir, int depth)
{
    if (depth > 64)
        return fb_err(FIBER_EINVAL, "%s: directories nested too deep", dir);
    DIR *d = opendir(dir);
    if (!d)
        return fb_err_errno(FIBER_ESYS, "cannot read %s for the image", dir);
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char path[PATH_MAX];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >=
            sizeof path) {
            rc = fb_err(FIBER_EINVAL, "path too long under %s", dir);
            break;
        }
        struct stat st;
        if (excluded(tr, path) || lstat(path, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            rc = tar_add_entry(t, path, &st, NULL);
            if (rc == 0)
                rc = tar_add_tree(t, tr, path, depth + 1);
        } else if (S_ISLNK(st.st_mode) || S_ISREG(st.st_mode)) {
            rc = tar_add_path(t, path, 0);
            if (rc == 0 && S_ISREG(st.st_mode) && is_shared_object(e->d_name))
                rc = tree_object_libraries(tr, path);
        } /* sockets, fifos, devices: not part of a program */
    }
    closedir(d);
    return rc;
}

/* Adds each tree (a directory, with everything under it but the
 * excludes, or a single file) at its own path. */
static int add_trees(struct tar *t, const struct trees *tr,
                     const char *const *roots)
{
    int rc = 0;
    for (size_t i = 0; rc == 0 && roots && roots[i]; i++) {
        const char *root = roots[i];
        struct stat st;
        if (root[0] != '/')
            return fb_err(FIBER_EINVAL, "'%s': image trees are absolute "
                                        "paths", root);
        if (stat(root, &st) != 0)
            return fb_err_errno(FIBER_EINVAL, "cannot add %s to the image",
                                root);
        rc = tar_add_path(t, root, 0);
        if (rc == 0 && S_ISDIR(st.st_mode)) {
            char real[PATH_MAX];
            if (!realpath(root, real))
                return fb_err_errno(FIBER_ESYS, "realpath %s", root);
            rc = tar_add_tree(t, tr, real, 0);
        }
    }
    return rc;
}

/* Builds the image's file system: /tmp, the program, its libraries and
 * the loader, and the loader's cache. */
static int build_tar(const struct program_info *pi,
                     const struct path_list *libs, struct tar *t)
{
    struct stat tmp = {.st_mode = S_IFDIR | 01777};
    int rc = tar_add_entry(t, "/tmp", &tmp, NULL);
    if (rc == 0)
        rc = tar_add_path(t, pi->path, 0);
    for (size_t i = 0; rc == 0 && i < libs->n; i++)
        rc = tar_add_path(t, libs->items[i], 0);
    if (rc == 0 && pi->interp[0] && access("/etc/ld.so.cache", R_OK) == 0)
        rc = tar_add_path(t, "/etc/ld.so.cache", 0);
    if (rc == 0)
        rc = tar_finish(t);
    return rc;
}

/* ======================================================================
 * Names and the import
 * ====================================================================== */

static int is_lower_alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

/* Splits "repo[:tag]" (the repository may hold a registry "host:port/")
 * and checks both against Docker's grammar. */
static int split_image_name(const char *name, char *repo, size_t rsize,
                            char *tag, size_t tsize)
{
    const char *slash = strrchr(name, '/');
    const char *colon = strrchr(slash ? slash : name, ':');
    size_t rlen = colon ? (size_t)(colon - name) : strlen(name);
    const char *t = colon ? colon + 1 : "latest";
    int ok = rlen > 0 && rlen < rsize && strlen(t) > 0 && strlen(t) <= 128 &&
             strlen(t) < tsize && !strchr(name, '@');
    for (size_t i = 0; ok && i < rlen; i++) {
        char c = name[i];
        ok = is_lower_alnum(c) || c == '.' || c == '_' || c == '-' ||
             c == '/' || c == ':';
    }
    for (const char *p = t; ok && *p; p++)
        ok = is_lower_alnum(*p) || (*p >= 'A' && *p <= 'Z') || *p == '_' ||
             *p == '.' || *p == '-';
    if (ok)
        ok = is_lower_alnum(name[0]) && is_lower_alnum(name[rlen - 1]);
    if (!ok)
        return fb_err(FIBER_EINVAL,
                      "invalid image name '%.200s': use NAME[:TAG] where NAME "
                      "is lower-case letters, digits and . _ - / (starting "
                      "and ending with a letter or digit) and TAG is at most "
                      "128 of [A-Za-z0-9_.-]",
                      name);
    memcpy(repo, name, rlen);
    repo[rlen] = '\0';
    fb_strlcpy(tag, t, tsize);
    return 0;
}

FIBER_API int fiber_image_default_tag(const char *program, char *buf,
                                      size_t size)
{
    if (!buf || size == 0)
        return fb_err(FIBER_EINVAL, "fiber_image_default_tag: no buffer");
    struct program_info pi;
    int rc = inspect_program(program, &pi);
    if (rc)
        return rc;
    /* Docker repository names are lower case; anything else becomes '-',
     * runs of separators collapse, and the ends are letters or digits. */
    const char *base = strrchr(pi.path, '/') + 1;
    char name[64];
    size_t n = 0;
    for (const char *p = base; *p && n + 1 < sizeof name; p++) {
        char c = *p >= 'A' && *p <= 'Z' ? (char)(*p + 32) : *p;
        if (!is_lower_alnum(c) && c != '.' && c != '_')
            c = '-';
        if (!is_lower_alnum(c) && (n == 0 || !is_lower_alnum(name[n - 1])))
            continue;
        name[n++] = c;
    }
    while (n > 0 && !is_lower_alnum(name[n - 1]))
        n--;
    name[n] = '\0';
    int w = snprintf(buf, size, "fiber/%s:%.12s", n ? name : "program", pi.id);
    if (w < 0 || (size_t)w >= size)
        return fb_err(FIBER_EINVAL, "fiber_image_default_tag: buffer of %zu "
                                    "bytes is too small",
                      size);
    return 0;
}

/* Reads the daemon's answer to an import: JSON objects, one a line; the
 * last "status" is the new image's id, an "error" says what failed. */
static int import_result(const fiber_buf *resp, fiber_buf *id_out)
{
    char *text = strndup(resp->len ? (const char *)resp->data : "", resp->len);
    if (!text)
        return fb_err(FIBER_ENOMEM, "out of memory");
    char id[128] = "", error[512] = "";
    for (char *line = strtok(text, "\r\n"); line; line = strtok(NULL, "\r\n")) {
        json_t *j = json_loads(line, 0, NULL);
        const char *s = json_string_value(json_object_get(j, "status"));
        const char *e = json_string_value(json_object_get(j, "error"));
        if (s && strncmp(s, "sha256:", 7) == 0)
            fb_strlcpy(id, s, sizeof id);
        if (e)
            fb_strlcpy(error, e, sizeof error);
        json_decref(j);
    }
    free(text);
    if (error[0])
        return fb_err(FIBER_EBACKEND, "the Docker Engine refused the image: %s",
                      error);
    if (!id[0])
        return fb_err(FIBER_EBACKEND,
                      "the Docker Engine's answer to the import names no "
                      "image id: %.200s",
                      resp->len ? (const char *)resp->data : "(empty)");
    if (fiber_buf_append(id_out, id, strlen(id) + 1) != 0)
        return fb_err(FIBER_ENOMEM, "out of memory");
    id_out->len--; /* keep the NUL out of len: data stays a C string */
    return 0;
}

/* The labels the image carries: where the program is and which build. */
static int import_path(const struct program_info *pi, const char *repo,
                       const char *tag, char *out, size_t size)
{
    char erepo[512], etag[400], label[PATH_MAX + 200], elabel[3 * sizeof label];
    int rc = fb_engine_escape(repo, erepo, sizeof erepo);
    if (rc == 0)
        rc = fb_engine_escape(tag, etag, sizeof etag);
    if (rc)
        return rc;
    int w;
    if (!strpbrk(pi->path, "\"\\\n")) {
        snprintf(label, sizeof label,
                 "LABEL fiber.program=\"%s\" fiber.build_id=\"%s\"", pi->path,
                 pi->id);
        if ((rc = fb_engine_escape(label, elabel, sizeof elabel)) != 0)
            return rc;
        w = snprintf(out, size,
                     "/images/create?fromSrc=-&repo=%s&tag=%s&changes=%s",
                     erepo, etag, elabel);
    } else {
        w = snprintf(out, size, "/images/create?fromSrc=-&repo=%s&tag=%s",
                     erepo, etag);
    }
    return w < 0 || (size_t)w >= size
               ? fb_err(FIBER_EINVAL, "image name too long")
               : 0;
}

/* The id of the image repo:tag names now, or "" if none. */
static void image_id_of(struct fb_engine *e, const char *repo,
                        const char *tag, char *out, size_t size)
{
    char path[512];
    json_t *j = NULL;
    out[0] = '\0';
    snprintf(path, sizeof path, "/images/%s:%s/json", repo, tag);
    if (fb_engine_json(e, "GET", path, NULL, &j, "image") == 0)
        fb_strlcpy(out, json_string_value(json_object_get(j, "Id"))
                            ? json_string_value(json_object_get(j, "Id"))
                            : "",
                   size);
    json_decref(j);
}

/* Rebuilding a tag leaves the image it named before untagged: remove it
 * unless something still uses it (another tag, a container), which the
 * daemon refuses without force. */
static void drop_untagged(struct fb_engine *e, const char *id)
{
    char path[256];
    json_t *j = NULL;
    snprintf(path, sizeof path, "/images/%s/json", id);
    if (fb_engine_json(e, "GET", path, NULL, &j, "image") == 0 &&
        json_array_size(json_object_get(j, "RepoTags")) == 0) {
        snprintf(path, sizeof path, "/images/%s?noprune=0", id);
        fb_engine_json(e, "DELETE", path, NULL, NULL, "removing an image");
    }
    json_decref(j);
}

FIBER_API int fiber_image_build(const char *program, const char *tag,
                                fiber_buf *id_out)
{
    return fiber_image_build_trees(program, NULL, NULL, tag, id_out);
}

FIBER_API int fiber_image_build_trees(const char *program,
                                      const char *const *trees,
                                      const char *const *excludes,
                                      const char *tag, fiber_buf *id_out)
{
    if (!id_out)
        return fb_err(FIBER_EINVAL, "fiber_image_build: id_out is NULL");
    struct program_info pi;
    int rc = inspect_program(program, &pi);
    char name[320], repo[256], version[130];
    if (rc == 0 && !tag) {
        rc = fiber_image_default_tag(pi.path, name, sizeof name);
        tag = name;
    }
    if (rc == 0)
        rc = split_image_name(tag, repo, sizeof repo, version, sizeof version);
    if (rc)
        return rc;

    struct fb_engine e;
    rc = fb_engine_open(&e); /* fail fast, before reading megabytes */
    if (rc)
        return rc;
    struct path_list libs = {0};
    struct tar t = {0};
    rc = list_libraries(&pi, &libs);
    struct trees tr = {&pi, excludes, &libs};
    if (rc == 0 && trees)
        rc = add_trees(&t, &tr, trees); /* may add to libs */
    if (rc == 0)
        rc = build_tar(&pi, &libs, &t);
    char path[4096];
    if (rc == 0)
        rc = import_path(&pi, repo, version, path, sizeof path);
    char old_id[128] = "";
    if (rc == 0)
        image_id_of(&e, repo, version, old_id, sizeof old_id);
    fiber_buf resp = {0};
    long status = 0;
    if (rc == 0)
        rc = fb_engine_request(&e, "POST", path, "application/x-tar",
                               t.buf.data, t.buf.len, &resp, &status,
                               IMPORT_TIMEOUT_MS);
    if (rc == 0 && (status < 200 || status > 299))
        rc = engine_failure(status, &resp, "importing the image");
    size_t before = id_out->len;
    if (rc == 0)
        rc = import_result(&resp, id_out);
    if (rc == 0 && old_id[0] && strcmp(old_id, (char *)id_out->data + before))
        drop_untagged(&e, old_id);
    if (rc == 0)
        fb_err_clear();
    if (rc && id_out->len != before)
        id_out->len = before;
    fiber_buf_free(&resp);
    tar_free(&t);
    path_list_free(&libs);
    fb_engine_close(&e);
    return rc;
}

/* Checks that an image reference is plain enough to go into a path. */
static int image_ref_ok(const char *image)
{
    if (!image || !*image || strlen(image) > 255)
        return 0;
    for (const char *p = image; *p; p++)
        if (!(is_lower_alnum(*p) || (*p >= 'A' && *p <= 'Z') || *p == '.' ||
              *p == '_' || *p == '-' || *p == '/' || *p == ':' || *p == '@'))
            return 0;
    return 1;
}

FIBER_API int fiber_image_inspect(const char *image, fiber_image_info *out)
{
    if (!out || !image_ref_ok(image))
        return fb_err(FIBER_EINVAL, "fiber_image_inspect: invalid image name "
                                    "'%.200s'",
                      image ? image : "(null)");
    struct fb_engine e;
    int rc = fb_engine_open(&e);
    if (rc)
        return rc;
    char path[400], what[320];
    snprintf(path, sizeof path, "/images/%s/json", image);
    snprintf(what, sizeof what, "image %s", image);
    json_t *j = NULL;
    rc = fb_engine_json(&e, "GET", path, NULL, &j, what);
    if (rc == FIBER_ENOKEY)
        fb_err(FIBER_ENOKEY,
               "no image %s in the Docker Engine at %s; build it with fiber "
               "image build",
               image, e.socket);
    if (rc == 0) {
        fiber_image_info info;
        memset(&info, 0, sizeof info);
        const char *id = json_string_value(json_object_get(j, "Id"));
        json_t *tags = json_object_get(j, "RepoTags");
        const char *first = json_string_value(json_array_get(tags, 0));
        const char *program = json_string_value(json_object_get(
            json_object_get(json_object_get(j, "Config"), "Labels"),
            "fiber.program"));
        fb_strlcpy(info.id, id ? id : "", sizeof info.id);
        fb_strlcpy(info.tag, first ? first : image, sizeof info.tag);
        fb_strlcpy(info.program, program ? program : "", sizeof info.program);
        info.size_bytes = json_integer_value(json_object_get(j, "Size"));
        *out = info;
    }
    json_decref(j);
    fb_engine_close(&e);
    return rc;
}

FIBER_API int fiber_image_remove(const char *image)
{
    if (!image_ref_ok(image))
        return fb_err(FIBER_EINVAL, "fiber_image_remove: invalid image name "
                                    "'%.200s'",
                      image ? image : "(null)");
    struct fb_engine e;
    int rc = fb_engine_open(&e);
    if (rc)
        return rc;
    char path[400], what[320];
    snprintf(path, sizeof path, "/images/%s", image);
    snprintf(what, sizeof what, "removing image %s", image);
    json_t *j = NULL;
    rc = fb_engine_json(&e, "DELETE", path, NULL, &j, what);
    if (rc == FIBER_EBACKEND && strstr(fiber_last_error(), "container"))
        fb_err(FIBER_EBACKEND,
               "%s; remove the containers of ended runs first (fiber clean)",
               fiber_last_error());
    json_decref(j);
    fb_engine_close(&e);
    return rc;
}
