/*
 * image.c -- fiber_image_build*(): a minimal container image of a fiber
 * program, imported into the Docker Engine without any registry; and
 * fiber_image_inspect / fiber_image_remove.
 *
 * The image is FROM scratch and holds exactly: the program, every shared
 * library the dynamic loader resolves for it (ldso.h), the loader itself,
 * the loader's cache (/etc/ld.so.cache) and an empty /tmp (mode 1777).
 * Each file sits at the same path as on the host, and each symbolic link
 * met on the way to it (Debian's merged /usr: /lib64 -> usr/lib64, /lib ->
 * usr/lib) is recreated (tar.h), so the program runs in a container
 * exactly as the master runs it on the host: the one-binary model holds.
 *
 * The tar is written in memory and sent as the body of
 * POST /images/create?fromSrc=- (engine.h).
 */
#include <dirent.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/docker/elf.h"
#include "backend/docker/image.h"
#include "backend/docker/ldso.h"
#include "backend/docker/tar.h"
#include "base/common.h"

#define IMPORT_TIMEOUT_MS 600000L

/* ---- trees: the extra directories of an interpreted program ---------- */

struct trees {
    const struct fb_program *pi; /* whose loader lists a .so's libraries */
    const char *const *excludes;   /* absolute paths left out, or NULL */
    struct fb_pathset *libs;        /* libraries the trees' objects need */
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
    struct fb_program so = *tr->pi;
    fb_strlcpy(so.path, path, sizeof so.path);
    return fb_ldso_list(&so, tr->libs, 1);
}

static int tar_add_tree(struct fb_tar *t, const struct trees *tr,
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
            rc = fb_tar_add_entry(t, path, &st, NULL);
            if (rc == 0)
                rc = tar_add_tree(t, tr, path, depth + 1);
        } else if (S_ISLNK(st.st_mode) || S_ISREG(st.st_mode)) {
            rc = fb_tar_add_path(t, path, 0);
            if (rc == 0 && S_ISREG(st.st_mode) && is_shared_object(e->d_name))
                rc = tree_object_libraries(tr, path);
        } /* sockets, fifos, devices: not part of a program */
    }
    closedir(d);
    return rc;
}

/* Adds each tree (a directory, with everything under it but the
 * excludes, or a single file) at its own path. */
static int add_trees(struct fb_tar *t, const struct trees *tr,
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
        rc = fb_tar_add_path(t, root, 0);
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
static int build_tar(const struct fb_program *pi,
                     const struct fb_pathset *libs, struct fb_tar *t)
{
    struct stat tmp = {.st_mode = S_IFDIR | 01777};
    int rc = fb_tar_add_entry(t, "/tmp", &tmp, NULL);
    if (rc == 0)
        rc = fb_tar_add_path(t, pi->path, 0);
    for (size_t i = 0; rc == 0 && i < libs->n; i++)
        rc = fb_tar_add_path(t, libs->items[i], 0);
    if (rc == 0 && pi->interp[0] && access("/etc/ld.so.cache", R_OK) == 0)
        rc = fb_tar_add_path(t, "/etc/ld.so.cache", 0);
    if (rc == 0)
        rc = fb_tar_finish(t);
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
    struct fb_program pi;
    int rc = fb_program_inspect(program, &pi);
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
static int import_path(const struct fb_program *pi, const char *repo,
                       const char *tag, char *out, size_t size)
{
    char erepo[512], etag[400], label[PATH_MAX + 200], elabel[3 * sizeof label];
    int rc = fb_http_escape(repo, erepo, sizeof erepo);
    if (rc == 0)
        rc = fb_http_escape(tag, etag, sizeof etag);
    if (rc)
        return rc;
    int w;
    if (!strpbrk(pi->path, "\"\\\n")) {
        snprintf(label, sizeof label,
                 "LABEL fiber.program=\"%s\" fiber.build_id=\"%s\"", pi->path,
                 pi->id);
        if ((rc = fb_http_escape(label, elabel, sizeof elabel)) != 0)
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

/* Reports one stage of a build to opts->progress, if any. */
static void progress(const fiber_image_build_opts *o, const char *fmt, ...)
    FIBER_PRINTF(2, 3);
static void progress(const fiber_image_build_opts *o, const char *fmt, ...)
{
    if (!o->progress)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    o->progress(o->progress_ud, line);
}

static double megabytes(uint64_t bytes) { return (double)bytes / 1e6; }

/* Collects the image's file system into t, saying what it found. */
static int collect(const fiber_image_build_opts *o,
                   const struct fb_program *pi, struct fb_pathset *libs,
                   struct fb_tar *t)
{
    if (pi->interp[0])
        progress(o, "program %s (build id %.12s): asking its dynamic loader "
                    "%s for its libraries",
                 pi->path, pi->id, pi->interp);
    else
        progress(o, "program %s (build id %.12s): statically linked, no "
                    "libraries",
                 pi->path, pi->id);
    int rc = fb_ldso_libraries(pi, libs);
    if (rc == 0 && pi->interp[0])
        progress(o, "libraries: %zu, the loader and libcurl's included",
                 libs->n);
    struct trees tr = {pi, o->excludes, libs};
    if (rc == 0 && o->trees && o->trees[0]) {
        size_t n = 0;
        while (o->trees[n])
            n++;
        progress(o, "collecting %zu tree(s), from %s", n, o->trees[0]);
        rc = add_trees(t, &tr, o->trees); /* may add to libs */
        if (rc == 0)
            progress(o, "trees: %zu files, %.1f MB; libraries now %zu",
                     t->files, megabytes(t->file_bytes), libs->n);
    }
    if (rc == 0)
        rc = build_tar(pi, libs, t);
    if (rc == 0)
        progress(o, "archive: %zu files, %.1f MB of content, %.1f MB of tar",
                 t->files, megabytes(t->file_bytes), megabytes(t->buf.len));
    return rc;
}

/* POST /images/create?fromSrc=- with the archive; appends the new id. */
static int import(struct fb_engine *e, const fiber_image_build_opts *o,
                  const struct fb_program *pi, const char *repo,
                  const char *version, const struct fb_tar *t,
                  fiber_buf *id_out)
{
    char path[4096];
    int rc = import_path(pi, repo, version, path, sizeof path);
    char old_id[128] = "";
    if (rc == 0)
        image_id_of(e, repo, version, old_id, sizeof old_id);
    if (rc == 0)
        progress(o, "importing %s:%s into the Docker Engine at %s (%.1f MB)",
                 repo, version, e->socket, megabytes(t->buf.len));
    fiber_buf resp = {0};
    long status = 0;
    if (rc == 0)
        rc = fb_engine_request(e, "POST", path, "application/x-tar",
                               t->buf.data, t->buf.len, &resp, &status,
                               IMPORT_TIMEOUT_MS);
    if (rc == 0 && fb_http_status_code(status))
        rc = fb_http_refused(&e->http, 0, "importing the image", status,
                             resp.data, resp.len, NULL);
    size_t before = id_out->len;
    if (rc == 0)
        rc = import_result(&resp, id_out);
    if (rc == 0 && old_id[0] && strcmp(old_id, (char *)id_out->data + before))
        drop_untagged(e, old_id);
    fiber_buf_free(&resp);
    return rc;
}

int fb_image_build(const char *socket, const char *program,
                   const fiber_image_build_opts *opts, fiber_buf *id_out)
{
    static const fiber_image_build_opts none;
    const fiber_image_build_opts *o = opts ? opts : &none;
    if (!id_out)
        return fb_err(FIBER_EINVAL, "fiber_image_build: id_out is NULL");
    uint64_t t0 = fb_now_ms();
    struct fb_program pi;
    int rc = fb_program_inspect(program, &pi);
    char name[320], repo[256], version[130];
    const char *tag = o->tag;
    if (rc == 0 && !tag) {
        rc = fiber_image_default_tag(pi.path, name, sizeof name);
        tag = name;
    }
    if (rc == 0)
        rc = split_image_name(tag, repo, sizeof repo, version, sizeof version);
    if (rc)
        return rc;
    struct fb_engine e; /* fail fast, before reading megabytes */
    rc = socket ? fb_engine_open_at(&e, socket) : fb_engine_open(&e);
    if (rc)
        return rc;
    struct fb_pathset libs = {0};
    struct fb_tar t = {0};
    size_t before = id_out->len;
    rc = collect(o, &pi, &libs, &t);
    if (rc == 0)
        rc = import(&e, o, &pi, repo, version, &t, id_out);
    if (rc == 0) {
        progress(o, "built %s:%s: %s in %.1f s", repo, version,
                 (const char *)id_out->data + before,
                 (double)(fb_now_ms() - t0) / 1000.0);
        fb_err_clear();
    }
    if (rc && id_out->len != before)
        id_out->len = before;
    fb_tar_free(&t);
    fb_pathset_free(&libs);
    fb_engine_close(&e);
    return rc;
}

FIBER_API int fiber_image_build_with(const char *program,
                                     const fiber_image_build_opts *opts,
                                     fiber_buf *id_out)
{
    return fb_image_build(NULL, program, opts, id_out);
}

FIBER_API int fiber_image_build(const char *program, const char *tag,
                                fiber_buf *id_out)
{
    fiber_image_build_opts o = {.tag = tag};
    return fb_image_build(NULL, program, &o, id_out);
}

FIBER_API int fiber_image_build_trees(const char *program,
                                      const char *const *trees,
                                      const char *const *excludes,
                                      const char *tag, fiber_buf *id_out)
{
    fiber_image_build_opts o = {.tag = tag, .trees = trees,
                                .excludes = excludes};
    return fb_image_build(NULL, program, &o, id_out);
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

/* The request of fiber_image_inspect and fiber_image_remove: method on
 * /images/<image><suffix>, the answer in *j.  e is left open (closed
 * already when its open failed: *opened says which). */
static int image_request(const char *fn, const char *image, const char *method,
                         const char *suffix, const char *doing,
                         struct fb_engine *e, int *opened, json_t **j)
{
    *opened = 0;
    *j = NULL;
    if (!image_ref_ok(image))
        return fb_err(FIBER_EINVAL, "%s: invalid image name '%.200s'", fn,
                      image ? image : "(null)");
    int rc = fb_engine_open(e);
    if (rc)
        return rc;
    *opened = 1;
    char path[400], what[320];
    snprintf(path, sizeof path, "/images/%s%s", image, suffix);
    snprintf(what, sizeof what, "%s%s", doing, image);
    return fb_engine_json(e, method, path, NULL, j, what);
}

FIBER_API int fiber_image_inspect(const char *image, fiber_image_info *out)
{
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_image_inspect: out is NULL");
    struct fb_engine e;
    json_t *j;
    int opened;
    int rc = image_request("fiber_image_inspect", image, "GET", "/json",
                           "inspecting image ", &e, &opened, &j);
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
    if (opened)
        fb_engine_close(&e);
    return rc;
}

FIBER_API int fiber_image_remove(const char *image)
{
    struct fb_engine e;
    json_t *j;
    int opened;
    int rc = image_request("fiber_image_remove", image, "DELETE", "",
                           "removing image ", &e, &opened, &j);
    if (rc == FIBER_EBACKEND && strstr(fiber_last_error(), "container"))
        fb_err(FIBER_EBACKEND,
               "%s; remove the containers of ended runs first (fiber clean)",
               fiber_last_error());
    json_decref(j);
    if (opened)
        fb_engine_close(&e);
    return rc;
}
