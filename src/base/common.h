/*
 * common.h -- what every internal source file of fiber uses: error
 * reporting into the per-thread message, clocks, small helpers.
 *
 * Internal symbols use the fb_ prefix and are hidden from the shared
 * library's symbol table (-fvisibility=hidden); only FIBER_API functions
 * are exported.
 */
#ifndef FB_COMMON_H
#define FB_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "fiber/fiber.h"

#define FB_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define FB_UNUSED(x) ((void)(x))

/* On what a pool worker runs for every task: the compiler places such
 * functions together (.text.hot), so that a task's path spans a page or
 * two of code rather than one page per source file.  With thousands of
 * workers on a few cores each task starts with cold caches and TLB, and
 * every further page costs a page walk (docs/performance.md,
 * bench-scale). */
#define FB_HOT __attribute__((hot))

/* Sets the calling thread's fiber_last_error() message (printf-style) and
 * returns code, so error paths read `return fb_err(FIBER_EINVAL, "...")`. */
int fb_err(int code, const char *fmt, ...) FIBER_PRINTF(2, 3);

/* Like fb_err, appending ": <strerror(errno)>" with the errno value as it
 * was on entry.  Returns code. */
int fb_err_errno(int code, const char *fmt, ...) FIBER_PRINTF(2, 3);

/* Clears the calling thread's message. */
void fb_err_clear(void);

/* Monotonic clock in nanoseconds and milliseconds. */
uint64_t fb_now_ns(void);
uint64_t fb_now_ms(void);

/* Converts a timeout (negative = forever) into an absolute monotonic
 * deadline in ms (UINT64_MAX = forever), and back into the milliseconds
 * left, for poll() (-1 = forever, never negative otherwise). */
uint64_t fb_deadline_ms(int timeout_ms);
int fb_ms_left(uint64_t deadline_ms);

/* Writes n bytes of p as lower-case hex into out (NUL-terminated,
 * truncated to size). */
void fb_hex(const unsigned char *p, size_t n, char *out, size_t size);

/* Creates dir and its missing parents with mode 0700, like mkdir -p.
 * Returns 0 or -1 with errno set (ENAMETOOLONG, ENOENT for ""). */
int fb_make_dirs(const char *dir);

/* Makes a directory only this user can use (mode 0700), or checks that an
 * existing one is ours and private.  Returns 0 or FIBER_ESYS with a
 * message naming the path. */
int fb_private_dir(const char *path);

/* snprintf that always NUL-terminates and never overflows; returns the
 * number of bytes written (excluding the NUL). */
size_t fb_strlcpy(char *dst, const char *src, size_t size);

/* Writes all len bytes to fd, retrying short writes and EINTR.  Returns
 * 0, or -1 with errno set (the caller says what was being written). */
int fb_write_all(int fd, const void *data, size_t len);

/* Appends the whole file at path to b.  Returns 0, FIBER_ESYS ("cannot
 * read <path>: ..."), FIBER_ENOMEM; on failure b may hold part of it. */
int fb_buf_append_file(fiber_buf *b, const char *path);

#endif /* FB_COMMON_H */
