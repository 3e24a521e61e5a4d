/*
 * future.c -- fiber_future: the handle and the public calls, whatever the
 * call behind it (future.h).
 */
#include <stdlib.h>

#include "base/common.h"
#include "future/future.h"

#define FUTURE_MAGIC 0x46555455u /* "FUTU" */

struct fiber_future {
    uint32_t magic;
    const struct fb_future_ops *ops;
    void *impl;
};

int fb_future_new(const struct fb_future_ops *ops, void *impl,
                  fiber_future **out)
{
    fiber_future *f = malloc(sizeof *f);
    if (!f)
        return fb_err(FIBER_ENOMEM, "out of memory");
    f->magic = FUTURE_MAGIC;
    f->ops = ops;
    f->impl = impl;
    *out = f;
    return 0;
}

static int check_future(const fiber_future *f)
{
    if (!f || f->magic != FUTURE_MAGIC)
        return fb_err(FIBER_EINVAL, "not a valid fiber_future handle");
    return 0;
}

FIBER_API int fiber_future_wait(fiber_future *f, int timeout_ms)
{
    int rc = check_future(f);
    return rc ? rc : f->ops->wait(f->impl, timeout_ms);
}

FIBER_API int fiber_future_get(fiber_future *f, fiber_buf *out,
                               int timeout_ms)
{
    int rc = fiber_future_wait(f, timeout_ms);
    return rc ? rc : f->ops->take(f->impl, out);
}

FIBER_API int fiber_future_ready(fiber_future *f)
{
    int rc = check_future(f);
    return rc ? rc : f->ops->ready(f->impl);
}

FIBER_API int fiber_future_successful(fiber_future *f)
{
    int rc = check_future(f);
    if (rc)
        return rc;
    if (!f->ops->ready(f->impl))
        return fb_err(FIBER_ESTATE, "the future is not ready");
    return f->ops->succeeded(f->impl);
}

FIBER_API void fiber_future_free(fiber_future *f)
{
    if (!f || check_future(f))
        return;
    const struct fb_future_ops *ops = f->ops;
    void *impl = f->impl;
    f->magic = 0;
    free(f);
    ops->free(impl);
}
