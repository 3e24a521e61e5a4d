/*
 * util.c -- clocks, deadlines and string helpers.
 */
#include <string.h>
#include <time.h>

#include "core/common.h"

uint64_t fb_now_ns(void)
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
