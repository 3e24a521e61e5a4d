/*
 * error.c -- error codes, their names and texts (all from FIBER_ERRNO_MAP),
 * and the per-thread detail message behind fiber_last_error().
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"

#define FB_ERRMSG_MAX 1024

static _Thread_local char last_error[FB_ERRMSG_MAX];

FIBER_API const char *fiber_strerror(int code)
{
    switch (code) {
    case FIBER_OK:
        return "success";
#define FB_X(name, value, text)                                                \
    case FIBER_##name:                                                         \
        return text;
        FIBER_ERRNO_MAP(FB_X)
#undef FB_X
    }
    return "unknown error";
}

FIBER_API const char *fiber_errname(int code)
{
    switch (code) {
    case FIBER_OK:
        return "FIBER_OK";
#define FB_X(name, value, text)                                                \
    case FIBER_##name:                                                         \
        return "FIBER_" #name;
        FIBER_ERRNO_MAP(FB_X)
#undef FB_X
    }
    return "FIBER_E?";
}

FIBER_API const char *fiber_last_error(void) { return last_error; }

void fb_err_clear(void) { last_error[0] = '\0'; }

static void set_message(const char *fmt, va_list ap)
{
    /* The message may be built from the previous message (a caller adding
     * context), so format into a scratch buffer first. */
    char tmp[FB_ERRMSG_MAX];
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    memcpy(last_error, tmp, sizeof tmp);
}

int fb_err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_message(fmt, ap);
    va_end(ap);
    return code;
}

int fb_err_errno(int code, const char *fmt, ...)
{
    int saved = errno;
    va_list ap;
    va_start(ap, fmt);
    set_message(fmt, ap);
    va_end(ap);
    size_t n = strlen(last_error);
    snprintf(last_error + n, sizeof last_error - n, ": %s", strerror(saved));
    errno = saved;
    return code;
}
