/*
 * test_shdict.c -- the shared-memory dict (manager/shdict.c): its operations
 * against a model, growth past the first file size and up to the limit,
 * two processes on one memfd mapped at their own addresses, a process
 * killed at every crash point (then the dict must be one the operations
 * so far could leave, whole), and a corrupted region (FIBER_EPROTO, never
 * a crash).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sodium.h>

#include "base/common.h"
#include "manager/shdict.h"
#include "harness.h"

/* ---- regions ------------------------------------------------------------ */

/* A view of fd at an address of its own: reserve bytes of MAP_SHARED, then
 * an inaccessible page, so a stray access past the reserve faults. */
static struct fb_shdict view_of(int fd, size_t reserve, size_t off)
{
    uint8_t *p = mmap(NULL, reserve + 4096, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(p != MAP_FAILED);
    CHECK(mmap(p, reserve, PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_NORESERVE | MAP_FIXED, fd, 0) == p);
    struct fb_shdict d = {p, reserve, fd, off};
    return d;
}

static void view_close(struct fb_shdict *d)
{
    munmap(d->base, d->reserve + 4096);
}

/* A new memfd with a formatted dict at off. */
static struct fb_shdict dict_new(size_t reserve, size_t off)
{
    int fd = memfd_create("test-shdict", MFD_CLOEXEC);
    CHECK(fd >= 0);
    CHECK(ftruncate(fd, (off_t)(off + FB_SHDICT_INITIAL)) == 0);
    struct fb_shdict d = view_of(fd, reserve, off);
    unsigned char key[crypto_shorthash_KEYBYTES];
    randombytes_buf(key, sizeof key);
    memset(d.base, 0xab, off); /* the caller's bytes: must stay */
    CHECK_OK(fb_shdict_format(&d, key));
    return d;
}

static void dict_free(struct fb_shdict *d)
{
    int fd = d->fd;
    view_close(d);
    close(fd);
}

static void set_s(const struct fb_shdict *d, const char *k, const char *v)
{
    CHECK_OK(fb_shdict_set(d, k, strlen(k), v, strlen(v)));
}

/* k's value as a NUL-terminated string (the caller frees it). */
static char *get_s(const struct fb_shdict *d, const char *k)
{
    fiber_buf b = {0};
    CHECK_OK(fb_shdict_get(d, k, strlen(k), &b));
    CHECK_OK(fiber_buf_append(&b, "", 1));
    return (char *)b.data;
}

static void check_get(const struct fb_shdict *d, const char *k,
                      const char *want)
{
    char *v = get_s(d, k);
    CHECK_STR(v, want);
    free(v);
}

/* The keys joined with ',' (so "a,b,c"). */
static char *keys_s(const struct fb_shdict *d)
{
    fiber_buf all = {0}, out = {0};
    CHECK_OK(fb_shdict_keys(d, &all));
    for (size_t at = 0; at < all.len;) {
        uint32_t n;
        CHECK(all.len - at >= 4);
        memcpy(&n, all.data + at, 4);
        CHECK(all.len - at - 4 >= n);
        if (out.len)
            CHECK_OK(fiber_buf_append(&out, ",", 1));
        CHECK_OK(fiber_buf_append(&out, all.data + at + 4, n));
        at += 4 + n;
    }
    CHECK_OK(fiber_buf_append(&out, "", 1));
    fiber_buf_free(&all);
    return (char *)out.data;
}

static void check_keys(const struct fb_shdict *d, const char *want)
{
    char *k = keys_s(d);
    CHECK_STR(k, want);
    free(k);
}

static size_t len_of(const struct fb_shdict *d)
{
    size_t n = 0;
    CHECK_OK(fb_shdict_len(d, &n));
    return n;
}

/* ---- a model: keys and values in insertion order ------------------------ */

struct model {
    size_t n, cap;
    fiber_buf *k, *v;
};

static size_t m_find(const struct model *m, const void *k, size_t kl)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->k[i].len == kl && (kl == 0 || !memcmp(m->k[i].data, k, kl)))
            return i;
    return SIZE_MAX;
}

static void m_set(struct model *m, const void *k, size_t kl, const void *v,
                  size_t vl)
{
    size_t i = m_find(m, k, kl);
    if (i == SIZE_MAX) {
        if (m->n == m->cap) {
            m->cap = m->cap ? 2 * m->cap : 64;
            m->k = realloc(m->k, m->cap * sizeof *m->k);
            m->v = realloc(m->v, m->cap * sizeof *m->v);
            CHECK(m->k && m->v);
        }
        i = m->n++;
        memset(&m->k[i], 0, sizeof m->k[i]);
        memset(&m->v[i], 0, sizeof m->v[i]);
        CHECK_OK(fiber_buf_append(&m->k[i], k, kl));
    }
    m->v[i].len = 0;
    CHECK_OK(fiber_buf_append(&m->v[i], v, vl));
}

/* Returns 1 if k was there. */
static int m_del(struct model *m, const void *k, size_t kl)
{
    size_t i = m_find(m, k, kl);
    if (i == SIZE_MAX)
        return 0;
    fiber_buf_free(&m->k[i]);
    fiber_buf_free(&m->v[i]);
    memmove(&m->k[i], &m->k[i + 1], (m->n - i - 1) * sizeof *m->k);
    memmove(&m->v[i], &m->v[i + 1], (m->n - i - 1) * sizeof *m->v);
    m->n--;
    return 1;
}

static void m_free(struct model *m)
{
    for (size_t i = 0; i < m->n; i++) {
        fiber_buf_free(&m->k[i]);
        fiber_buf_free(&m->v[i]);
    }
    free(m->k);
    free(m->v);
    memset(m, 0, sizeof *m);
}

static int buf_same(const fiber_buf *a, const fiber_buf *b)
{
    return a->len == b->len && (!a->len || !memcmp(a->data, b->data, a->len));
}

static void snap_item(fiber_buf *out, const void *k, uint32_t kl,
                      const void *v, uint64_t vl)
{
    CHECK_OK(fiber_buf_append(out, &kl, sizeof kl));
    CHECK_OK(fiber_buf_append(out, k, kl));
    CHECK_OK(fiber_buf_append(out, &vl, sizeof vl));
    CHECK_OK(fiber_buf_append(out, v, vl));
}

/* The model as (key, value) pairs in order, as dict_snapshot makes. */
static void m_snapshot(const struct model *m, fiber_buf *out)
{
    out->len = 0;
    for (size_t i = 0; i < m->n; i++)
        snap_item(out, m->k[i].data, (uint32_t)m->k[i].len, m->v[i].data,
                  m->v[i].len);
}

/* The dict as (key, value) pairs in its keys' order; checks its length. */
static void dict_snapshot(const struct fb_shdict *d, fiber_buf *out)
{
    fiber_buf all = {0}, v = {0};
    CHECK_OK(fb_shdict_keys(d, &all));
    size_t n = 0;
    out->len = 0;
    for (size_t at = 0; at < all.len; n++) {
        uint32_t kl;
        memcpy(&kl, all.data + at, 4);
        v.len = 0;
        CHECK_OK(fb_shdict_get(d, all.data + at + 4, kl, &v));
        snap_item(out, all.data + at + 4, kl, v.data, v.len);
        at += 4 + kl;
    }
    CHECK_EQ(n, len_of(d));
    fiber_buf_free(&all);
    fiber_buf_free(&v);
}

static void check_model(const struct fb_shdict *d, const struct model *m)
{
    fiber_buf a = {0}, b = {0};
    dict_snapshot(d, &a);
    m_snapshot(m, &b);
    CHECK_EQ(len_of(d), m->n);
    CHECK(buf_same(&a, &b));
    CHECK_OK(fb_shdict_check(d));
    fiber_buf_free(&a);
    fiber_buf_free(&b);
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* ---- operations --------------------------------------------------------- */

TEST(set_get_del_len_keys)
{
    struct fb_shdict d = dict_new((size_t)1 << 20, 128);
    CHECK_EQ(len_of(&d), 0);
    check_keys(&d, "");
    set_s(&d, "apple", "red");
    set_s(&d, "banana", "yellow");
    set_s(&d, "cherry", "dark red");
    CHECK_EQ(len_of(&d), 3);
    check_get(&d, "banana", "yellow");
    set_s(&d, "banana", "a much longer value than the one before it");
    check_keys(&d, "apple,banana,cherry"); /* an overwrite keeps its place */
    check_get(&d, "banana", "a much longer value than the one before it");
    CHECK_OK(fb_shdict_del(&d, "apple", 5));
    check_keys(&d, "banana,cherry");
    set_s(&d, "apple", "green"); /* a deleted key comes back last */
    check_keys(&d, "banana,cherry,apple");
    CHECK_EQ(len_of(&d), 3);

    fiber_buf out = {0};
    CHECK_OK(fiber_buf_append(&out, "xy", 2));
    CHECK_OK(fb_shdict_get(&d, "cherry", 6, &out)); /* appends */
    CHECK(out.len == 10 && !memcmp(out.data, "xydark red", 10));
    CHECK_ERR(fb_shdict_get(&d, "durian", 6, &out), FIBER_ENOKEY);
    CHECK_STR(fiber_last_error(), "no such key (6 bytes)");
    CHECK_EQ(out.len, 10);
    CHECK_ERR(fb_shdict_del(&d, "durian", 6), FIBER_ENOKEY);
    CHECK_STR(fiber_last_error(), "no such key (6 bytes)");
    CHECK_OK(fb_shdict_del(&d, "apple", 5));
    CHECK_ERR(fb_shdict_del(&d, "apple", 5), FIBER_ENOKEY);

    /* The empty key and the empty value. */
    CHECK_OK(fb_shdict_set(&d, "", 0, "", 0));
    out.len = 0;
    CHECK_OK(fb_shdict_get(&d, "", 0, &out));
    CHECK_EQ(out.len, 0);
    CHECK_OK(fb_shdict_set(&d, NULL, 0, "x", 1));
    CHECK_OK(fb_shdict_set(&d, "e", 1, NULL, 0));
    check_keys(&d, "banana,cherry,,e");
    check_get(&d, "", "x");
    check_get(&d, "e", "");
    CHECK_OK(fb_shdict_del(&d, "", 0));
    CHECK_ERR(fb_shdict_get(&d, "", 0, &out), FIBER_ENOKEY);
    CHECK_STR(fiber_last_error(), "no such key (0 bytes)");
    check_keys(&d, "banana,cherry,e");
    CHECK_OK(fb_shdict_check(&d));
    for (size_t i = 0; i < 128; i++) /* the caller's bytes are untouched */
        CHECK_EQ(d.base[i], 0xab);
    fiber_buf_free(&out);
    dict_free(&d);
}

TEST(random_operations_match_a_model)
{
    struct fb_shdict d = dict_new((size_t)64 << 20, 0);
    struct model m = {0};
    uint64_t seed = 88172645463325252ULL;
    char k[32], v[600];
    for (int i = 0; i < 30000; i++) {
        uint64_t r = rnd(&seed);
        int kl = snprintf(k, sizeof k, "k%d", (int)(r % 500));
        size_t vl = (r >> 20) % 400;
        memset(v, 'a' + (int)(r % 26), vl);
        if (r % 10 < 6) {
            CHECK_OK(fb_shdict_set(&d, k, (size_t)kl, v, vl));
            m_set(&m, k, (size_t)kl, v, vl);
        } else {
            int had = m_del(&m, k, (size_t)kl);
            CHECK_ERR(fb_shdict_del(&d, k, (size_t)kl),
                      had ? 0 : FIBER_ENOKEY);
        }
        if (i % 5000 == 0)
            check_model(&d, &m);
    }
    check_model(&d, &m);
    m_free(&m);
    dict_free(&d);
}

TEST(many_keys_grow_the_file)
{
    struct fb_shdict d = dict_new((size_t)1 << 30, 64);
    char k[32], v[32];
    enum { N = 100000 };
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof k, "key-%d", i);
        snprintf(v, sizeof v, "value-%d", i * 7);
        set_s(&d, k, v);
    }
    CHECK_EQ(len_of(&d), N);
    for (int i = 0; i < N; i += 97) {
        snprintf(k, sizeof k, "key-%d", i);
        snprintf(v, sizeof v, "value-%d", i * 7);
        check_get(&d, k, v);
    }
    fiber_buf all = {0};
    CHECK_OK(fb_shdict_keys(&d, &all));
    size_t at = 0;
    for (int i = 0; i < N; i++) { /* in insertion order */
        uint32_t n;
        memcpy(&n, all.data + at, 4);
        snprintf(k, sizeof k, "key-%d", i);
        CHECK(n == strlen(k) && !memcmp(all.data + at + 4, k, n));
        at += 4 + n;
    }
    CHECK_EQ(at, all.len);
    for (int i = 0; i < N; i += 2) {
        snprintf(k, sizeof k, "key-%d", i);
        CHECK_OK(fb_shdict_del(&d, k, strlen(k)));
    }
    CHECK_EQ(len_of(&d), N / 2);
    CHECK_OK(fb_shdict_check(&d));
    check_get(&d, "key-99999", "value-699993");
    CHECK_ERR(fb_shdict_get(&d, "key-99998", 9, &all), FIBER_ENOKEY);
    fiber_buf_free(&all);
    dict_free(&d);
}

TEST(big_values)
{
    struct fb_shdict d = dict_new((size_t)1 << 30, 0);
    size_t n = (size_t)1 << 20;
    unsigned char *v = malloc(3 * n);
    CHECK(v != NULL);
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < 8; i++) {
            size_t vl = round ? 3 * n - (size_t)i : n;
            for (size_t j = 0; j < vl; j++)
                v[j] = (unsigned char)(j * 31 + (size_t)i + (size_t)round);
            char k[16];
            snprintf(k, sizeof k, "big%d", i);
            CHECK_OK(fb_shdict_set(&d, k, strlen(k), v, vl));
        }
    for (int i = 0; i < 8; i++) {
        char k[16];
        fiber_buf out = {0};
        snprintf(k, sizeof k, "big%d", i);
        CHECK_OK(fb_shdict_get(&d, k, strlen(k), &out));
        CHECK_EQ(out.len, 3 * n - (size_t)i);
        for (size_t j = 0; j < out.len; j++)
            if (out.data[j] != (unsigned char)(j * 31 + (size_t)i + 1))
                TH_FAIL("big%d byte %zu differs", i, j);
        fiber_buf_free(&out);
    }
    check_keys(&d, "big0,big1,big2,big3,big4,big5,big6,big7");
    CHECK_OK(fb_shdict_check(&d));
    free(v);
    dict_free(&d);
}

TEST(the_reserve_is_the_limit)
{
    size_t off = 4096, reserve = off + ((size_t)512 << 10);
    struct fb_shdict d = dict_new(reserve, off);
    struct model m = {0};
    char v[16000], k[16];
    int i, rc = 0;
    for (i = 0; i < 1000; i++) {
        memset(v, 'a' + i % 26, sizeof v);
        snprintf(k, sizeof k, "k%d", i);
        rc = fb_shdict_set(&d, k, strlen(k), v, sizeof v);
        if (rc)
            break;
        m_set(&m, k, strlen(k), v, sizeof v);
    }
    CHECK_ERR(rc, FIBER_ENOMEM);
    CHECK_CONTAINS(fiber_last_error(), "limit of 524288 bytes");
    CHECK(i > 10);
    check_model(&d, &m); /* intact */
    /* A value larger than the whole limit, and an overwrite that does not
     * fit: the old value stays. */
    CHECK_OK(fb_shdict_set(&d, "k0", 2, v, 0));
    m_set(&m, "k0", 2, v, 0);
    char *huge = calloc(1, (size_t)600 << 10);
    CHECK(huge != NULL);
    CHECK_ERR(fb_shdict_set(&d, "k1", 2, huge, (size_t)600 << 10),
              FIBER_ENOMEM);
    free(huge);
    check_model(&d, &m);
    /* Room made by deleting is used again. */
    CHECK_OK(fb_shdict_del(&d, "k3", 2));
    m_del(&m, "k3", 2);
    CHECK_OK(fb_shdict_set(&d, "again", 5, v, sizeof v));
    m_set(&m, "again", 5, v, sizeof v);
    check_model(&d, &m);
    m_free(&m);
    dict_free(&d);
}

TEST(bad_views_and_arguments)
{
    struct fb_shdict d = dict_new((size_t)1 << 20, 0);
    struct fb_shdict odd = d;
    odd.off = 32;
    CHECK_ERR(fb_shdict_set(&odd, "a", 1, "b", 1), FIBER_EINVAL);
    odd.off = 4096; /* no dict there */
    CHECK_ERR(fb_shdict_set(&odd, "a", 1, "b", 1), FIBER_EPROTO);
    CHECK_CONTAINS(fiber_last_error(), "the dict's shared memory is corrupt");
    unsigned char key[crypto_shorthash_KEYBYTES] = {0};
    struct fb_shdict small = d;
    small.reserve = 4096;
    CHECK_ERR(fb_shdict_format(&small, key), FIBER_EINVAL);
    odd.off = FB_SHDICT_INITIAL; /* past the file's end */
    CHECK_ERR(fb_shdict_format(&odd, key), FIBER_EINVAL);
    dict_free(&d);
}

/* ---- two processes ------------------------------------------------------ */

/* Plays process `who` ('A' or 'B'): random sets and dels of its own keys
 * (into m; on d unless d is NULL) and of the shared keys S0..S19. */
static void play(const struct fb_shdict *d, char who, uint64_t seed,
                 struct model *m, int rounds)
{
    char k[32], v[400];
    fiber_buf got = {0};
    for (int i = 0; i < rounds; i++) {
        uint64_t r = rnd(&seed);
        int shared = r % 10 >= 8, set = (r >> 8) % 10 < 6;
        int kl = shared ? snprintf(k, sizeof k, "S%d", (int)((r >> 16) % 20))
                        : snprintf(k, sizeof k, "%c%d", who,
                                   (int)((r >> 16) % 200));
        int vl = snprintf(v, sizeof v, "%c-%d-", who, i);
        size_t pad = (r >> 32) % 300;
        memset(v + vl, who, pad);
        vl += (int)pad;
        if (shared) {
            if (d && set)
                CHECK_OK(fb_shdict_set(d, k, (size_t)kl, v, (size_t)vl));
            else if (d) {
                int rc = fb_shdict_del(d, k, (size_t)kl);
                CHECK(rc == 0 || rc == FIBER_ENOKEY);
            }
            continue;
        }
        if (set) {
            m_set(m, k, (size_t)kl, v, (size_t)vl);
            if (d)
                CHECK_OK(fb_shdict_set(d, k, (size_t)kl, v, (size_t)vl));
        } else {
            int had = m_del(m, k, (size_t)kl);
            if (d)
                CHECK_ERR(fb_shdict_del(d, k, (size_t)kl),
                          had ? 0 : FIBER_ENOKEY);
        }
        if (d && i % 64 == 0) { /* the other process cannot touch ours */
            size_t at = m_find(m, k, (size_t)kl);
            got.len = 0;
            CHECK_ERR(fb_shdict_get(d, k, (size_t)kl, &got),
                      at == SIZE_MAX ? FIBER_ENOKEY : 0);
            if (at != SIZE_MAX)
                CHECK(got.len == m->v[at].len &&
                      !memcmp(got.data, m->v[at].data, got.len));
        }
    }
    fiber_buf_free(&got);
}

/* The dict's pairs whose key starts with c, in order, as a snapshot. */
static void dict_snapshot_of(const struct fb_shdict *d, char c,
                             fiber_buf *out, size_t *shared)
{
    fiber_buf all = {0};
    dict_snapshot(d, &all);
    out->len = 0;
    *shared = 0;
    for (size_t at = 0; at < all.len;) {
        uint32_t kl;
        uint64_t vl;
        memcpy(&kl, all.data + at, 4);
        memcpy(&vl, all.data + at + 4 + kl, 8);
        const unsigned char *k = all.data + at + 4, *v = k + kl + 8;
        if (kl && k[0] == c)
            snap_item(out, k, kl, v, vl);
        if (kl && k[0] == 'S') {
            (*shared)++;
            CHECK(vl >= 3 && (v[0] == 'A' || v[0] == 'B') && v[1] == '-');
        }
        at += 4 + kl + 8 + vl;
    }
    fiber_buf_free(&all);
}

TEST(two_processes_share_one_dict)
{
    enum { ROUNDS = 20000 };
    struct fb_shdict d = dict_new((size_t)256 << 20, 192);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        struct fb_shdict mine = view_of(d.fd, d.reserve, d.off);
        struct model m = {0};
        play(&mine, 'B', 0x9E3779B97F4A7C15ULL, &m, ROUNDS);
        _exit(0);
    }
    struct model a = {0}, b = {0};
    play(&d, 'A', 0x2545F4914F6CDD1DULL, &a, ROUNDS);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    play(NULL, 'B', 0x9E3779B97F4A7C15ULL, &b, ROUNDS); /* B's model */
    fiber_buf got = {0}, want = {0};
    size_t shared;
    dict_snapshot_of(&d, 'A', &got, &shared);
    m_snapshot(&a, &want);
    CHECK(buf_same(&got, &want));
    dict_snapshot_of(&d, 'B', &got, &shared);
    m_snapshot(&b, &want);
    CHECK(buf_same(&got, &want));
    CHECK_EQ(len_of(&d), a.n + b.n + shared);
    CHECK_OK(fb_shdict_check(&d));
    fiber_buf_free(&got);
    fiber_buf_free(&want);
    m_free(&a);
    m_free(&b);
    dict_free(&d);
}

/* ---- crash points ------------------------------------------------------- */

/* The operations a killed child runs, in order. */
struct op {
    int del;
    char key[16];
    size_t vl;
    unsigned char fill;
};

static unsigned char crash_value[256 << 10];

static size_t crash_ops(struct op *ops)
{
    size_t n = 0;
    ops[n++] = (struct op){0, "k5", 4, 'x'};     /* overwrite: pops k39's */
    ops[n++] = (struct op){0, "new1", 2, 'y'};   /* a new key */
    ops[n++] = (struct op){1, "k7", 0, 0};       /* a del */
    ops[n++] = (struct op){0, "big", 200 << 10, 'z'}; /* grows the file */
    for (int i = 0; i < 200; i++) {              /* rehash the index */
        ops[n] = (struct op){0, "", 3, (unsigned char)('a' + i % 26)};
        snprintf(ops[n++].key, sizeof ops[0].key, "m%d", i);
    }
    return n;
}

static int op_run(const struct fb_shdict *d, const struct op *o)
{
    memset(crash_value, o->fill, o->vl);
    if (o->del)
        return fb_shdict_del(d, o->key, strlen(o->key));
    return fb_shdict_set(d, o->key, strlen(o->key), crash_value, o->vl);
}

static void op_model(struct model *m, const struct op *o)
{
    memset(crash_value, o->fill, o->vl);
    if (o->del)
        m_del(m, o->key, strlen(o->key));
    else
        m_set(m, o->key, strlen(o->key), crash_value, o->vl);
}

/* 40 keys k0..k39, then k39 deleted (a free block of their size). */
static void crash_setup(const struct fb_shdict *d, struct model *m)
{
    char k[16], v[16];
    for (int i = 0; i < 40; i++) {
        snprintf(k, sizeof k, "k%d", i);
        snprintf(v, sizeof v, "v%d-0", i);
        if (d)
            set_s(d, k, v);
        m_set(m, k, strlen(k), v, strlen(v));
    }
    if (d)
        CHECK_OK(fb_shdict_del(d, "k39", 3));
    m_del(m, "k39", 3);
}

/* Forks a child that maps its own view, sets the crash point and runs ops
 * (or a len, if ops is NULL); checks that it was killed there. */
static void crash_child(const struct fb_shdict *d, int point,
                        const struct op *ops, size_t n)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        struct fb_shdict mine = view_of(d->fd, d->reserve, d->off);
        size_t len;
        fb_shdict_crash_at = point;
        if (!ops && fb_shdict_len(&mine, &len) != 0)
            _exit(2);
        for (size_t i = 0; ops && i < n; i++)
            if (op_run(&mine, &ops[i]) != 0)
                _exit(2);
        _exit(3); /* the point was never reached */
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
        TH_FAIL("crash point %d: the child was not killed there (status "
                "%#x)", point, st);
}

/* After a crash: the dict must be the model after some number of the ops
 * (want, or any if want < 0), and usable.  Returns that number. */
static size_t crash_verify(const struct fb_shdict *d, const struct op *ops,
                           size_t n, int point, long want)
{
    struct model m = {0};
    fiber_buf got = {0}, snap = {0};
    crash_setup(NULL, &m);
    dict_snapshot(d, &got); /* its first call repairs */
    size_t found = SIZE_MAX;
    for (size_t j = 0; j <= n && found == SIZE_MAX; j++) {
        m_snapshot(&m, &snap);
        if (buf_same(&snap, &got))
            found = j;
        else if (j < n)
            op_model(&m, &ops[j]);
    }
    if (found == SIZE_MAX)
        TH_FAIL("crash point %d: the dict is no state the operations "
                "could leave", point);
    if (want >= 0 && found != (size_t)want)
        TH_FAIL("crash point %d: %zu operations done, not %ld", point,
                found, want);
    CHECK_OK(fb_shdict_check(d));
    for (size_t j = found; j < n; j++) { /* and it goes on working */
        CHECK_OK(op_run(d, &ops[j]));
        op_model(&m, &ops[j]);
    }
    set_s(d, "after", "crash");
    m_set(&m, "after", 5, "crash", 5);
    CHECK_OK(fb_shdict_del(d, "k0", 2));
    m_del(&m, "k0", 2);
    check_model(d, &m);
    fiber_buf_free(&got);
    fiber_buf_free(&snap);
    m_free(&m);
    return found;
}

TEST(a_process_killed_at_each_crash_point)
{
    static struct op ops[256];
    size_t n = crash_ops(ops);
    /* The ops done before the point's op (the points after a set's or a
     * del's commit count it done), or -1 where it depends on the index. */
    static const struct {
        int point;
        long done;
    } known[] = {
        {FB_SHDICT_CP_ALLOC_POP, 0},    {FB_SHDICT_CP_SET_HALF, 0},
        {FB_SHDICT_CP_SET_WRITTEN, 0},  {FB_SHDICT_CP_SET_LIVE, 1},
        {FB_SHDICT_CP_SET_INDEXED, 1},  {FB_SHDICT_CP_SET_OLD_FREE, 1},
        {FB_SHDICT_CP_SET_DONE, 1},     {FB_SHDICT_CP_DEL_FREE, 3},
        {FB_SHDICT_CP_DEL_UNINDEXED, 3}, {FB_SHDICT_CP_DEL_COUNTED, 3},
        {FB_SHDICT_CP_GROW_FILE, 3},    {FB_SHDICT_CP_GROW_SIZE, 3},
        {FB_SHDICT_CP_BUMP_HDR, 3},
    };
    long done[FB_SHDICT_CP_COUNT + 1];
    for (int p = 0; p <= FB_SHDICT_CP_COUNT; p++)
        done[p] = -1;
    for (size_t i = 0; i < FB_ARRAY_LEN(known); i++)
        done[known[i].point] = known[i].done;
    for (int p = 1; p <= FB_SHDICT_CP_COUNT; p++) {
        struct fb_shdict d = dict_new((size_t)64 << 20, 256);
        struct model base = {0};
        crash_setup(&d, &base);
        if (p == FB_SHDICT_CP_REPAIR_SWEPT || p == FB_SHDICT_CP_REPAIR_HALF) {
            /* A set killed after its commit, then its repairer killed. */
            crash_child(&d, FB_SHDICT_CP_SET_LIVE, ops, n);
            crash_child(&d, p, NULL, 0);
            done[p] = 1;
        } else {
            crash_child(&d, p, ops, n);
        }
        size_t j = crash_verify(&d, ops, n, p, done[p]);
        fprintf(stderr, "crash point %d: %zu ops done\n", p, j);
        m_free(&base);
        dict_free(&d);
    }
}

/* Random sets and dels of keys who0..who99: op number c->i from c->seed,
 * on d (if not NULL) and m (if not NULL). */
struct churn {
    uint64_t seed;
    int i;
    char who;
};

static void churn_step(const struct fb_shdict *d, struct model *m,
                       struct churn *c)
{
    char k[16], v[200];
    uint64_t r = rnd(&c->seed);
    int kl = snprintf(k, sizeof k, "%c%d", c->who, (int)(r % 100));
    size_t vl = (size_t)snprintf(v, sizeof v, "%d-", c->i);
    memset(v + vl, 'a' + c->i % 26, (r >> 24) % 150);
    vl += (r >> 24) % 150;
    c->i++;
    if (r % 3) {
        if (d)
            CHECK_OK(fb_shdict_set(d, k, (size_t)kl, v, vl));
        if (m)
            m_set(m, k, (size_t)kl, v, vl);
        return;
    }
    int had = m ? m_del(m, k, (size_t)kl) : 1;
    if (d) {
        int rc = fb_shdict_del(d, k, (size_t)kl);
        CHECK(rc == 0 || rc == FIBER_ENOKEY);
        CHECK(!m || rc == (had ? 0 : FIBER_ENOKEY));
    }
}

enum { CHURN_OPS = 4000 };

/* Finds the prefix of c's operations that left the dict's keys of c->who
 * as they are (c and m then stand after it); fails if there is none. */
static int churn_find(const struct fb_shdict *d, struct churn *c,
                      struct model *m)
{
    fiber_buf got = {0}, snap = {0};
    size_t shared;
    int found = -1;
    dict_snapshot_of(d, c->who, &got, &shared);
    for (int j = 0; j <= CHURN_OPS && found < 0; j++) {
        m_snapshot(m, &snap);
        if (buf_same(&snap, &got))
            found = j;
        else if (j < CHURN_OPS)
            churn_step(NULL, m, c);
    }
    if (found < 0)
        TH_FAIL("the keys of %c are no state its operations could leave",
                c->who);
    fiber_buf_free(&got);
    fiber_buf_free(&snap);
    return found;
}

/* Two children churn keys of their own, each mapping the memfd; both are
 * killed at random times, one while the other may wait for the lock. */
TEST(processes_killed_at_random_times)
{
    uint64_t seed = 0xC0FFEE1234567ULL;
    int mid_way = 0;
    for (int trial = 0; trial < 40; trial++) {
        struct fb_shdict d = dict_new((size_t)64 << 20, 0);
        struct churn c[2] = {{rnd(&seed), 0, 'A'}, {rnd(&seed), 0, 'B'}};
        pid_t pid[2];
        for (int p = 0; p < 2; p++) {
            CHECK((pid[p] = fork()) >= 0);
            if (pid[p] == 0) {
                struct fb_shdict mine = view_of(d.fd, d.reserve, d.off);
                while (c[p].i < CHURN_OPS)
                    churn_step(&mine, NULL, &c[p]);
                _exit(0);
            }
        }
        for (int p = 0; p < 2; p++) {
            int st;
            usleep((useconds_t)(rnd(&seed) % 4000));
            kill(pid[p], SIGKILL);
            CHECK(waitpid(pid[p], &st, 0) == pid[p]);
            CHECK(WIFSIGNALED(st) || (WIFEXITED(st) && !WEXITSTATUS(st)));
        }
        struct model m[2] = {{0}, {0}};
        for (int p = 0; p < 2; p++) /* c[p] is still at op 0 here */
            mid_way += churn_find(&d, &c[p], &m[p]) < CHURN_OPS;
        CHECK_OK(fb_shdict_check(&d));
        CHECK_EQ(len_of(&d), m[0].n + m[1].n);
        for (int p = 0; p < 2; p++) { /* the rest, done by us */
            while (c[p].i < CHURN_OPS)
                churn_step(&d, &m[p], &c[p]);
            fiber_buf got = {0}, want = {0};
            size_t shared;
            dict_snapshot_of(&d, c[p].who, &got, &shared);
            m_snapshot(&m[p], &want);
            CHECK(buf_same(&got, &want));
            fiber_buf_free(&got);
            fiber_buf_free(&want);
            m_free(&m[p]);
        }
        CHECK_OK(fb_shdict_check(&d));
        dict_free(&d);
    }
    fprintf(stderr, "%d of 80 children killed mid-way\n", mid_way);
}

/* The lock left unrecoverable (a holder died and the next one released it
 * without repairing): FIBER_ESTATE. */
TEST(an_unrecoverable_lock_is_estate)
{
    struct fb_shdict d = dict_new((size_t)1 << 20, 0);
    set_s(&d, "a", "b");
    pthread_mutex_t *lock = (pthread_mutex_t *)(d.base + d.off + 448);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        pthread_mutex_lock(lock);
        _exit(0);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK_EQ(pthread_mutex_lock(lock), EOWNERDEAD);
    CHECK_EQ(pthread_mutex_unlock(lock), 0);
    size_t n;
    CHECK_ERR(fb_shdict_len(&d, &n), FIBER_ESTATE);
    CHECK_CONTAINS(fiber_last_error(), "unrecoverable");
    CHECK_ERR(fb_shdict_set(&d, "a", 1, "c", 1), FIBER_ESTATE);
    dict_free(&d);
}

/* ---- a corrupted region ------------------------------------------------- */

/* shdict.c's header, layout 1: where the fields a test scribbles are. */
enum {
    H_NEEDS_REPAIR = 12,
    H_FILE_SIZE = 16,
    H_TOP = 32,
    H_COUNT = 56,
    H_INDEX = 64,
    H_FREE_HEAD = 72,
    H_LOCK = 448, /* to 488: never scribbled (a lock in pieces may hang) */
    H_LOCK_END = 512,
};

static uint64_t *hdr_u64(const struct fb_shdict *d, size_t at)
{
    return (uint64_t *)(d->base + d->off + at);
}

/* Every operation fails with FIBER_EPROTO or another code it may return,
 * and at least one with FIBER_EPROTO (if must).  Returns 1 if one did. */
static int ops_survive(const struct fb_shdict *d, int must)
{
    fiber_buf out = {0};
    size_t n;
    int proto = 0, rc[8];
    char v[300] = {0};
    rc[0] = fb_shdict_get(d, "k1", 2, &out);
    rc[1] = fb_shdict_set(d, "k2", 2, v, sizeof v);
    rc[2] = fb_shdict_set(d, "fresh", 5, "v", 1);
    rc[3] = fb_shdict_del(d, "k3", 2);
    rc[4] = fb_shdict_len(d, &n);
    rc[5] = fb_shdict_keys(d, &out);
    rc[6] = fb_shdict_get(d, "k100", 4, &out);
    rc[7] = fb_shdict_check(d);
    for (int i = 0; i < 8; i++) {
        if (rc[i] == FIBER_EPROTO)
            proto = 1;
        else if (rc[i] != 0 && rc[i] != FIBER_ENOKEY &&
                   rc[i] != FIBER_ENOMEM) {
            TH_FAIL("operation %d returned %s", i, fiber_errname(rc[i]));
        }
    }
    if (must && !proto)
        TH_FAIL("no operation saw the corruption");
    fiber_buf_free(&out);
    return proto;
}

static struct fb_shdict corrupt_new(void)
{
    struct fb_shdict d = dict_new((size_t)4 << 20, 64);
    char k[16], v[64];
    for (int i = 0; i < 200; i++) {
        snprintf(k, sizeof k, "k%d", i);
        snprintf(v, sizeof v, "value %d", i);
        set_s(&d, k, v);
    }
    for (int i = 150; i < 200; i++) {
        snprintf(k, sizeof k, "k%d", i);
        CHECK_OK(fb_shdict_del(&d, k, strlen(k)));
    }
    CHECK_OK(fb_shdict_check(&d));
    return d;
}

/* The first slot of the index that holds an entry. */
static uint64_t *first_slot(const struct fb_shdict *d)
{
    uint64_t *slot = (uint64_t *)(d->base + *hdr_u64(d, H_INDEX) + 64);
    while (slot[0] < 2)
        slot += 2;
    return slot;
}

TEST(a_corrupt_region_is_eproto)
{
    struct fb_shdict d;
    static const uint64_t bad[] = {12345, 1ULL << 40, 64, 0, UINT64_MAX};
    for (size_t i = 0; i < FB_ARRAY_LEN(bad); i++) {
        d = corrupt_new();
        *hdr_u64(&d, H_INDEX) = bad[i];
        ops_survive(&d, 1);
        CHECK_ERR(fb_shdict_get(&d, "k1", 2, &(fiber_buf){0}), FIBER_EPROTO);
        dict_free(&d);

        d = corrupt_new();
        *hdr_u64(&d, H_TOP) = bad[i];
        ops_survive(&d, 1);
        dict_free(&d);

        d = corrupt_new(); /* every slot's offset */
        uint8_t *ib = d.base + *hdr_u64(&d, H_INDEX);
        uint64_t *slot = (uint64_t *)(ib + 64);
        uint32_t cls;
        memcpy(&cls, ib + 4, 4);
        for (uint64_t s = 0; s < ((64ULL << cls) - 64) / 16; s++)
            if (slot[2 * s] >= 2)
                slot[2 * s] = bad[i] < 2 ? 2 : bad[i];
        ops_survive(&d, 1);
        dict_free(&d);

        d = corrupt_new(); /* every free list */
        for (int c = 0; c < 40; c++)
            hdr_u64(&d, H_FREE_HEAD)[c] = bad[i] ? bad[i] : 64;
        ops_survive(&d, 1); /* bad or not, the check misses its free blocks */
        dict_free(&d);

        d = corrupt_new(); /* an entry's lengths and class */
        uint8_t *e = d.base + first_slot(&d)[0];
        memcpy(e + 40, &bad[i], 8); /* klen */
        ops_survive(&d, bad[i] != 0);
        memcpy(e + 48, &bad[i], 8); /* vlen */
        memcpy(e + 4, &bad[i], 4);  /* cls */
        ops_survive(&d, 1);
        /* A repair of a heap that cannot be walked fails, every time. */
        *(uint32_t *)(d.base + d.off + H_NEEDS_REPAIR) = 1;
        ops_survive(&d, 1);
        CHECK_ERR(fb_shdict_len(&d, &(size_t){0}), FIBER_EPROTO);
        dict_free(&d);

        d = corrupt_new(); /* a count an index cannot hold */
        *hdr_u64(&d, H_COUNT) = bad[i];
        ops_survive(&d, 1);
        dict_free(&d);

        d = corrupt_new(); /* a recorded size past the file's end */
        *hdr_u64(&d, H_FILE_SIZE) = bad[i];
        ops_survive(&d, 1);
        dict_free(&d);
    }
}

TEST(random_scribbles_never_crash)
{
    /* TEST_SHDICT_SEED picks other scribbles (a soak runs many). */
    const char *env = getenv("TEST_SHDICT_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) | 1 : 0x1234567887654321ULL;
    int seen = 0;
    for (int round = 0; round < 600; round++) {
        struct fb_shdict d = corrupt_new();
        uint64_t top = *hdr_u64(&d, H_TOP);
        int n = 1 + (int)(rnd(&seed) % 8);
        for (int i = 0; i < n; i++) {
            uint64_t at = d.off + rnd(&seed) % (top - d.off);
            if (at >= d.off + H_LOCK && at < d.off + H_LOCK_END)
                continue;
            d.base[at] = (uint8_t)rnd(&seed);
        }
        seen += ops_survive(&d, 0);
        ops_survive(&d, 0);
        dict_free(&d);
    }
    fprintf(stderr, "%d of 600 scribbled dicts seen corrupt\n", seen);
}

TH_MAIN()
