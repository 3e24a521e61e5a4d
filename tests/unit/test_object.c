/*
 * test_object.c -- shared objects (fiber_object_*): put, ref, resolve in
 * real worker processes, the per-call shared argument, release, the
 * relay tree's bound on the master's bytes, relays killed mid-transfer,
 * and fiber_pool_wait_ready.
 */
#define _GNU_SOURCE 1 /* memmem */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "net/net.h"
#include "pool/pool_int.h"
#include "runtime/runtime.h"
#include "store/object_int.h"
#include "harness.h"

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Bytes that differ per seed and position. */
static unsigned char *pattern(size_t n, unsigned seed)
{
    unsigned char *p = malloc(n ? n : 1);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (unsigned char)(x >> 16);
    }
    return p;
}

struct digest {
    unsigned char hash[32];
    uint64_t len;
    int64_t pid;
};

static void digest_of(const void *data, size_t len, struct digest *d)
{
    crypto_generichash(d->hash, 32, data, len, NULL, 0);
    d->len = len;
    d->pid = getpid();
}

/* arg: a fiber_ref.  Resolves it and returns its digest and our pid. */
FIBER_TASK(obj_digest)
{
    if (len != sizeof(fiber_ref))
        return fiber_task_fail("obj_digest wants a ref, got %zu bytes", len);
    fiber_ref ref;
    memcpy(&ref, arg, sizeof ref);
    const void *data;
    size_t n;
    int rc = fiber_object_get(&ref, &data, &n);
    if (rc)
        return fiber_task_fail("fiber_object_get: %s", fiber_last_error());
    struct digest d;
    digest_of(data, n, &d);
    return fiber_buf_append(out, &d, sizeof d);
}

/* The call's shared argument's digest; arg ignored. */
FIBER_TASK(shared_digest)
{
    (void)arg;
    (void)len;
    const void *data;
    size_t n;
    if (fiber_task_shared(&data, &n) != 0)
        return fiber_task_fail("fiber_task_shared: %s", fiber_last_error());
    struct digest d;
    digest_of(data, n, &d);
    return fiber_buf_append(out, &d, sizeof d);
}

/* Records this worker's cache counters. */
FIBER_TASK(obj_stats)
{
    (void)arg;
    (void)len;
    fiber_object_stats st;
    fiber_object_stats_get(&st);
    return fiber_buf_append(out, &st, sizeof st);
}

/* These cases find holders by their unix socket (relay.<pid>.sock) or
 * count /dev/shm files: with the tcp transport they cannot run. */
static void skip_unless_unix(void)
{
    char t[16] = "";
    fiber_config_get("transport", t, sizeof t);
    if (strcmp(t, "tcp") == 0) {
        printf("SKIP: needs the ipc transport (transport is tcp)\n");
        exit(77);
    }
}

static fiber_pool *make_pool(int n)
{
    fiber_pool *p;
    fiber_pool_opts o = {.workers = n};
    CHECK_OK(fiber_pool_create(&p, &o));
    return p;
}

TEST(put_get_release_in_the_master)
{
    unsigned char *a = pattern(100000, 1);
    fiber_ref r1, r2, r3;
    CHECK_OK(fiber_object_put(a, 100000, &r1));
    CHECK_OK(fiber_object_put(a, 100000, &r2));
    CHECK(memcmp(&r1, &r2, sizeof r1) == 0); /* content-addressed */
    a[5] ^= 1;
    CHECK_OK(fiber_object_put(a, 100000, &r3));
    CHECK(memcmp(&r1, &r3, sizeof r1) != 0);
    const void *d;
    size_t n;
    CHECK_OK(fiber_object_get(&r3, &d, &n));
    CHECK_EQ(n, 100000);
    CHECK(memcmp(d, a, n) == 0);
    /* Two puts, two releases: the blob lives until the second. */
    CHECK_OK(fiber_object_release(&r1));
    CHECK_OK(fiber_object_get(&r1, &d, &n));
    CHECK_OK(fiber_object_release(&r2));
    CHECK_ERR(fiber_object_get(&r1, &d, &n), FIBER_ENOKEY);
    CHECK(strstr(fiber_last_error(), "released") != NULL);
    CHECK_ERR(fiber_object_release(&r1), FIBER_ENOKEY);
    CHECK_ERR(fiber_object_put(NULL, 3, &r1), FIBER_EINVAL);
    CHECK_ERR(fiber_object_get(NULL, &d, &n), FIBER_EINVAL);
    /* An empty blob is a blob. */
    CHECK_OK(fiber_object_put("", 0, &r1));
    CHECK_OK(fiber_object_get(&r1, &d, &n));
    CHECK_EQ(n, 0);
    CHECK_OK(fiber_object_release(&r3));
    CHECK_OK(fiber_object_release(&r1));
    free(a);
}

/* 64 tasks on 8 workers resolve one 1 MiB blob: every digest is right,
 * each worker fetched it once (the rest were cache hits), and the master
 * sent at most FB_BLOB_MASTER_COPIES copies: the rest came from relays. */
TEST(workers_resolve_a_ref_once_and_relay_it)
{
    enum { W = 8, N = 64, SIZE = 1 << 20 };
    CHECK_OK(fiber_config_set("object_shm", "0")); /* send, do not map */
    fiber_pool *p = make_pool(W);
    CHECK_OK(fiber_pool_wait_ready(p, W, 30000));
    unsigned char *blob = pattern(SIZE, 2);
    struct digest want;
    digest_of(blob, SIZE, &want);
    fiber_ref ref;
    CHECK_OK(fiber_object_put(blob, SIZE, &ref));
    fiber_object_stats before;
    CHECK_OK(fiber_object_stats_get(&before));
    fiber_ref in[N];
    struct digest got[N];
    for (int i = 0; i < N; i++)
        in[i] = ref;
    CHECK_OK(fiber_pool_map(p, "obj_digest", in, sizeof in[0], N, got,
                            sizeof got[0], 1));
    for (int i = 0; i < N; i++) {
        CHECK(memcmp(got[i].hash, want.hash, 32) == 0);
        CHECK_EQ(got[i].len, SIZE);
    }
    fiber_object_stats after;
    CHECK_OK(fiber_object_stats_get(&after));
    uint64_t sent = after.bytes_served - before.bytes_served;
    printf("master sent %llu bytes (%.2f copies), %llu redirects\n",
           (unsigned long long)sent, (double)sent / SIZE,
           (unsigned long long)(after.redirects - before.redirects));
    CHECK(sent >= SIZE);
    CHECK(sent <= (uint64_t)FB_BLOB_MASTER_COPIES * SIZE);
    CHECK(after.redirects > before.redirects);
    /* Each worker fetched once, however many tasks it ran. */
    fiber_object_stats ws[W * 4];
    int zero[W * 4] = {0};
    CHECK_OK(fiber_pool_map(p, "obj_stats", zero, sizeof zero[0], W * 4, ws,
                            sizeof ws[0], 1));
    for (int i = 0; i < W * 4; i++)
        CHECK(ws[i].fetches <= 1);
    CHECK_OK(fiber_object_release(&ref));
    fiber_pool_free(p);
    free(blob);
}

/* How many files of this run's master are in /dev/shm. */
static int shm_files(void)
{
    char prefix[128];
    snprintf(prefix, sizeof prefix, "fiber-%s-%ld-", fb_rt()->run_id,
             (long)getpid());
    DIR *d = opendir("/dev/shm");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d)
        closedir(d);
    return n;
}

/* On one host the workers map the master's copy (in its arena): the
 * master sends no blob bytes at all.  The arena's file stays for the
 * next blobs. */
TEST(same_host_workers_map_the_masters_copy)
{
    enum { W = 6, N = 24, SIZE = 3 << 20 };
    skip_unless_unix();
    fiber_pool *p = make_pool(W);
    unsigned char *blob = pattern(SIZE, 6);
    struct digest want;
    digest_of(blob, SIZE, &want);
    fiber_object_stats before, after;
    CHECK_OK(fiber_object_stats_get(&before));
    fiber_ref ref;
    CHECK_OK(fiber_object_put(blob, SIZE, &ref));
    CHECK_EQ(shm_files(), 1);
    fiber_ref in[N];
    struct digest got[N];
    for (int i = 0; i < N; i++)
        in[i] = ref;
    CHECK_OK(fiber_pool_map(p, "obj_digest", in, sizeof in[0], N, got,
                            sizeof got[0], 1));
    for (int i = 0; i < N; i++)
        CHECK(memcmp(got[i].hash, want.hash, 32) == 0);
    CHECK_OK(fiber_object_stats_get(&after));
    CHECK_EQ(after.bytes_served - before.bytes_served, 0);
    CHECK_EQ(after.shm_bytes - before.shm_bytes, SIZE);
    CHECK(after.maps - before.maps >= 1);
    CHECK(after.maps - before.maps <= W + 3); /* once per worker (+ spares) */
    CHECK_OK(fiber_object_release(&ref));
    CHECK_EQ(shm_files(), 1);
    /* The workers keep what they resolved, and its region is not reused
     * while they do: a blob put now goes elsewhere. */
    unsigned char *other = pattern(SIZE, 7);
    fiber_ref ref2;
    CHECK_OK(fiber_object_put(other, SIZE, &ref2));
    CHECK_OK(fiber_pool_map(p, "obj_digest", in, sizeof in[0], W, got,
                            sizeof got[0], 1));
    for (int i = 0; i < W; i++)
        CHECK(memcmp(got[i].hash, want.hash, 32) == 0);
    CHECK_OK(fiber_object_release(&ref2));
    fiber_pool_free(p);
    free(other);
    free(blob);
}

TEST(per_call_shared_argument)
{
    enum { N = 40, SIZE = 300000 };
    fiber_pool *p = make_pool(3);
    unsigned char *a = pattern(SIZE, 3), *b = pattern(SIZE, 4);
    struct digest da, db, got[N];
    digest_of(a, SIZE, &da);
    digest_of(b, SIZE, &db);
    int zero[N] = {0};
    CHECK_OK(fiber_pool_map_shared(p, "shared_digest", a, SIZE, zero,
                                   sizeof zero[0], N, got, sizeof got[0], 0));
    for (int i = 0; i < N; i++)
        CHECK(memcmp(got[i].hash, da.hash, 32) == 0);
    /* Another call, another blob, same workers. */
    CHECK_OK(fiber_pool_map_shared(p, "shared_digest", b, SIZE, zero,
                                   sizeof zero[0], N, got, sizeof got[0], 0));
    for (int i = 0; i < N; i++)
        CHECK(memcmp(got[i].hash, db.hash, 32) == 0);
    /* map_shared released its blob: the master no longer has it. */
    fiber_object_stats st;
    CHECK_OK(fiber_object_stats_get(&st));
    CHECK_EQ(st.objects, 0);
    /* A call without a shared argument: the task says so. */
    fiber_buf out = {0};
    CHECK_ERR(fiber_pool_apply(p, "shared_digest", "", 0, &out), FIBER_ETASK);
    CHECK(strstr(fiber_last_error(), "no shared argument") != NULL);
    /* fiber_pool_shared with a ref that was released is refused. */
    fiber_ref r;
    CHECK_OK(fiber_object_put(a, 10, &r));
    CHECK_OK(fiber_object_release(&r));
    CHECK_OK(fiber_pool_shared(&r));
    CHECK_ERR(fiber_pool_apply(p, "shared_digest", "", 0, &out), FIBER_ENOKEY);
    CHECK_OK(fiber_pool_shared(NULL));
    fiber_buf_free(&out);
    fiber_pool_free(p);
    free(a);
    free(b);
}

/* fiber_object_hold in a task: what it gives outlives the task. */
static const void *held_data;
static size_t held_len;

FIBER_TASK(obj_hold)
{
    fiber_ref ref;
    if (len != sizeof ref)
        return fiber_task_fail("obj_hold wants a ref");
    memcpy(&ref, arg, sizeof ref);
    if (fiber_object_hold(&ref, &held_data, &held_len) != 0)
        return fiber_task_fail("fiber_object_hold: %s", fiber_last_error());
    return 0;
}

/* fiber_object_released(ref) in this worker, as an int. */
FIBER_TASK(obj_released)
{
    fiber_ref ref;
    if (len != sizeof ref)
        return fiber_task_fail("obj_released wants a ref");
    memcpy(&ref, arg, sizeof ref);
    int r = fiber_object_released(&ref);
    return fiber_buf_append(out, &r, sizeof r);
}

static int released_in_worker(fiber_pool *p, const fiber_ref *r)
{
    fiber_buf out = {0};
    int v = -1;
    if (fiber_pool_apply(p, "obj_released", r, sizeof *r, &out) == 0 &&
        out.len == sizeof v)
        memcpy(&v, out.data, sizeof v);
    fiber_buf_free(&out);
    return v;
}

/* The next task on the same worker: the held bytes' digest, then the
 * codes of two releases (the hold's, then one too many). */
FIBER_TASK(obj_check_held)
{
    fiber_ref ref;
    if (len != sizeof ref || !held_data)
        return fiber_task_fail("obj_check_held wants a ref and a hold");
    memcpy(&ref, arg, sizeof ref);
    struct digest d;
    digest_of(held_data, held_len, &d);
    int rc[2];
    rc[0] = fiber_object_release(&ref);
    rc[1] = fiber_object_release(&ref);
    held_data = NULL;
    if (fiber_buf_append(out, &d, sizeof d) != 0)
        return FIBER_ENOMEM;
    return fiber_buf_append(out, rc, sizeof rc);
}

static size_t arena_free(void)
{
    fb_blobs_lock();
    size_t n = fb_arena_free_bytes();
    fb_blobs_unlock();
    return n;
}

/* The arena reuses a region only when nobody can read it: a worker holds
 * a blob the master released, the master puts blob after blob of the
 * same size (each read by that worker, so its drops flow), and the held
 * bytes stay what they were; the region comes back once the worker lets
 * go.  Blobs keep reusing the same few regions (ES: a new policy each
 * iteration), and one too large for the arena gets a file of its own. */
TEST(an_arena_region_is_reused_only_when_no_worker_reads_it)
{
    skip_unless_unix();
    enum { SIZE = 400000, ROUNDS = 40 };
    fiber_pool *p = make_pool(1);
    unsigned char *a = pattern(SIZE, 30);
    struct digest want, got;
    digest_of(a, SIZE, &want);
    fiber_ref ra;
    CHECK_OK(fiber_object_put(a, SIZE, &ra));
    fiber_buf out = {0};
    CHECK_OK(fiber_pool_apply(p, "obj_hold", &ra, sizeof ra, &out));
    size_t held_free = arena_free();
    CHECK_OK(fiber_object_release(&ra));
    CHECK_EQ(arena_free(), held_free); /* released, but still read */
    for (unsigned i = 0; i < ROUNDS; i++) {
        unsigned char *b = pattern(SIZE, 31 + i);
        struct digest wb;
        digest_of(b, SIZE, &wb);
        fiber_ref rb;
        CHECK_OK(fiber_object_put(b, SIZE, &rb));
        out.len = 0;
        CHECK_OK(fiber_pool_apply(p, "obj_digest", &rb, sizeof rb, &out));
        memcpy(&got, out.data, sizeof got);
        CHECK(memcmp(got.hash, wb.hash, 32) == 0);
        if (i == 0) {
            CHECK_EQ(released_in_worker(p, &rb), 0);
            CHECK_EQ(fiber_object_released(&rb), 0); /* the master: 0 */
        }
        CHECK_OK(fiber_object_release(&rb));
        if (i == 0) /* the worker reads the region's header */
            CHECK_EQ(released_in_worker(p, &rb), 1);
        free(b);
    }
    CHECK_EQ(released_in_worker(p, &ra), 1); /* held, and released */
    CHECK_EQ(fb_arena_segments(), 1);
    /* Every round's blob went where an earlier round's was: at most a
     * few regions beside the held one are in use. */
    CHECK(held_free - arena_free() <= 4 * (SIZE + 4096));
    out.len = 0;
    CHECK_OK(fiber_pool_apply(p, "obj_check_held", &ra, sizeof ra, &out));
    memcpy(&got, out.data, sizeof got);
    CHECK(memcmp(got.hash, want.hash, 32) == 0); /* the held bytes */
    size_t before = arena_free();
    /* The worker's next request carries its drop of the held blob. */
    unsigned char *c = pattern(SIZE, 99);
    fiber_ref rc;
    CHECK_OK(fiber_object_put(c, SIZE, &rc));
    out.len = 0;
    CHECK_OK(fiber_pool_apply(p, "obj_digest", &rc, sizeof rc, &out));
    CHECK_OK(fiber_object_release(&rc));
    CHECK(arena_free() > before);
    /* Too large for the arena: a file of its own, gone at release. */
    int files = shm_files();
    size_t big = FB_ARENA_MAX_BLOB + 1;
    unsigned char *d = pattern(big, 5);
    fiber_ref rd;
    CHECK_OK(fiber_object_put(d, big, &rd));
    CHECK_EQ(shm_files(), files + 1);
    out.len = 0;
    CHECK_OK(fiber_pool_apply(p, "obj_digest", &rd, sizeof rd, &out));
    memcpy(&got, out.data, sizeof got);
    CHECK_EQ(got.len, big);
    CHECK_EQ(released_in_worker(p, &rd), 0);
    CHECK_OK(fiber_object_release(&rd));
    CHECK_EQ(shm_files(), files);
    CHECK_EQ(released_in_worker(p, &rd), 1); /* its file is gone */
    fiber_buf_free(&out);
    fiber_pool_free(p);
    free(a);
    free(c);
    free(d);
}

/* A blob larger than object_cache_mb, got with fiber_object_get in a task,
 * is evicted when the task ends; held, it stays until released, across
 * tasks (what the Python binding's arrays rely on).  The master holds
 * nothing: FIBER_ESTATE. */
TEST(a_held_blob_outlives_its_task_until_released)
{
    enum { SIZE = 3 << 20 };
    CHECK_OK(fiber_config_set("object_cache_mb", "1"));
    CHECK_OK(fiber_config_set("object_shm", "0")); /* a private copy */
    fiber_pool *p = make_pool(1);
    unsigned char *a = pattern(SIZE, 9);
    struct digest want;
    digest_of(a, SIZE, &want);
    fiber_ref r;
    CHECK_OK(fiber_object_put(a, SIZE, &r));
    const void *d;
    size_t n;
    CHECK_ERR(fiber_object_hold(&r, &d, &n), FIBER_ESTATE);
    fiber_buf out = {0};
    CHECK_OK(fiber_pool_apply(p, "obj_hold", &r, sizeof r, &out));
    /* Another task first: the cache trims when a task ends. */
    CHECK_OK(fiber_pool_apply(p, "obj_stats", "", 0, &out));
    out.len = 0;
    CHECK_OK(fiber_pool_apply(p, "obj_check_held", &r, sizeof r, &out));
    CHECK_EQ(out.len, sizeof(struct digest) + 2 * sizeof(int));
    struct digest got;
    int rc[2];
    memcpy(&got, out.data, sizeof got);
    memcpy(rc, out.data + sizeof got, sizeof rc);
    CHECK(memcmp(got.hash, want.hash, 32) == 0);
    CHECK_EQ(got.len, SIZE);
    CHECK_EQ(rc[0], 0);
    CHECK_EQ(rc[1], FIBER_ENOKEY);
    /* The release evicted it (1 MiB budget). */
    out.len = 0;
    CHECK_OK(fiber_pool_apply(p, "obj_stats", "", 0, &out));
    fiber_object_stats st;
    memcpy(&st, out.data, sizeof st);
    CHECK_EQ(st.objects, 0);
    CHECK(st.evictions >= 1);
    fiber_buf_free(&out);
    fiber_pool_free(p);
    CHECK_OK(fiber_object_release(&r));
    free(a);
}

/* A worker maps each new blob from the master's file; one the master
 * released (its file gone) is dropped when the next arrives, whatever
 * object_cache_mb allows: an ES run's old policies do not stay mapped on
 * every worker. */
TEST(a_worker_drops_mapped_blobs_the_master_released)
{
    skip_unless_unix();
    enum { SIZE = 500000, ROUNDS = 5 };
    fiber_pool *p = make_pool(1);
    fiber_buf out = {0};
    for (unsigned i = 0; i < ROUNDS; i++) {
        unsigned char *a = pattern(SIZE, 20 + i);
        fiber_ref r;
        CHECK_OK(fiber_object_put(a, SIZE, &r));
        out.len = 0;
        CHECK_OK(fiber_pool_apply(p, "obj_digest", &r, sizeof r, &out));
        struct digest want, got;
        digest_of(a, SIZE, &want);
        memcpy(&got, out.data, sizeof got);
        CHECK(memcmp(got.hash, want.hash, 32) == 0);
        CHECK_OK(fiber_object_release(&r));
        free(a);
    }
    out.len = 0;
    CHECK_OK(fiber_pool_apply(p, "obj_stats", "", 0, &out));
    fiber_object_stats st;
    memcpy(&st, out.data, sizeof st);
    CHECK_EQ(st.fetches, ROUNDS);
    CHECK_EQ(st.objects, 1);        /* the last one, released after */
    CHECK_EQ(st.evictions, ROUNDS - 1);
    fiber_buf_free(&out);
    fiber_pool_free(p);
}

TEST(a_released_ref_fails_to_resolve_in_a_task)
{
    fiber_pool *p = make_pool(1);
    fiber_ref r;
    CHECK_OK(fiber_object_put("abc", 3, &r));
    CHECK_OK(fiber_object_release(&r));
    fiber_buf out = {0};
    CHECK_ERR(fiber_pool_apply(p, "obj_digest", &r, sizeof r, &out),
              FIBER_ETASK);
    CHECK(strstr(fiber_last_error(), "released") != NULL);
    /* A forged ref (right length, no such blob, an absurd size) is the
     * same: nothing of that size is allocated before a server has it. */
    memset(&r, 7, sizeof r);
    CHECK_ERR(fiber_pool_apply(p, "obj_digest", &r, sizeof r, &out),
              FIBER_ETASK);
    CHECK(strstr(fiber_last_error(), "no shared object has this ref") != NULL);
    fiber_buf_free(&out);
    fiber_pool_free(p);
}

/* Kills every holder that is serving a blob to another worker (load > 0)
 * as soon as it is seen, until `kills` are done. */
struct killer {
    fiber_ref ref;
    int kills, done, stop;
    long killed[16];
};

static int killed_already(const struct killer *k, long pid)
{
    for (int i = 0; i < k->done; i++)
        if (k->killed[i] == pid)
            return 1;
    return 0;
}

static void *kill_relays(void *arg)
{
    struct killer *k = arg;
    while (!k->stop && k->done < k->kills) {
        long pid = 0;
        fb_blobs_lock();
        struct fb_blob *b = fb_blob_find(k->ref.bytes);
        for (struct fb_holder *h = b ? b->holders : NULL; h; h = h->next) {
            const char *dot = strstr(h->addr, "relay.");
            long who = dot ? strtol(dot + 6, NULL, 10) : 0;
            if (h->load > 0 && who > 0 && !killed_already(k, who)) {
                pid = who;
                break;
            }
        }
        fb_blobs_unlock();
        if (pid > 0 && kill((pid_t)pid, SIGKILL) == 0)
            k->killed[k->done++] = pid;
        usleep(500);
    }
    return NULL;
}

/* A broadcast of 24 MiB to 10 workers while relays that are sending are
 * SIGKILLed: every task still gets exactly the right bytes, and nothing
 * hangs (the case has a timeout; each map must end). */
TEST(relays_killed_mid_transfer_cost_a_refetch_not_a_wrong_byte)
{
    enum { W = 10, SIZE = 24 << 20 };
    skip_unless_unix();
    CHECK_OK(fiber_config_set("object_shm", "0")); /* send, do not map */
    fiber_pool *p = make_pool(W);
    CHECK_OK(fiber_pool_wait_ready(p, W, 60000));
    unsigned char *blob = pattern(SIZE, 5);
    struct digest want;
    digest_of(blob, SIZE, &want);
    struct killer k = {.kills = 3};
    CHECK_OK(fiber_object_put(blob, SIZE, &k.ref));
    pthread_t t;
    CHECK(pthread_create(&t, NULL, kill_relays, &k) == 0);
    fiber_ref in[W];
    struct digest got[W];
    for (int i = 0; i < W; i++)
        in[i] = k.ref;
    CHECK_OK(fiber_pool_map(p, "obj_digest", in, sizeof in[0], W, got,
                            sizeof got[0], 1));
    k.stop = 1;
    pthread_join(t, NULL);
    for (int i = 0; i < W; i++) {
        CHECK(memcmp(got[i].hash, want.hash, 32) == 0);
        CHECK_EQ(got[i].len, SIZE);
    }
    /* A killed relay whose own task was done is noticed a little later. */
    fiber_pool_stats st;
    for (int i = 0; i < 200; i++) {
        CHECK_OK(fiber_pool_stats_get(p, &st));
        if (st.workers_lost >= (uint64_t)k.done)
            break;
        sleep_ms(10);
    }
    printf("killed %d relays mid-transfer; %llu workers lost, %llu tasks "
           "retried\n", k.done, (unsigned long long)st.workers_lost,
           (unsigned long long)st.tasks_retried);
    CHECK(k.done >= 1); /* the test did what it says */
    CHECK(st.workers_lost >= (uint64_t)k.done);
    CHECK_OK(fiber_object_release(&k.ref));
    fiber_pool_free(p);
    free(blob);
}

TEST(wait_ready)
{
    fiber_pool *p = make_pool(4);
    CHECK_ERR(fiber_pool_wait_ready(p, -1, 10), FIBER_EINVAL);
    CHECK_OK(fiber_pool_wait_ready(p, 4, 30000));
    fiber_pool_stats st;
    CHECK_OK(fiber_pool_stats_get(p, &st));
    CHECK_EQ(st.workers_alive, 4);
    /* More than the pool has: times out, saying how many are ready. */
    CHECK_ERR(fiber_pool_wait_ready(p, 5, 200), FIBER_ETIMEDOUT);
    CHECK(strstr(fiber_last_error(), "4 of 5") != NULL);
    CHECK_OK(fiber_pool_terminate(p));
    CHECK_ERR(fiber_pool_wait_ready(p, 1, 200), FIBER_ECLOSED);
    fiber_pool_free(p);
}

/* Malformed blob messages are refused with a message naming the field. */
TEST(malformed_blob_messages_are_refused_by_name)
{
    char err[256];
    const uint8_t *ref;
    struct fb_msg_obj_have hv;
    struct fb_msg_text t;
    const char *s;
    uint32_t n;
    uint8_t buf[64] = {0};
    CHECK_EQ(fb_wire_get_obj_get(buf, 39, &ref, err, sizeof err),
             FIBER_EPROTO);
    CHECK(strstr(err, "OBJ_GET payload: 39 bytes") != NULL);
    CHECK_EQ(fb_wire_get_obj_have(buf, 41, &hv, err, sizeof err),
             FIBER_EPROTO);
    CHECK(strstr(err, "OBJ_HAVE address: truncated") != NULL);
    CHECK_EQ(fb_wire_get_obj_from((const uint8_t *)"http://x", 8, &s, &n,
                                  err, sizeof err),
             FIBER_EPROTO);
    CHECK(strstr(err, "neither unix: nor tcp:") != NULL);
    CHECK_EQ(fb_wire_get_obj_none(0, buf, 0, &t, err, sizeof err),
             FIBER_EPROTO);
    CHECK(strstr(err, "OBJ_NONE code: 0") != NULL);
    CHECK_EQ(fb_wire_get_obj_file((const uint8_t *)"rel/path", 8, &s, &n,
                                  err, sizeof err),
             FIBER_EPROTO);
    CHECK(strstr(err, "OBJ_FILE path") != NULL);
    uint64_t off;
    CHECK_EQ(fb_wire_get_obj_at(buf, 7, &off, &s, &n, err, sizeof err),
             FIBER_EPROTO);
    CHECK(strstr(err, "OBJ_AT offset: truncated") != NULL);
    CHECK_EQ(fb_wire_get_obj_at((const uint8_t *)"01234567rel", 11, &off, &s,
                                &n, err, sizeof err),
             FIBER_EPROTO);
    CHECK(strstr(err, "OBJ_AT path") != NULL);
    CHECK_EQ(fb_wire_get_obj_drop(buf, 41, &ref, err, sizeof err),
             FIBER_EPROTO);
    CHECK(strstr(err, "OBJ_DROP payload: 41 bytes") != NULL);
    CHECK_EQ(fb_wire_get_obj_call(buf, 3, &ref, err, sizeof err),
             FIBER_EPROTO);
    CHECK(strstr(err, "OBJ_CALL payload: 3 bytes") != NULL);
}

/* A peer without the run's token gets REJECT from the blob server, and
 * nothing else. */
TEST(blob_server_refuses_a_peer_with_the_wrong_token)
{
    fiber_ref r;
    CHECK_OK(fiber_object_put("secret", 6, &r));
    const char *addr = fb_objects_master_address();
    CHECK(addr[0] != '\0');
    int fd;
    CHECK_OK(fb_sock_dial(addr, fb_deadline_ms(5000), &fd));
    struct fb_conn c;
    fb_conn_init(&c, fd, 1u << 20);
    const char *bid = fb_rt_build_id();
    struct fb_msg_hello h = {.build_id = bid,
                             .build_id_len = (uint8_t)strlen(bid),
                             .name = "intruder", .name_len = 8};
    memset(h.token, 0x41, sizeof h.token);
    CHECK_OK(fb_wire_put_hello(fb_conn_out(&c), &h));
    CHECK_OK(fb_wire_put_obj_get(fb_conn_out(&c), 1, r.bytes));
    CHECK_OK(fb_conn_flush_wait(&c, fb_deadline_ms(5000)));
    struct fb_wire_hdr hd;
    const uint8_t *p;
    CHECK_EQ(fb_conn_recv_wait(&c, &hd, &p, fb_deadline_ms(5000)), 1);
    CHECK_EQ(hd.type, FB_MSG_REJECT);
    CHECK(memmem(p, hd.len, "wrong token", 11) != NULL);
    /* Then the connection ends: no blob byte follows. */
    CHECK(fb_conn_recv_wait(&c, &hd, &p, fb_deadline_ms(5000)) < 0);
    fb_conn_close(&c);
    CHECK_OK(fiber_object_release(&r));
}

TEST(children_cannot_put)
{
    /* In the master every argument problem is caught before anything is
     * sent; a child's put is refused (see the task below). */
    fiber_pool *p = make_pool(1);
    fiber_buf out = {0};
    CHECK_ERR(fiber_pool_apply(p, "child_put", "", 0, &out), FIBER_ETASK);
    CHECK(strstr(fiber_last_error(), "only the master") != NULL);
    fiber_buf_free(&out);
    fiber_pool_free(p);
}

FIBER_TASK(child_put)
{
    (void)arg;
    (void)len;
    (void)out;
    fiber_ref r;
    if (fiber_object_put("x", 1, &r) == 0)
        return 0;
    return fiber_task_fail("%s", fiber_last_error());
}

TH_MAIN()
