/*
 * wire_stats.c -- encoding and strict decoding of the messages that watch
 * a run (STATS, SNAPSHOT; wire.h has their layouts).  No I/O.  Like
 * wire.c, the decoder checks every length against what is there, every
 * name against its rule and every count against its limit, and rejects
 * trailing bytes.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "base/endian.h"
#include "wire/wire.h"
#include "wire/wire_int.h"

/* The fixed part of a pool record after its name: 3 u32 and 9 u64. */
#define POOL_FIXED (3u * 4u + 9u * 8u)
/* format, pid, four u64, and the backend's length byte. */
#define HEAD_FIXED (1u + 4u + 4u * 8u + 1u)

/* Stores v at p and returns where the next field goes. */
static uint8_t *put32(uint8_t *p, uint32_t v)
{
    fb_put_le32(p, v);
    return p + 4;
}

static uint8_t *put64(uint8_t *p, uint64_t v)
{
    fb_put_le64(p, v);
    return p + 8;
}

/* 0 when s[0, n) is a name by wire.h's rule (1..63 of [A-Za-z0-9_.-]),
 * else why not in why. */
static int name_problem(const uint8_t *s, size_t n, char *why, size_t size)
{
    if (n < 1 || n > FB_WIRE_NAME_MAX) {
        snprintf(why, size, "length %zu is outside 1..%u", n,
                 FB_WIRE_NAME_MAX);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') ||
              (c >= 'a' && c <= 'z') || c == '_' || c == '.' || c == '-')) {
            snprintf(why, size, "byte %zu (0x%02x) is not in [A-Za-z0-9_.-]",
                     i, c);
            return -1;
        }
    }
    return 0;
}

/* Checks pool record i at *pos (left bytes remain), moving past it. */
static int check_pool(const uint8_t **pos, size_t *left, uint32_t i,
                      char *err, size_t errlen)
{
    char why[128];
    if (*left < 1)
        return fb_wire_fail(err, errlen, "SNAPSHOT pool %u name: truncated", i);
    size_t n = (*pos)[0];
    if (*left < 1 + n + POOL_FIXED)
        return fb_wire_fail(err, errlen,
                    "SNAPSHOT pool %u: truncated: needs %zu bytes, %zu left",
                    i, 1 + n + POOL_FIXED, *left);
    if (name_problem(*pos + 1, n, why, sizeof why))
        return fb_wire_fail(err, errlen, "SNAPSHOT pool %u name: %s", i, why);
    const uint8_t *f = *pos + 1 + n;
    uint32_t alive = fb_get_le32(f), starting = fb_get_le32(f + 4);
    if (starting > alive)
        return fb_wire_fail(err, errlen,
                    "SNAPSHOT pool %u workers_starting: %u is more than "
                    "workers_alive (%u)",
                    i, starting, alive);
    *pos += 1 + n + POOL_FIXED;
    *left -= 1 + n + POOL_FIXED;
    return 0;
}

int fb_wire_get_snapshot(const uint8_t *p, size_t len,
                         struct fb_msg_snapshot *m, char *err, size_t errlen)
{
    char why[128];
    if (len < HEAD_FIXED)
        return fb_wire_fail(err, errlen,
                    "SNAPSHOT payload: truncated: %zu bytes, at least %u",
                    len, HEAD_FIXED);
    if (p[0] != FB_WIRE_SNAPSHOT_FORMAT)
        return fb_wire_fail(err, errlen,
                    "SNAPSHOT format: %u, this fiber reads format %u (the "
                    "master runs another version of fiber)",
                    p[0], FB_WIRE_SNAPSHOT_FORMAT);
    struct fb_msg_snapshot s = {.pid = fb_get_le32(p + 1),
                                .uptime_ms = fb_get_le64(p + 5),
                                .cpu_user_us = fb_get_le64(p + 13),
                                .cpu_sys_us = fb_get_le64(p + 21),
                                .rss_bytes = fb_get_le64(p + 29)};
    size_t n = p[37];
    const uint8_t *pos = p + HEAD_FIXED;
    size_t left = len - HEAD_FIXED;
    if (left < n + 4)
        return fb_wire_fail(err, errlen,
                    "SNAPSHOT backend: truncated: needs %zu bytes, %zu left",
                    n + 4, left);
    if (name_problem(pos, n, why, sizeof why))
        return fb_wire_fail(err, errlen, "SNAPSHOT backend: %s", why);
    s.backend = (const char *)pos;
    s.backend_len = (uint8_t)n;
    s.n_pools = fb_get_le32(pos + n);
    pos += n + 4;
    left -= n + 4;
    if (s.n_pools > FB_WIRE_SNAPSHOT_POOLS_MAX)
        return fb_wire_fail(err, errlen, "SNAPSHOT n_pools: %u is more than %u",
                    s.n_pools, FB_WIRE_SNAPSHOT_POOLS_MAX);
    s.pools = pos;
    for (uint32_t i = 0; i < s.n_pools; i++) {
        int rc = check_pool(&pos, &left, i, err, errlen);
        if (rc)
            return rc;
    }
    if (left)
        return fb_wire_fail(err, errlen,
                    "SNAPSHOT payload: %zu trailing byte%s after the pools",
                    left, left == 1 ? "" : "s");
    *m = s;
    return 0;
}

void fb_wire_snapshot_next(const uint8_t **cursor,
                           struct fb_msg_snapshot_pool *pool)
{
    const uint8_t *c = *cursor;
    pool->name_len = c[0];
    pool->name = (const char *)c + 1;
    const uint8_t *f = c + 1 + pool->name_len;
    pool->workers_alive = fb_get_le32(f);
    pool->workers_starting = fb_get_le32(f + 4);
    pool->workers_target = fb_get_le32(f + 8);
    uint64_t *u[] = {&pool->workers_started, &pool->workers_lost,
                     &pool->tasks_submitted, &pool->tasks_done,
                     &pool->tasks_failed,    &pool->tasks_retried,
                     &pool->tasks_crashed,   &pool->tasks_queued,
                     &pool->tasks_in_flight};
    for (size_t i = 0; i < FB_ARRAY_LEN(u); i++)
        *u[i] = fb_get_le64(f + 12 + 8 * i);
    *cursor = f + POOL_FIXED;
}

static int check_put(const struct fb_msg_snapshot *m,
                     const struct fb_msg_snapshot_pool *pools, size_t n,
                     size_t *len)
{
    char why[128];
    if (!m || (n && !pools))
        return fb_err(FIBER_EINVAL, "SNAPSHOT: message or pools is NULL");
    if (n > FB_WIRE_SNAPSHOT_POOLS_MAX)
        return fb_err(FIBER_EINVAL, "SNAPSHOT: %zu pools, at most %u", n,
                      FB_WIRE_SNAPSHOT_POOLS_MAX);
    if (name_problem((const uint8_t *)m->backend, m->backend_len, why,
                     sizeof why))
        return fb_err(FIBER_EINVAL, "SNAPSHOT backend: %s", why);
    *len = HEAD_FIXED + m->backend_len + 4;
    for (size_t i = 0; i < n; i++) {
        if (name_problem((const uint8_t *)pools[i].name, pools[i].name_len,
                         why, sizeof why))
            return fb_err(FIBER_EINVAL, "SNAPSHOT pool %zu name: %s", i, why);
        if (pools[i].workers_starting > pools[i].workers_alive)
            return fb_err(FIBER_EINVAL,
                          "SNAPSHOT pool %zu: more workers starting than "
                          "alive",
                          i);
        *len += 1 + pools[i].name_len + POOL_FIXED;
    }
    return 0;
}

static uint8_t *put_pool(uint8_t *w, const struct fb_msg_snapshot_pool *pl)
{
    *w++ = pl->name_len;
    memcpy(w, pl->name, pl->name_len);
    w += pl->name_len;
    w = put32(w, pl->workers_alive);
    w = put32(w, pl->workers_starting);
    w = put32(w, pl->workers_target);
    const uint64_t u[] = {pl->workers_started, pl->workers_lost,
                          pl->tasks_submitted, pl->tasks_done,
                          pl->tasks_failed,    pl->tasks_retried,
                          pl->tasks_crashed,   pl->tasks_queued,
                          pl->tasks_in_flight};
    for (size_t i = 0; i < FB_ARRAY_LEN(u); i++)
        w = put64(w, u[i]);
    return w;
}

int fb_wire_put_snapshot(fiber_buf *out, uint64_t id,
                         const struct fb_msg_snapshot *m,
                         const struct fb_msg_snapshot_pool *pools, size_t n)
{
    size_t len = 0;
    if (!out)
        return fb_err(FIBER_EINVAL, "SNAPSHOT: output buffer is NULL");
    int rc = check_put(m, pools, n, &len);
    if (rc == 0)
        rc = fiber_buf_reserve(out, FB_WIRE_HDR_LEN + len);
    if (rc)
        return rc;
    struct fb_wire_hdr h = {.type = FB_MSG_SNAPSHOT, .id = id,
                            .len = (uint32_t)len};
    uint8_t *w = out->data + out->len;
    fb_wire_hdr_encode(w, &h);
    w += FB_WIRE_HDR_LEN;
    *w++ = FB_WIRE_SNAPSHOT_FORMAT;
    w = put32(w, m->pid);
    w = put64(w, m->uptime_ms);
    w = put64(w, m->cpu_user_us);
    w = put64(w, m->cpu_sys_us);
    w = put64(w, m->rss_bytes);
    *w++ = m->backend_len;
    memcpy(w, m->backend, m->backend_len);
    w = put32(w + m->backend_len, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        w = put_pool(w, &pools[i]);
    out->len += FB_WIRE_HDR_LEN + len;
    return 0;
}

int fb_wire_check_stats(const struct fb_wire_hdr *h, const uint8_t *p,
                        char *err, size_t errlen)
{
    struct fb_msg_snapshot s;
    switch (h->type) {
    case FB_MSG_STATS:
        return fb_wire_get_empty(h->len, err, errlen);
    case FB_MSG_SNAPSHOT:
        return fb_wire_get_snapshot(p, h->len, &s, err, errlen);
    }
    return 1;
}
