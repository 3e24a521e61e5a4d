/*
 * tar.c -- the tar writer of tar.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/docker/tar.h"
#include "base/common.h"

#define MAX_SYMLINKS 40

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

static int tar_pad(struct fb_tar *t)
{
    static const char zeros[512];
    size_t rem = t->buf.len % 512;
    return rem ? fiber_buf_append(&t->buf, zeros, 512 - rem) : 0;
}

/* Writes one 512-byte header.  name and linkname must fit (the caller
 * writes a pax header first when they do not). */
static int tar_raw_header(struct fb_tar *t, const char *name, unsigned mode,
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

static int tar_header(struct fb_tar *t, const char *name, unsigned mode,
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
static int tar_content(struct fb_tar *t, const char *path, uint64_t size)
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
int fb_tar_add_entry(struct fb_tar *t, const char *host_path,
                         const struct stat *st, const char *link_target)
{
    if (fb_pathset_has(&t->added, host_path))
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
        rc = fb_pathset_add(&t->added, host_path, strlen(host_path));
    return rc;
}

/* Adds the absolute host path to the archive: each directory on the way,
 * each symbolic link met (then what it points to, recursively) and the
 * regular file at the end, so the path resolves in the image as on the
 * host. */
int fb_tar_add_path(struct fb_tar *t, const char *path, int depth)
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
            int rc = fb_tar_add_entry(t, cur, &st, target);
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
            return fb_tar_add_path(t, next, depth + 1);
        }
        if (S_ISDIR(st.st_mode)) {
            int rc = fb_tar_add_entry(t, cur, &st, NULL);
            if (rc)
                return rc;
            continue;
        }
        if (S_ISREG(st.st_mode) && (!*p || strspn(p, "/") == strlen(p)))
            return fb_tar_add_entry(t, cur, &st, NULL);
        return fb_err(FIBER_EINVAL,
                      "cannot add %s to the image: not a regular file, "
                      "directory or symbolic link",
                      cur);
    }
    return 0;
}

int fb_tar_finish(struct fb_tar *t)
{
    static const char zeros[1024];
    return fiber_buf_append(&t->buf, zeros, sizeof zeros)
               ? fb_err(FIBER_ENOMEM, "out of memory")
               : 0;
}

void fb_tar_free(struct fb_tar *t)
{
    fiber_buf_free(&t->buf);
    fb_pathset_free(&t->added);
}
