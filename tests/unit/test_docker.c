/*
 * test_docker.c -- the docker backend against a real Docker Engine.
 *
 * Each case makes an image holding this test program and the shared
 * libraries it runs with (at their own paths, FROM scratch), points fiber
 * at it (backend = docker, image = ...) and re-runs this program as
 * containers.  The image is removed when the case's process exits, after
 * fiber_shutdown() has stopped its containers.
 *
 * Without /var/run/docker.sock every case that needs an engine is
 * skipped (TH_SKIP_ENGINE: exit 77, which ctest reports as skipped; a
 * failure under CI).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/http/http.h"
#include "base/common.h"
#include "runtime/child.h"
#include "runtime/runtime.h"
#include "harness.h"

#define DOCKER_SOCK "/var/run/docker.sock"
#define IMAGE_REPO "fiber-test-docker"

int fb_process_wait_note(fiber_process *p, char *buf, size_t size,
                         int timeout_ms);

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int arg_int(const void *arg, size_t len)
{
    int v = 0;
    if (len == sizeof v)
        memcpy(&v, arg, sizeof v);
    return v;
}

/* ---- tasks the containers run -------------------------------------------- */

FIBER_TASK(ret_arg) { return arg_int(arg, len); }

FIBER_TASK(kill_self)
{
    raise(SIGKILL);
    return 0;
}

FIBER_TASK(exit_directly) { exit(arg_int(arg, len)); }

FIBER_TASK(fail_with_message) { return fiber_task_fail("bad input %d", 7); }

FIBER_TASK(sleeper)
{
    sleep_ms(arg_int(arg, len));
    return 0;
}

/* Returns 0 if the argument is bytes i*7 mod 251, 100000 of them. */
FIBER_TASK(check_pattern)
{
    const unsigned char *p = arg;
    for (size_t i = 0; i < len; i++)
        if (p[i] != (unsigned char)(i * 7 % 251))
            return 1;
    return len == 100000 ? 0 : 2;
}

/* Returns 0 if this runs in a container as the master's uid (the
 * argument), with the bootstrap gone from the environment. */
FIBER_TASK(in_container)
{
    if (access("/.dockerenv", F_OK) != 0)
        return 1;
    if ((int)getuid() != arg_int(arg, len))
        return 2;
    if (getenv("FIBER_BOOT_SECRET_FILE") || getenv("FIBER_BOOT_ADDR"))
        return 3;
    char tr[16];
    if (fiber_config_get("transport", tr, sizeof tr) != 0 ||
        strcmp(tr, "tcp") != 0)
        return 4;
    return 0;
}

FIBER_TASK(square)
{
    int x = arg_int(arg, len);
    x *= x;
    return fiber_buf_append(out, &x, sizeof x);
}

FIBER_TASK(square_slow)
{
    sleep_ms(2);
    int x = arg_int(arg, len);
    x *= x;
    return fiber_buf_append(out, &x, sizeof x);
}

/* A serialised handle and a count, passed to a child. */
struct handle_arg {
    uint32_t len;
    int32_t count;
    unsigned char data[256];
};

static struct handle_arg handle_arg_of(const fiber_buf *b, int count)
{
    struct handle_arg h = {.len = (uint32_t)b->len, .count = count};
    CHECK(b->len <= sizeof h.data);
    memcpy(h.data, b->data, b->len);
    return h;
}

static int handle_from(const void *arg, size_t len, struct handle_arg *h)
{
    if (len != sizeof *h)
        return -1;
    memcpy(h, arg, sizeof *h);
    return h->len <= sizeof h->data ? 0 : -1;
}

/* Puts 0..count-1 on the queue. */
FIBER_TASK(produce)
{
    struct handle_arg h;
    fiber_queue *q;
    if (handle_from(arg, len, &h) != 0 ||
        fiber_queue_open(&q, h.data, h.len) != 0)
        return 100;
    for (int32_t i = 0; i < h.count; i++)
        if (fiber_queue_put(q, &i, sizeof i, -1) != 0)
            return 101;
    fiber_queue_free(q);
    return 0;
}

/* Puts one message on the queue, then sleeps (a child that is up). */
FIBER_TASK(put_then_sleep)
{
    struct handle_arg h;
    fiber_queue *q;
    if (handle_from(arg, len, &h) != 0 ||
        fiber_queue_open(&q, h.data, h.len) != 0)
        return 100;
    int32_t one = 1;
    if (fiber_queue_put(q, &one, sizeof one, -1) != 0)
        return 101;
    sleep_ms(h.count);
    return 0;
}

/* Adds 1 to the manager's value count times. */
FIBER_TASK(add_to_value)
{
    struct handle_arg h;
    fiber_mobj *v;
    if (handle_from(arg, len, &h) != 0 || fiber_mobj_open(&v, h.data, h.len))
        return 100;
    for (int32_t i = 0; i < h.count; i++)
        if (fiber_value_add(v, 1, NULL, NULL) != 0)
            return 101;
    fiber_mobj_free(v);
    return 0;
}

FIBER_TASK(note_up) { return fb_child_note(0, "up") == 0 ? 0 : 1; }

/* ---- the engine ------------------------------------------------------------ */

static struct fb_http engine;
static char image_tag[128];

/* Skips the case (TH_SKIP_ENGINE) when this machine has no Docker engine. */
#define NEED_DOCKER()                                                          \
    do {                                                                       \
        if (access(DOCKER_SOCK, F_OK) != 0)                                    \
            TH_SKIP_ENGINE("%s is absent: no Docker engine on this machine",   \
                           DOCKER_SOCK);                                       \
    } while (0)

/* Opens the test's own connection to the engine (once). */
static void engine_open(void)
{
    if (engine.easy)
        return;
    CHECK_OK(fb_http_open_unix(&engine, "the Docker Engine", DOCKER_SOCK));
    struct fb_http_reply r;
    CHECK_OK(fb_http_request(&engine, "GET", "/_ping", NULL, 0, NULL, 5000,
                             &r));
    CHECK_EQ(r.status, 200);
    CHECK(r.api_version[0]);
    fb_http_set_version(&engine, r.api_version);
    fb_http_reply_free(&r);
}

/* Sends a request with no body; returns the status, the reply in *out. */
static long engine_call(const char *method, const char *path, json_t **out)
{
    engine_open();
    long status = 0;
    CHECK_OK(fb_http_json(&engine, method, path, NULL, 120000, &status, out));
    return status;
}

/* Lists the containers labelled with the run (running ones, or all):
 * returns how many, or -1 if the engine could not be asked, and stores up
 * to max ids in ids (may be NULL).  Never exits: the clean-up at exit
 * uses it. */
static long list_containers(const char *run, char ids[][80], size_t max,
                            int running_only)
{
    char filter[256], escaped[512], path[700];
    snprintf(filter, sizeof filter, "{\"label\":[\"fiber.run=%s\"]}", run);
    if (fb_http_escape(filter, escaped, sizeof escaped) != 0 ||
        (!engine.easy && fb_http_open_unix(&engine, "the Docker Engine", DOCKER_SOCK) != 0))
        return -1;
    snprintf(path, sizeof path, "/containers/json?all=%d&filters=%s",
             running_only ? 0 : 1, escaped);
    json_t *list = NULL;
    long status = 0;
    if (fb_http_json(&engine, "GET", path, NULL, 60000, &status, &list) ||
        status != 200 || !json_is_array(list)) {
        json_decref(list);
        return -1;
    }
    size_t n = json_array_size(list);
    for (size_t i = 0; ids && i < n && i < max; i++) {
        const char *id = json_string_value(
            json_object_get(json_array_get(list, i), "Id"));
        fb_strlcpy(ids[i], id ? id : "", sizeof ids[i]);
    }
    json_decref(list);
    return (long)n;
}

static size_t run_containers(const char *run, char ids[][80], size_t max,
                             int running_only)
{
    engine_open();
    long n = list_containers(run, ids, max, running_only);
    if (n < 0)
        TH_FAIL("cannot list the containers of run %s: %s", run,
                fiber_last_error());
    return (size_t)n;
}

/* Waits up to ms for the run's containers to be gone; returns how many
 * are left. */
static size_t wait_containers_gone(const char *run, int ms)
{
    uint64_t deadline = fb_now_ms() + (uint64_t)ms;
    size_t left;
    while ((left = run_containers(run, NULL, 0, 0)) > 0 &&
           fb_now_ms() < deadline)
        sleep_ms(50);
    return left;
}

/* ---- an image of this program (until `fiber image build` exists) --------- */

struct tar {
    fiber_buf b;
    char dirs[64][PATH_MAX]; /* directories already written */
    int n_dirs;
};

static void tar_header(struct tar *t, const char *name, char type,
                       size_t size, unsigned mode)
{
    unsigned char h[512] = {0};
    size_t n = strlen(name);
    if (n <= 100) {
        memcpy(h, name, n);
    } else { /* split at a '/' into prefix (155) and name (100) */
        const char *cut = name + n - 100;
        while (*cut && *cut != '/')
            cut++;
        CHECK(*cut == '/' && (size_t)(cut - name) <= 155);
        memcpy(h + 345, name, (size_t)(cut - name));
        memcpy(h, cut + 1, strlen(cut + 1));
    }
    snprintf((char *)h + 100, 8, "%07o", mode);
    snprintf((char *)h + 108, 8, "%07o", 0u);
    snprintf((char *)h + 116, 8, "%07o", 0u);
    snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
    snprintf((char *)h + 136, 12, "%011llo", (unsigned long long)time(NULL));
    h[156] = (unsigned char)type;
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    CHECK_OK(fiber_buf_append(&t->b, h, sizeof h));
}

/* Writes the directories leading to path (relative, no leading '/'). */
static void tar_dirs(struct tar *t, const char *path)
{
    char dir[PATH_MAX];
    for (const char *s = strchr(path, '/'); s; s = strchr(s + 1, '/')) {
        snprintf(dir, sizeof dir, "%.*s/", (int)(s - path), path);
        int seen = 0;
        for (int i = 0; i < t->n_dirs && !seen; i++)
            seen = strcmp(t->dirs[i], dir) == 0;
        if (seen)
            continue;
        CHECK(t->n_dirs < 64);
        fb_strlcpy(t->dirs[t->n_dirs++], dir, PATH_MAX);
        tar_header(t, dir, '5', 0, 0755);
    }
}

/* Adds the file at path (following symbolic links) under its own path. */
static void tar_file(struct tar *t, const char *path)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    fiber_buf content = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        CHECK_OK(fiber_buf_append(&content, chunk, n));
    fclose(f);
    const char *rel = path[0] == '/' ? path + 1 : path;
    tar_dirs(t, rel);
    tar_header(t, rel, '0', content.len, 0755);
    CHECK_OK(fiber_buf_append(&t->b, content.data, content.len));
    static const unsigned char pad[512];
    if (content.len % 512)
        CHECK_OK(fiber_buf_append(&t->b, pad, 512 - content.len % 512));
    fiber_buf_free(&content);
}

static __attribute__((unused)) int add_object(struct dl_phdr_info *info,
                                              size_t size, void *data)
{
    FB_UNUSED(size);
    /* The main program has an empty name; the vDSO has no file. */
    if (info->dlpi_name[0] == '/' && access(info->dlpi_name, R_OK) == 0)
        tar_file(data, info->dlpi_name);
    return 0;
}

static void exe_path(char *buf, size_t size)
{
    ssize_t n = readlink("/proc/self/exe", buf, size - 1);
    CHECK(n > 0);
    buf[n] = '\0';
}

/* Imports the tar (POST /images/create?fromSrc=-) as repo:tag, and frees
 * it. */
static void import_tar(struct tar *t, const char *repo, const char *tag)
{
    static const unsigned char end[1024];
    CHECK_OK(fiber_buf_append(&t->b, end, sizeof end));
    char path[512];
    snprintf(path, sizeof path, "/images/create?fromSrc=-&repo=%s&tag=%s",
             repo, tag);
    engine_open();
    struct fb_http_reply r;
    CHECK_OK(fb_http_request(&engine, "POST", path, t->b.data, t->b.len,
                             "application/x-tar", 120000, &r));
    CHECK_OK(fiber_buf_append(&r.body, "", 1));
    if (r.status != 200 || strstr((char *)r.body.data, "\"error"))
        TH_FAIL("importing the test image failed (HTTP %ld): %s", r.status,
                (char *)r.body.data);
    fb_http_reply_free(&r);
    fiber_buf_free(&t->b);
    free(t);
}

#ifndef FIBER_TEST_HAVE_IMAGE_BUILD
/* Imports an image of this program, its libraries and the loader. */
static void import_image(const char *repo, const char *tag)
{
    struct tar *t = calloc(1, sizeof *t);
    CHECK(t != NULL);
    char exe[PATH_MAX];
    exe_path(exe, sizeof exe);
    tar_file(t, exe);
    dl_iterate_phdr(add_object, t);
    import_tar(t, repo, tag);
}
#endif

static void remove_image_named(const char *name)
{
    char escaped[256], path[400];
    fb_http_escape(name, escaped, sizeof escaped);
    snprintf(path, sizeof path, "/images/%s?force=1", escaped);
    long status = 0;
    if (fb_http_json(&engine, "DELETE", path, NULL, 60000, &status, NULL) ||
        (status != 200 && status != 404))
        fprintf(stderr, "could not remove image %s (HTTP %ld)\n", name,
                status);
}

static void remove_image(void)
{
    if (!image_tag[0])
        return;
    /* Containers first: a running one pins the image.  fiber_shutdown()
     * stops the run's jobs; a case that failed half-way may have left
     * others (started through the ops table directly). */
    fiber_shutdown();
    char ids[32][80];
    long n = list_containers(fiber_run_id(), ids, 32, 0);
    for (long i = 0; i < n && i < 32; i++) {
        char path[200];
        snprintf(path, sizeof path, "/containers/%s?force=1", ids[i]);
        long status;
        fb_http_json(&engine, "DELETE", path, NULL, 60000, &status, NULL);
    }
    remove_image_named(image_tag);
    image_tag[0] = '\0';
}

/* Makes the image and configures fiber to run jobs in it. */
static void use_docker(void)
{
    char tag[64];
    snprintf(tag, sizeof tag, "%s", fiber_run_id());
    snprintf(image_tag, sizeof image_tag, "%s:%s", IMAGE_REPO, tag);
    atexit(remove_image);
#ifdef FIBER_TEST_HAVE_IMAGE_BUILD
    char exe[PATH_MAX];
    exe_path(exe, sizeof exe);
    fiber_buf id = {0};
    CHECK_OK(fiber_image_build(exe, image_tag, &id));
    fiber_buf_free(&id);
#else
    import_image(IMAGE_REPO, tag);
#endif
    CHECK_OK(fiber_config_set("backend", "docker"));
    CHECK_OK(fiber_config_set("image", image_tag));
}

/* ---- processes --------------------------------------------------------------- */

static fiber_process *start(const char *task, const void *arg, size_t len)
{
    fiber_process *p = NULL;
    CHECK_OK(fiber_process_start(&p, task, arg, len, NULL));
    return p;
}

static fiber_process *start_int(const char *task, int v)
{
    return start(task, &v, sizeof v);
}

static int join_code(fiber_process *p)
{
    CHECK_OK(fiber_process_join(p, 60000));
    int code = -1000;
    CHECK_OK(fiber_process_exitcode(p, &code));
    fiber_process_free(p);
    return code;
}

TEST(process_exit_codes_and_arguments)
{
    NEED_DOCKER();
    use_docker();
    unsigned char *big = malloc(100000);
    CHECK(big != NULL);
    for (size_t i = 0; i < 100000; i++)
        big[i] = (unsigned char)(i * 7 % 251);
    fiber_process *ps[6];
    ps[0] = start_int("ret_arg", 42);
    ps[1] = start_int("fail_with_message", 0);
    ps[2] = start_int("exit_directly", 3);
    ps[3] = start_int("kill_self", 0);
    ps[4] = start("check_pattern", big, 100000);
    ps[5] = start_int("in_container", (int)getuid());
    free(big);
    CHECK_EQ(fiber_process_pid(ps[0]), -1);
    CHECK_EQ(join_code(ps[0]), 42);
    CHECK_EQ(join_code(ps[1]), 1);
    CHECK_EQ(join_code(ps[2]), 3);
    CHECK_EQ(join_code(ps[3]), -SIGKILL);
    CHECK_EQ(join_code(ps[4]), 0);
    CHECK_EQ(join_code(ps[5]), 0);
    char tr[16];
    CHECK_OK(fiber_config_get("transport", tr, sizeof tr));
    CHECK_STR(tr, "tcp"); /* forced: containers dial the master over TCP */
}

TEST(terminate_sends_sigterm)
{
    NEED_DOCKER();
    use_docker();
    fiber_process *p = start_int("note_up", 0);
    char note[16];
    CHECK_OK(fb_process_wait_note(p, note, sizeof note, 60000));
    CHECK_EQ(join_code(p), 0);
    /* A long grace period: the SIGTERM must end it, not the SIGKILL. */
    CHECK_OK(fiber_config_set("terminate_grace_ms", "20000"));
    p = start_int("sleeper", 60000);
    sleep_ms(1500);
    CHECK_EQ(fiber_process_is_alive(p), 1);
    uint64_t t0 = fb_now_ms();
    CHECK_OK(fiber_process_terminate(p));
    CHECK_EQ(join_code(p), -SIGTERM);
    CHECK(fb_now_ms() - t0 < 15000);
    fprintf(stderr, "terminated in %llu ms\n",
            (unsigned long long)(fb_now_ms() - t0));
    /* The engine removes an ended job's container (AutoRemove). */
    CHECK_EQ(wait_containers_gone(fiber_run_id(), 10000), 0);
}

/* ---- pools ----------------------------------------------------------------- */

TEST(pool_map_1000_tasks_on_2_workers)
{
    NEED_DOCKER();
    use_docker();
    fiber_pool *pool;
    fiber_pool_opts o = {.workers = 2};
    enum { N = 1000 };
    static int in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = i;
    uint64_t t0 = fb_now_ms();
    CHECK_OK(fiber_pool_create(&pool, &o));
    uint64_t t1 = fb_now_ms();
    CHECK_OK(fiber_pool_map(pool, "square", in, sizeof in[0], N, out,
                            sizeof out[0], 0));
    fprintf(stderr, "pool of 2 container workers created in %llu ms; map of "
                    "%d tasks done %llu ms later\n",
            (unsigned long long)(t1 - t0), N,
            (unsigned long long)(fb_now_ms() - t1));
    for (int i = 0; i < N; i++)
        CHECK_EQ(out[i], i * i);
    fiber_pool_stats st;
    CHECK_OK(fiber_pool_stats_get(pool, &st));
    CHECK_EQ(st.workers_started, 2);
    fiber_pool_free(pool);
}

struct killer {
    fiber_pool *pool;
    int killed;
    char victim[80];
};

/* Kills one worker's container once the map is under way. */
static void *kill_a_worker(void *arg)
{
    struct killer *k = arg;
    fiber_pool_stats st;
    uint64_t deadline = fb_now_ms() + 60000;
    do {
        sleep_ms(20);
        fiber_pool_stats_get(k->pool, &st);
    } while (st.tasks_done < 200 && fb_now_ms() < deadline);
    char ids[4][80];
    if (run_containers(fiber_run_id(), ids, 4, 1) == 0)
        return NULL;
    char path[200];
    snprintf(path, sizeof path, "/containers/%s/kill?signal=SIGKILL", ids[0]);
    json_t *reply = NULL;
    k->killed = engine_call("POST", path, &reply) == 204;
    json_decref(reply);
    fb_strlcpy(k->victim, ids[0], sizeof k->victim);
    return NULL;
}

TEST(killed_worker_container_loses_no_result)
{
    NEED_DOCKER();
    use_docker();
    engine_open();
    fiber_pool *pool;
    fiber_pool_opts o = {.workers = 2};
    CHECK_OK(fiber_pool_create(&pool, &o));
    enum { N = 1000 };
    static int in[N], out[N];
    for (int i = 0; i < N; i++) {
        in[i] = i;
        out[i] = -1;
    }
    struct killer k = {.pool = pool};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, kill_a_worker, &k) == 0);
    CHECK_OK(fiber_pool_map(pool, "square_slow", in, sizeof in[0], N, out,
                            sizeof out[0], 1));
    pthread_join(t, NULL);
    CHECK(k.killed);
    for (int i = 0; i < N; i++)
        CHECK_EQ(out[i], i * i);
    fiber_pool_stats st;
    CHECK_OK(fiber_pool_stats_get(pool, &st));
    fprintf(stderr, "killed %.12s; workers started %llu, lost %llu, tasks "
                    "retried %llu\n",
            k.victim, (unsigned long long)st.workers_started,
            (unsigned long long)st.workers_lost,
            (unsigned long long)st.tasks_retried);
    CHECK(st.workers_lost >= 1);
    CHECK(st.workers_started >= 3);
    CHECK_EQ(st.tasks_done, N);
    fiber_pool_free(pool);
}

/* ---- queues and managers ---------------------------------------------------- */

TEST(queue_between_container_and_master)
{
    NEED_DOCKER();
    use_docker();
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 0));
    fiber_buf b = {0};
    CHECK_OK(fiber_queue_serialize(q, &b));
    struct handle_arg h = handle_arg_of(&b, 500);
    fiber_buf_free(&b);
    fiber_process *p = start("produce", &h, sizeof h);
    for (int32_t i = 0; i < 500; i++) {
        fiber_buf m = {0};
        CHECK_OK(fiber_queue_get(q, &m, 60000));
        CHECK_EQ(m.len, sizeof i);
        int32_t v;
        memcpy(&v, m.data, sizeof v);
        CHECK_EQ(v, i);
        fiber_buf_free(&m);
    }
    CHECK_EQ(join_code(p), 0);
    fiber_queue_free(q);
}

TEST(manager_runs_as_a_container)
{
    NEED_DOCKER();
    use_docker();
    fiber_manager *m;
    CHECK_OK(fiber_manager_start(&m, NULL));
    /* The manager is a container of this run. */
    CHECK(run_containers(fiber_run_id(), NULL, 0, 1) == 1);
    fiber_mobj *d, *v;
    CHECK_OK(fiber_manager_dict(m, "d", &d));
    CHECK_OK(fiber_dict_set(d, "k", 1, "value", 5, NULL));
    fiber_buf got = {0};
    CHECK_OK(fiber_dict_get(d, "k", 1, &got, NULL));
    CHECK(got.len == 5 && memcmp(got.data, "value", 5) == 0);
    fiber_buf_free(&got);
    CHECK_OK(fiber_manager_value(m, "v", 0, &v));
    fiber_buf b = {0};
    CHECK_OK(fiber_mobj_serialize(v, &b));
    struct handle_arg h = handle_arg_of(&b, 50);
    fiber_buf_free(&b);
    fiber_process *ps[2] = {start("add_to_value", &h, sizeof h),
                            start("add_to_value", &h, sizeof h)};
    CHECK_EQ(join_code(ps[0]), 0);
    CHECK_EQ(join_code(ps[1]), 0);
    int64_t total = 0;
    CHECK_OK(fiber_value_get(v, &total, NULL));
    CHECK_EQ(total, 100);
    fiber_mobj_free(d);
    fiber_mobj_free(v);
    fiber_manager_free(m);
}

/* ---- a master killed with SIGKILL ------------------------------------------- */

/* A second master (FIBER_BACKEND and FIBER_IMAGE from the test): starts
 * three containers, waits until each is up, prints its run id, sleeps. */
TEST(helper_docker_master)
{
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 0));
    fiber_buf b = {0};
    CHECK_OK(fiber_queue_serialize(q, &b));
    struct handle_arg h = handle_arg_of(&b, 120000);
    fiber_buf_free(&b);
    for (int i = 0; i < 3; i++)
        start("put_then_sleep", &h, sizeof h);
    for (int i = 0; i < 3; i++)
        CHECK_OK(fiber_queue_get(q, NULL, 60000));
    printf("%s\n", fiber_run_id());
    fflush(stdout);
    sleep_ms(120000);
}

TEST(master_sigkill_leaves_no_container)
{
    NEED_DOCKER();
    use_docker();
    int out[2];
    CHECK(pipe(out) == 0);
    pid_t master = fork();
    CHECK(master >= 0);
    if (master == 0) {
        dup2(out[1], 1);
        setenv("FIBER_BACKEND", "docker", 1);
        setenv("FIBER_IMAGE", image_tag, 1);
        execl("/proc/self/exe", "test_docker", "helper_docker_master",
              (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    FILE *f = fdopen(out[0], "r");
    char run[64] = "";
    CHECK(fscanf(f, "%63s", run) == 1);
    fclose(f);
    CHECK_EQ(run_containers(run, NULL, 0, 1), 3);
    CHECK(kill(master, SIGKILL) == 0);
    waitpid(master, NULL, 0);
    uint64_t t0 = fb_now_ms();
    size_t left = wait_containers_gone(run, 10000);
    if (left)
        TH_FAIL("%zu containers of run %s remain 10 s after their master "
                "was killed",
                left, run);
    fprintf(stderr, "containers gone %llu ms after the master\n",
            (unsigned long long)(fb_now_ms() - t0));
}

/* ---- failures that must say what to do -------------------------------------- */

/* Needs no engine: the point is that there is none. */
TEST(unreachable_engine_is_named)
{
    CHECK_OK(fiber_config_set("backend", "docker"));
    CHECK_OK(fiber_config_set("image", "whatever:1"));
    CHECK_OK(fiber_config_set("docker_socket", "/tmp/nonexistent.sock"));
    fiber_process *p = NULL;
    CHECK_ERR(fiber_process_start(&p, "ret_arg", NULL, 0, NULL),
              FIBER_EUNREACHABLE);
    CHECK(p == NULL);
    CHECK_CONTAINS(fiber_last_error(), "/tmp/nonexistent.sock");
    CHECK_CONTAINS(fiber_last_error(), "is dockerd running?");
    CHECK_CONTAINS(fiber_last_error(), "FIBER_DOCKER_SOCKET");
    fprintf(stderr, "message: %s\n", fiber_last_error());
}

/* A socket file nobody listens on. */
TEST(dead_engine_socket_is_unreachable)
{
    char path[108];
    snprintf(path, sizeof path, "/tmp/fiber-test-dead-%d.sock", (int)getpid());
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    fb_strlcpy(a.sun_path, path, sizeof a.sun_path);
    unlink(path);
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    close(fd);
    CHECK_OK(fiber_config_set("backend", "docker"));
    CHECK_OK(fiber_config_set("image", "whatever:1"));
    CHECK_OK(fiber_config_set("docker_socket", path));
    fiber_process *p = NULL;
    int rc = fiber_process_start(&p, "ret_arg", NULL, 0, NULL);
    unlink(path);
    CHECK_ERR(rc, FIBER_EUNREACHABLE);
    CHECK_CONTAINS(fiber_last_error(), path);
    CHECK_CONTAINS(fiber_last_error(), "is dockerd running?");
    fprintf(stderr, "message: %s\n", fiber_last_error());
}

TEST(bad_images_and_options_are_explained)
{
    NEED_DOCKER();
    CHECK_OK(fiber_config_set("backend", "docker"));
    fiber_process *p = NULL;
    /* No image at all. */
    CHECK_ERR(fiber_process_start(&p, "ret_arg", NULL, 0, NULL),
              FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "fiber image build");
    CHECK_CONTAINS(fiber_last_error(), "`image`");
    /* An image the engine does not have. */
    fiber_job_opts o = {.image = "fiber-no-such-image:nope"};
    CHECK_ERR(fiber_process_start(&p, "ret_arg", NULL, 0, &o), FIBER_ESPAWN);
    CHECK_CONTAINS(fiber_last_error(), "fiber-no-such-image:nope");
    CHECK_CONTAINS(fiber_last_error(), "fiber image build");
    fprintf(stderr, "message: %s\n", fiber_last_error());
    /* A name that is not an image reference. */
    o.image = "Not/A..Valid:Ref";
    CHECK_ERR(fiber_process_start(&p, "ret_arg", NULL, 0, &o), FIBER_ESPAWN);
    CHECK_CONTAINS(fiber_last_error(), "Not/A..Valid:Ref");
    fprintf(stderr, "message: %s\n", fiber_last_error());
    /* An image without this program. */
    struct tar *t = calloc(1, sizeof *t);
    CHECK(t != NULL);
    tar_file(t, "/etc/hostname");
    char tag[64], name[128];
    snprintf(tag, sizeof tag, "%s-empty", fiber_run_id());
    snprintf(name, sizeof name, "%s:%s", IMAGE_REPO, tag);
    import_tar(t, IMAGE_REPO, tag);
    o.image = name;
    int rc = fiber_process_start(&p, "ret_arg", NULL, 0, &o);
    remove_image_named(name);
    CHECK_ERR(rc, FIBER_ESPAWN);
    CHECK_CONTAINS(fiber_last_error(), name);
    CHECK_CONTAINS(fiber_last_error(), "does not hold");
    CHECK_CONTAINS(fiber_last_error(), "fiber image build");
    fprintf(stderr, "message: %s\n", fiber_last_error());
    /* GPUs on an engine without a GPU runtime (skipped where there is
     * one). */
    use_docker();
    o.image = NULL;
    o.gpu = 1;
    rc = fiber_process_start(&p, "ret_arg", NULL, 0, &o);
    if (rc == 0) {
        fprintf(stderr, "this engine has a GPU runtime: GPU job started\n");
        CHECK_EQ(join_code(p), 0);
        p = NULL;
    } else {
        CHECK_ERR(rc, FIBER_ENOTSUP);
        CHECK_CONTAINS(fiber_last_error(), "GPU runtime");
        fprintf(stderr, "message: %s\n", fiber_last_error());
    }
    CHECK(p == NULL);
    CHECK_EQ(wait_containers_gone(fiber_run_id(), 10000), 0);
}

/* ---- the ops table directly: logs, labels, mounts, the secret --------------- */

TEST(helper_print_and_sleep)
{
    printf("hello on stdout\n");
    fflush(stdout);
    fprintf(stderr, "hello on stderr\n");
    sleep_ms(60000);
}

TEST(backend_ops_logs_labels_secret)
{
    NEED_DOCKER();
    use_docker();
    struct fb_config cfg;
    fb_config_defaults(&cfg);
    fb_strlcpy(cfg.image, image_tag, sizeof cfg.image);
    fb_strlcpy(cfg.docker_mounts, "/etc/hostname:/mnt/hostname:ro",
               sizeof cfg.docker_mounts);
    struct fb_backend *be;
    CHECK_OK(fb_backend_open(&be, "docker", &cfg, fiber_run_id()));
    char run_dir[] = "/tmp/fiber-test-docker-XXXXXX";
    CHECK(mkdtemp(run_dir) != NULL);
    char exe[PATH_MAX], log_dir[PATH_MAX];
    exe_path(exe, sizeof exe);
    snprintf(log_dir, sizeof log_dir, "%s/logs", run_dir);
    char *argv[] = {"test_docker", "helper_print_and_sleep", NULL};
    char *env[] = {"FIBERTEST_X=1", NULL};
    const char secret[] = "not-a-real-token-but-32-bytes!!";
    fiber_job_opts opts = {.cpu = 1, .memory_mb = 64, .workdir = "/tmp"};
    struct fb_job_spec spec = {.program = exe, .argv = argv, .env = env,
                               .secret = secret, .secret_len = 32,
                               .name = "direct-1", .opts = &opts,
                               .job_id = 7, .run_dir = run_dir,
                               .log_dir = log_dir};
    struct fb_job *job;
    CHECK_OK(fb_backend_create_job(be, &spec, &job));
    CHECK_EQ(fb_backend_event_fd(be, job), -1);
    /* The secret: a file only the user can read, in the run directory. */
    char secret_path[PATH_MAX];
    snprintf(secret_path, sizeof secret_path, "%s/secrets/7", run_dir);
    struct stat st;
    CHECK(stat(secret_path, &st) == 0);
    CHECK_EQ(st.st_mode & 0777, 0600);
    /* The container: labels, mounts, and no token in its configuration. */
    char ids[2][80];
    char filter[300], escaped[600], path[900];
    snprintf(filter, sizeof filter,
             "{\"label\":[\"fiber.run=%s\",\"fiber.job=7\","
             "\"fiber.name=direct-1\",\"fiber.role=job\"]}",
             fiber_run_id());
    fb_http_escape(filter, escaped, sizeof escaped);
    snprintf(path, sizeof path, "/containers/json?filters=%s", escaped);
    json_t *list = NULL;
    CHECK_EQ(engine_call("GET", path, &list), 200);
    CHECK_EQ(json_array_size(list), 1);
    fb_strlcpy(ids[0],
               json_string_value(json_object_get(json_array_get(list, 0), "Id")),
               sizeof ids[0]);
    json_decref(list);
    snprintf(path, sizeof path, "/containers/%s/json", ids[0]);
    json_t *c = NULL;
    CHECK_EQ(engine_call("GET", path, &c), 200);
    char *text = json_dumps(c, 0);
    CHECK(text && !strstr(text, secret));
    json_t *hc = json_object_get(c, "HostConfig");
    CHECK(json_is_true(json_object_get(hc, "AutoRemove")));
    CHECK(json_is_true(json_object_get(hc, "Init")));
    CHECK_STR(json_string_value(json_object_get(hc, "NetworkMode")), "host");
    CHECK_EQ(json_integer_value(json_object_get(hc, "NanoCpus")), 1000000000);
    CHECK_EQ(json_integer_value(json_object_get(hc, "Memory")), 64 << 20);
    json_t *cc = json_object_get(c, "Config");
    CHECK_STR(json_string_value(json_object_get(cc, "WorkingDir")), "/tmp");
    char user[32];
    snprintf(user, sizeof user, "%u:%u", (unsigned)geteuid(),
             (unsigned)getegid());
    CHECK_STR(json_string_value(json_object_get(cc, "User")), user);
    CHECK_STR(json_string_value(json_array_get(
                  json_object_get(cc, "Entrypoint"), 0)),
              exe);
    char want[PATH_MAX * 2 + 8];
    snprintf(want, sizeof want, "\"%s:%s:ro\"", secret_path, secret_path);
    CHECK_CONTAINS(text, want);
    CHECK_CONTAINS(text, "/etc/hostname:/mnt/hostname:ro");
    CHECK_CONTAINS(text, "FIBERTEST_X=1");
    free(text);
    json_decref(c);
    /* Logs, both streams, demultiplexed. */
    fiber_buf logs = {0};
    uint64_t deadline = fb_now_ms() + 20000;
    for (;;) {
        logs.len = 0;
        CHECK_OK(fb_backend_logs(be, job, &logs));
        CHECK_OK(fiber_buf_append(&logs, "", 1));
        if (strstr((char *)logs.data, "hello on stderr") ||
            fb_now_ms() > deadline)
            break;
        sleep_ms(100);
    }
    CHECK_CONTAINS((char *)logs.data, "hello on stdout\n");
    CHECK_CONTAINS((char *)logs.data, "hello on stderr\n");
    CHECK_CONTAINS((char *)logs.data, "-- helper_print_and_sleep\n");
    /* No stream headers left in (each holds zero bytes). */
    CHECK(memchr(logs.data, 0, logs.len - 1) == NULL);
    fiber_buf_free(&logs);
    /* Polling, a polite signal, the exit status. */
    CHECK_OK(fb_backend_poll_job(be, job));
    CHECK_EQ(job->state, FB_JOB_RUNNING);
    CHECK_OK(fb_backend_signal_job(be, job, 0));
    deadline = fb_now_ms() + 20000;
    while (job->state != FB_JOB_EXITED && fb_now_ms() < deadline) {
        CHECK_OK(fb_backend_poll_job(be, job));
        sleep_ms(20);
    }
    CHECK_EQ(job->state, FB_JOB_EXITED);
    CHECK_EQ(job->exit_status, -SIGTERM);
    CHECK_EQ(fb_backend_release_job(be, job), -SIGTERM);
    CHECK(access(secret_path, F_OK) != 0);
    /* A second job released while it runs is killed and removed. */
    spec.job_id = 8;
    spec.name = "direct-2";
    CHECK_OK(fb_backend_create_job(be, &spec, &job));
    CHECK_EQ(fb_backend_release_job(be, job), -SIGKILL);
    fb_backend_close(be);
    CHECK_EQ(wait_containers_gone(fiber_run_id(), 10000), 0);
    char secrets[PATH_MAX];
    snprintf(secrets, sizeof secrets, "%s/secrets", run_dir);
    CHECK(access(secrets, F_OK) != 0);
    rmdir(log_dir);
    CHECK(rmdir(run_dir) == 0);
}

/* ---- figures: start latency, next to `docker run --rm` ----------------------- */

static double run_docker_cli(const char *image, const char *exe)
{
    uint64_t t0 = fb_now_ns();
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        dup2(devnull, 2);
        execlp("docker", "docker", "run", "--rm", "--network", "host",
               "--init", "--entrypoint", exe, image, "--list", (char *)NULL);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return -1;
    return (double)(fb_now_ns() - t0) / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

TEST(start_latency_figures)
{
    NEED_DOCKER();
    use_docker();
    enum { N = 9 };
    double create_ms[N], up_ms[N], cli_ms[N];
    for (int i = 0; i < N; i++) {
        uint64_t t0 = fb_now_ns();
        fiber_process *p = start_int("note_up", 0);
        uint64_t t1 = fb_now_ns();
        char note[16];
        CHECK_OK(fb_process_wait_note(p, note, sizeof note, 60000));
        uint64_t t2 = fb_now_ns();
        CHECK_EQ(join_code(p), 0);
        create_ms[i] = (double)(t1 - t0) / 1e6;
        up_ms[i] = (double)(t2 - t0) / 1e6;
    }
    char exe[PATH_MAX];
    exe_path(exe, sizeof exe);
    int have_cli = 1;
    for (int i = 0; i < N && have_cli; i++)
        have_cli = (cli_ms[i] = run_docker_cli(image_tag, exe)) > 0;
    char escaped[256], path[400];
    fb_http_escape(image_tag, escaped, sizeof escaped);
    snprintf(path, sizeof path, "/images/%s/json", escaped);
    json_t *img = NULL;
    CHECK_EQ(engine_call("GET", path, &img), 200);
    double size_mb = (double)json_integer_value(json_object_get(img, "Size")) /
                     1e6;
    json_decref(img);
    qsort(create_ms, N, sizeof create_ms[0], cmp_double);
    qsort(up_ms, N, sizeof up_ms[0], cmp_double);
    qsort(cli_ms, N, sizeof cli_ms[0], cmp_double);
    fprintf(stderr,
            "docker backend, median of %d: create+start %.0f ms, start to "
            "task running (connected) %.0f ms\n",
            N, create_ms[N / 2], up_ms[N / 2]);
    if (have_cli)
        fprintf(stderr, "docker run --rm of the same image (the program "
                        "runs and exits): median %.0f ms\n",
                cli_ms[N / 2]);
    else
        fprintf(stderr, "docker command not available: no peer figure\n");
    fprintf(stderr, "image %s: %.1f MB\n", image_tag, size_mb);
}


/* ---- docker_build_image and a bridge network ------------------------------- */

/* docker_build_image: with no image set, the backend builds one of the
 * running program (its default tag) when it opens, and runs the jobs in
 * it.  The image is removed afterwards. */
TEST(builds_an_image_of_the_program_when_asked)
{
    NEED_DOCKER();
    char exe[PATH_MAX], tag[256];
    exe_path(exe, sizeof exe);
    CHECK_OK(fiber_image_default_tag(exe, tag, sizeof tag));
    CHECK_OK(fiber_config_set("backend", "docker"));
    CHECK_OK(fiber_config_set("image", ""));
    CHECK_OK(fiber_config_set("docker_build_image", "true"));
    char v[16];
    CHECK_OK(fiber_config_get("docker_build_image", v, sizeof v));
    CHECK_STR(v, "true");
    fiber_process *p = start_int("in_container", (int)getuid());
    CHECK_EQ(fiber_process_pid(p), -1);
    CHECK_EQ(join_code(p), 0);
    fiber_image_info info;
    CHECK_OK(fiber_image_inspect(tag, &info));
    CHECK_STR(info.program, exe);
    fiber_shutdown();
    engine_open();
    remove_image_named(tag);
    CHECK_ERR(fiber_image_inspect(tag, &info), FIBER_ENOKEY);
}

struct progress_log {
    int lines;
    char first[512], last[512];
    fiber_buf all;
};

static void on_progress(void *ud, const char *line)
{
    struct progress_log *l = ud;
    if (l->lines++ == 0)
        fb_strlcpy(l->first, line, sizeof l->first);
    fb_strlcpy(l->last, line, sizeof l->last);
    fiber_buf_append(&l->all, line, strlen(line));
    fiber_buf_append(&l->all, "\n", 2); /* keeps it NUL-terminated */
    l->all.len--;
}

/* fiber_image_build_with reports each stage to its callback, and nothing
 * anywhere without one: stderr stays empty. */
TEST(image_build_reports_progress_only_when_asked)
{
    NEED_DOCKER();
    char exe[PATH_MAX], tag[128];
    exe_path(exe, sizeof exe);
    snprintf(tag, sizeof tag, "fiber-test-docker:progress-%d", (int)getpid());
    struct progress_log l = {0};
    fiber_image_build_opts o = {.tag = tag, .progress = on_progress,
                                .progress_ud = &l};
    fiber_buf id = {0};
    CHECK_OK(fiber_image_build_with(exe, &o, &id));
    fprintf(stderr, "%s", (const char *)l.all.data);
    CHECK(l.lines >= 5);
    CHECK(strncmp(l.first, "program ", 8) == 0);
    CHECK_CONTAINS(l.first, exe);
    CHECK_CONTAINS((const char *)l.all.data, "\nlibraries: ");
    CHECK_CONTAINS((const char *)l.all.data, "\narchive: ");
    CHECK_CONTAINS((const char *)l.all.data, "\nimporting ");
    CHECK(strncmp(l.last, "built ", 6) == 0);
    CHECK_CONTAINS(l.last, (const char *)id.data);
    fiber_buf_free(&l.all);

    /* Without a callback: not a byte on stderr. */
    fflush(stderr);
    int saved = dup(2), fds[2];
    CHECK(saved >= 0 && pipe(fds) == 0);
    dup2(fds[1], 2);
    close(fds[1]);
    int rc = fiber_image_build(exe, tag, &id);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    char buf[256];
    ssize_t n = read(fds[0], buf, sizeof buf);
    close(fds[0]);
    CHECK_OK(rc);
    CHECK(n <= 0);
    fiber_buf_free(&id);
    engine_open();
    remove_image_named(tag);
}

struct racer {
    pthread_barrier_t *go;
    int rc, code;
};

static void *start_one(void *arg)
{
    struct racer *r = arg;
    pthread_barrier_wait(r->go);
    int x = 21;
    fiber_process *p = NULL;
    r->rc = fiber_process_start(&p, "ret_arg", &x, sizeof x, NULL);
    if (r->rc == 0 && (r->rc = fiber_process_join(p, 60000)) == 0)
        r->rc = fiber_process_exitcode(p, &r->code);
    if (r->rc)
        fprintf(stderr, "start: %s\n", fiber_last_error());
    fiber_process_free(p);
    return NULL;
}

/* The backend builds its image within init without ever releasing the
 * runtime lock (backend.h): a second thread that starts a job meanwhile
 * waits for the backend and succeeds (it used to fail with FIBER_ESTATE,
 * "being opened by another thread", while the lock was dropped). */
TEST(jobs_started_during_the_image_build_wait_for_it)
{
    NEED_DOCKER();
    char exe[PATH_MAX], tag[256];
    exe_path(exe, sizeof exe);
    CHECK_OK(fiber_image_default_tag(exe, tag, sizeof tag));
    CHECK_OK(fiber_config_set("backend", "docker"));
    CHECK_OK(fiber_config_set("image", ""));
    CHECK_OK(fiber_config_set("docker_build_image", "true"));
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    struct racer a = {&go, -1, -1}, b = {&go, -1, -1};
    pthread_t ta, tb;
    CHECK(pthread_create(&ta, NULL, start_one, &a) == 0);
    CHECK(pthread_create(&tb, NULL, start_one, &b) == 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_barrier_destroy(&go);
    CHECK_OK(a.rc);
    CHECK_OK(b.rc);
    CHECK_EQ(a.code, 21);
    CHECK_EQ(b.code, 21);
    fiber_shutdown();
    engine_open();
    remove_image_named(tag);
}

static char net_id[80];

static void remove_network(void)
{
    if (!net_id[0])
        return;
    fiber_shutdown(); /* its containers first */
    char path[200];
    snprintf(path, sizeof path, "/networks/%s", net_id);
    long status = 0;
    if (fb_http_json(&engine, "DELETE", path, NULL, 60000, &status, NULL) ||
        (status != 204 && status != 404))
        fprintf(stderr, "could not remove network %s (HTTP %ld)\n", net_id,
                status);
    net_id[0] = '\0';
}

/* A user-defined bridge network instead of the host's: the master listens
 * on the network's gateway (an address of this host on that bridge), and
 * the job's container, attached to the network, dials it there. */
TEST(jobs_on_a_bridge_network_dial_its_gateway)
{
    NEED_DOCKER();
    engine_open();
    char name[96];
    snprintf(name, sizeof name, "%s-net", fiber_run_id());
    json_t *body = json_pack("{s:s, s:s, s:b}", "Name", name, "Driver",
                             "bridge", "CheckDuplicate", 1);
    CHECK(body != NULL);
    long status = 0;
    json_t *reply = NULL;
    CHECK_OK(fb_http_json(&engine, "POST", "/networks/create", body, 60000,
                          &status, &reply));
    json_decref(body);
    const char *id = json_string_value(json_object_get(reply, "Id"));
    if (status != 201 || !id)
        TH_FAIL("cannot create network %s (HTTP %ld)", name, status);
    fb_strlcpy(net_id, id, sizeof net_id);
    json_decref(reply);
    atexit(remove_network);
    char path[200];
    snprintf(path, sizeof path, "/networks/%s", net_id);
    CHECK_EQ(engine_call("GET", path, &reply), 200);
    json_t *cfg = json_array_get(
        json_object_get(json_object_get(reply, "IPAM"), "Config"), 0);
    const char *gw = json_string_value(json_object_get(cfg, "Gateway"));
    if (!gw)
        TH_FAIL("network %s has no gateway address", name);
    char gateway[64];
    fb_strlcpy(gateway, gw, sizeof gateway);
    json_decref(reply);
    fprintf(stderr, "network %s, gateway %s\n", name, gateway);

    use_docker();
    CHECK_OK(fiber_config_set("docker_network", name));
    CHECK_OK(fiber_config_set("listen_host", gateway));
    fiber_process *s = start_int("sleeper", 60000);
    fiber_process *p = start_int("in_container", (int)getuid());
    CHECK_EQ(join_code(p), 0);
    /* The sleeper's container is on the network, not the host's. */
    char ids[4][80];
    CHECK(run_containers(fiber_run_id(), ids, 4, 1) >= 1);
    snprintf(path, sizeof path, "/containers/%s/json", ids[0]);
    CHECK_EQ(engine_call("GET", path, &reply), 200);
    json_t *hc = json_object_get(reply, "HostConfig");
    CHECK_STR(json_string_value(json_object_get(hc, "NetworkMode")), name);
    json_t *nets = json_object_get(
        json_object_get(reply, "NetworkSettings"), "Networks");
    CHECK(json_object_get(nets, name) != NULL);
    json_decref(reply);
    CHECK_OK(fiber_process_terminate(s));
    CHECK_EQ(join_code(s), -SIGTERM);
    remove_network();
}

TH_MAIN()
