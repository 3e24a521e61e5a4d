/*
 * checkpoint.c -- saving and loading an ES run (see train.h).
 *
 * Format 1, every number little-endian whatever the host:
 *
 *   8  magic "FIBER-ES"
 *   u32 version (1)          u32 header bytes (104)
 *   16 environment name, NUL-padded
 *   u32 obs_dim  u32 hidden  u32 act_dim  u32 noise_log2
 *   u64 nparams  u64 iteration  u64 adam_t  u64 rng  u64 noise_seed
 *   u64 payload bytes        u64 payload hash (FNV-1a 64)
 *   payload: f32 theta[nparams], f64 adam_m[nparams], f64 adam_v[nparams],
 *            f64 obs_sum[obs_dim], f64 obs_sumsq[obs_dim], f64 obs_count
 *
 * The header says what the payload must be, so a checkpoint of another
 * environment or shape is refused by name before any number is used, and
 * the hash catches a truncated or damaged file.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fiber/fiber.h>

#include "rollout.h"
#include "train.h"

#define CKPT_MAGIC "FIBER-ES"
#define CKPT_VERSION 1u
#define CKPT_HEADER 104u
#define CKPT_MAX_BYTES (1u << 30)

static int put_u32(fiber_buf *b, uint32_t v)
{
    unsigned char p[4] = {(unsigned char)v, (unsigned char)(v >> 8),
                          (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
    return fiber_buf_append(b, p, 4);
}

static int put_u64(fiber_buf *b, uint64_t v)
{
    return put_u32(b, (uint32_t)v) || put_u32(b, (uint32_t)(v >> 32));
}

static int put_f32s(fiber_buf *b, const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i], 4);
        if (put_u32(b, bits))
            return -1;
    }
    return 0;
}

static int put_f64s(fiber_buf *b, const double *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t bits;
        memcpy(&bits, &v[i], 8);
        if (put_u64(b, bits))
            return -1;
    }
    return 0;
}

/* A cursor over loaded bytes; reads past the end yield zeros and set bad,
 * so callers check once at the end. */
struct reader {
    const unsigned char *p;
    size_t len, pos;
    int bad;
};

static uint32_t get_u32(struct reader *r)
{
    if (r->len - r->pos < 4) {
        r->bad = 1;
        return 0;
    }
    const unsigned char *p = r->p + r->pos;
    r->pos += 4;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static uint64_t get_u64(struct reader *r)
{
    uint64_t lo = get_u32(r);
    return lo | (uint64_t)get_u32(r) << 32;
}

static void get_f32s(struct reader *r, float *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = get_u32(r);
        memcpy(&v[i], &bits, 4);
    }
}

static void get_f64s(struct reader *r, double *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t bits = get_u64(r);
        memcpy(&v[i], &bits, 8);
    }
}

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static size_t payload_bytes(size_t nparams, int obs_dim)
{
    return nparams * (4 + 8 + 8) + (size_t)obs_dim * 16 + 8;
}

static int put_payload(fiber_buf *b, const struct es_state *st)
{
    return put_f32s(b, st->theta, st->nparams) ||
           put_f64s(b, st->adam.m, st->nparams) ||
           put_f64s(b, st->adam.v, st->nparams) ||
           put_f64s(b, st->obs.sum, (size_t)st->obs.dim) ||
           put_f64s(b, st->obs.sumsq, (size_t)st->obs.dim) ||
           put_f64s(b, &st->obs.count, 1);
}

static int put_header(fiber_buf *b, const struct es_state *st,
                      const fiber_buf *payload)
{
    char name[16] = {0};
    snprintf(name, sizeof name, "%s", st->env->name);
    return fiber_buf_append(b, CKPT_MAGIC, 8) || put_u32(b, CKPT_VERSION) ||
           put_u32(b, CKPT_HEADER) || fiber_buf_append(b, name, 16) ||
           put_u32(b, (uint32_t)st->shape.obs_dim) ||
           put_u32(b, (uint32_t)st->shape.hidden) ||
           put_u32(b, (uint32_t)st->shape.act_dim) ||
           put_u32(b, st->noise_log2) || put_u64(b, st->nparams) ||
           put_u64(b, st->iteration) || put_u64(b, st->adam.t) ||
           put_u64(b, st->rng) || put_u64(b, st->noise_seed) ||
           put_u64(b, payload->len) ||
           put_u64(b, fnv1a(payload->data, payload->len));
}

static int write_file(const char *path, const fiber_buf *b, char *err,
                      size_t errlen)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
        snprintf(err, errlen, "checkpoint path too long");
        return -1;
    }
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(b->data, 1, b->len, f) == b->len;
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    if (f && fclose(f) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = 0;
        saved = errno;
    }
    if (!ok) {
        snprintf(err, errlen, "cannot write checkpoint %s: %s", path,
                 strerror(saved));
        unlink(tmp);
        return -1;
    }
    return 0;
}

int es_checkpoint_save(const struct es_state *st, const char *path,
                       char *err, size_t errlen)
{
    fiber_buf payload = {0}, file = {0};
    int rc = put_payload(&payload, st) || put_header(&file, st, &payload) ||
             fiber_buf_append(&file, payload.data, payload.len);
    if (rc)
        snprintf(err, errlen, "out of memory writing checkpoint");
    else if (file.len != CKPT_HEADER + payload.len) {
        snprintf(err, errlen, "internal error: header of %zu bytes",
                 file.len - payload.len);
        rc = -1;
    } else {
        rc = write_file(path, &file, err, errlen);
    }
    fiber_buf_free(&payload);
    fiber_buf_free(&file);
    return rc ? -1 : 0;
}

/* Reads the whole file into b. */
static int read_file(const char *path, fiber_buf *b, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open checkpoint %s: %s", path,
                 strerror(errno));
        return -1;
    }
    unsigned char chunk[65536];
    size_t n;
    int rc = 0;
    while (rc == 0 && (n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (b->len + n > CKPT_MAX_BYTES || fiber_buf_append(b, chunk, n)) {
            snprintf(err, errlen, "checkpoint %s is too large", path);
            rc = -1;
        }
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, errlen, "cannot read checkpoint %s", path);
        rc = -1;
    }
    fclose(f);
    return rc;
}

struct ckpt_header {
    uint32_t version, header_bytes;
    char env[17];
    uint32_t obs_dim, hidden, act_dim, noise_log2;
    uint64_t nparams, iteration, adam_t, rng, noise_seed, payload, hash;
};

static int parse_header(struct reader *r, struct ckpt_header *h,
                        const char *path, char *err, size_t errlen)
{
    if (r->len < 16 || memcmp(r->p, CKPT_MAGIC, 8) != 0) {
        snprintf(err, errlen, "%s is not an ES checkpoint", path);
        return -1;
    }
    r->pos = 8;
    h->version = get_u32(r);
    h->header_bytes = get_u32(r);
    if (h->version != CKPT_VERSION) {
        snprintf(err, errlen, "%s is checkpoint format %u; this program "
                 "reads format %u", path, h->version, CKPT_VERSION);
        return -1;
    }
    memset(h->env, 0, sizeof h->env);
    if (r->len - r->pos >= 16)
        memcpy(h->env, r->p + r->pos, 16);
    r->pos += 16;
    h->obs_dim = get_u32(r);
    h->hidden = get_u32(r);
    h->act_dim = get_u32(r);
    h->noise_log2 = get_u32(r);
    h->nparams = get_u64(r);
    h->iteration = get_u64(r);
    h->adam_t = get_u64(r);
    h->rng = get_u64(r);
    h->noise_seed = get_u64(r);
    h->payload = get_u64(r);
    h->hash = get_u64(r);
    if (r->bad || r->pos != CKPT_HEADER || h->header_bytes != CKPT_HEADER) {
        snprintf(err, errlen, "%s: truncated or malformed header", path);
        return -1;
    }
    return 0;
}

/* Checks the header against the environment it names and the payload. */
static const struct env_def *check_header(const struct ckpt_header *h,
                                          const struct reader *r,
                                          const char *path, char *err,
                                          size_t errlen)
{
    const struct env_def *e = es_env_find(h->env);
    if (!e) {
        snprintf(err, errlen, "%s: unknown environment '%s'", path, h->env);
        return NULL;
    }
    struct policy_shape s = {e->obs_dim, (int)h->hidden, e->act_dim};
    if ((int)h->obs_dim != e->obs_dim || (int)h->act_dim != e->act_dim ||
        h->hidden < 1 || h->hidden > ES_MAX_HIDDEN ||
        h->nparams != policy_nparams(&s) || h->noise_log2 < 10 ||
        h->noise_log2 > 28) {
        snprintf(err, errlen, "%s: shape %u-%u-%u does not fit %s", path,
                 h->obs_dim, h->hidden, h->act_dim, e->name);
        return NULL;
    }
    if (h->payload != payload_bytes(h->nparams, e->obs_dim) ||
        r->len - r->pos != h->payload ||
        fnv1a(r->p + r->pos, h->payload) != h->hash) {
        snprintf(err, errlen, "%s is damaged (truncated or corrupted "
                 "payload)", path);
        return NULL;
    }
    return e;
}

int es_checkpoint_load(struct es_state *st, const char *path, char *err,
                       size_t errlen)
{
    fiber_buf b = {0};
    struct ckpt_header h;
    int rc = read_file(path, &b, err, errlen);
    struct reader r = {b.data, b.len, 0, 0};
    const struct env_def *e = NULL;
    if (rc == 0 && parse_header(&r, &h, path, err, errlen) == 0)
        e = check_header(&h, &r, path, err, errlen);
    if (!e || es_state_alloc(st, e, (int)h.hidden) != 0) {
        if (e)
            snprintf(err, errlen, "out of memory loading %s", path);
        fiber_buf_free(&b);
        return -1;
    }
    get_f32s(&r, st->theta, st->nparams);
    get_f64s(&r, st->adam.m, st->nparams);
    get_f64s(&r, st->adam.v, st->nparams);
    get_f64s(&r, st->obs.sum, (size_t)st->obs.dim);
    get_f64s(&r, st->obs.sumsq, (size_t)st->obs.dim);
    get_f64s(&r, &st->obs.count, 1);
    st->iteration = h.iteration;
    st->adam.t = h.adam_t;
    st->rng = h.rng;
    st->noise_seed = h.noise_seed;
    st->noise_log2 = h.noise_log2;
    fiber_buf_free(&b);
    return 0;
}
