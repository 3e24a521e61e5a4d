/*
 * buf.c -- growable byte buffers (fiber_buf).
 */
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

FIBER_API FB_HOT int fiber_buf_reserve(fiber_buf *b, size_t n)
{
    if (!b)
        return fb_err(FIBER_EINVAL, "fiber_buf_reserve: buffer is NULL");
    if (n <= b->cap - b->len)
        return 0;
    if (n > SIZE_MAX / 2 - b->len)
        return fb_err(FIBER_ENOMEM, "buffer of %zu bytes cannot grow by %zu",
                      b->len, n);
    size_t want = b->len + n;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < want)
        cap *= 2;
    unsigned char *p = realloc(b->data, cap);
    if (!p)
        return fb_err(FIBER_ENOMEM, "cannot grow buffer to %zu bytes", cap);
    b->data = p;
    b->cap = cap;
    return 0;
}

FIBER_API FB_HOT int fiber_buf_append(fiber_buf *b, const void *p, size_t n)
{
    int rc = fiber_buf_reserve(b, n);
    if (rc)
        return rc;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

FIBER_API void fiber_buf_free(fiber_buf *b)
{
    if (!b)
        return;
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
