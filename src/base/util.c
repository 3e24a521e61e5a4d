/*
 * util.c -- clocks, deadlines and string helpers.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"

FB_HOT uint64_t fb_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t fb_now_ms(void) { return fb_now_ns() / 1000000u; }

uint64_t fb_deadline_ms(int timeout_ms)
{
    if (timeout_ms < 0)
        return UINT64_MAX;
    return fb_now_ms() + (uint64_t)timeout_ms;
}

int fb_ms_left(uint64_t deadline_ms)
{
    if (deadline_ms == UINT64_MAX)
        return -1;
    uint64_t now = fb_now_ms();
    if (now >= deadline_ms)
        return 0;
    uint64_t left = deadline_ms - now;
    return left > 0x7fffffff ? 0x7fffffff : (int)left;
}

size_t fb_strlcpy(char *dst, const char *src, size_t size)
{
    if (size == 0)
        return 0;
    size_t n = strlen(src);
    if (n >= size)
        n = size - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
    return n;
}

void fb_hex(const unsigned char *p, size_t n, char *out, size_t size)
{
    static const char digits[] = "0123456789abcdef";
    size_t i;
    if (size == 0)
        return;
    for (i = 0; i < n && 2 * i + 2 < size; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * i] = '\0';
}

int fb_make_dirs(const char *dir)
{
    char path[PATH_MAX];
    if (dir[0] == '\0') {
        errno = ENOENT;
        return -1;
    }
    if (fb_strlcpy(path, dir, sizeof path) != strlen(dir)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    /* Each '/' after the first character ends a parent; the loop's last
     * round creates dir itself. */
    for (char *slash = path + 1;; slash++) {
        if (*slash != '/' && *slash != '\0')
            continue;
        char saved = *slash;
        *slash = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST)
            return -1;
        *slash = saved;
        if (saved == '\0')
            return 0;
    }
}

int fb_private_dir(const char *path)
{
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return fb_err_errno(FIBER_ESYS, "cannot create %s", path);
    struct stat st;
    if (lstat(path, &st) != 0)
        return fb_err_errno(FIBER_ESYS, "cannot stat %s", path);
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 077) != 0)
        return fb_err(FIBER_ESYS,
                      "refusing to use %s: it is not a directory that only "
                      "this user can access",
                      path);
    return 0;
}

int fb_write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int fb_buf_append_file(fiber_buf *b, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fb_err_errno(FIBER_ESYS, "cannot read %s", path);
    char chunk[65536];
    ssize_t n;
    int rc = 0;
    while (rc == 0 && (n = read(fd, chunk, sizeof chunk)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = fb_err_errno(FIBER_ESYS, "cannot read %s", path);
        else if (fiber_buf_append(b, chunk, (size_t)n))
            rc = fb_err(FIBER_ENOMEM, "out of memory");
    }
    close(fd);
    return rc;
}

