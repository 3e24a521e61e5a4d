/*
 * bench_k8s.c -- how long the kubernetes backend takes from creating a
 * pod to the job running, connected and authenticated (its task sends a
 * note the moment it runs), for one pod at a time and for 32 at once:
 * started one after the other, and started as one batch, as a pool starts
 * its workers (the backend's begin_batch/end_batch: the kubernetes
 * backend then creates the pods concurrently).
 *
 * Run it with the kubernetes backend configured (FIBER_BACKEND=kubernetes
 * and the k8s_* keys; tests/k8s/run.sh sets them for the test cluster):
 *
 *     tests/k8s/run.sh build/bin/bench-k8s
 *
 * The peer is this benchmark again on the local backend (the same
 * measurement with fork/exec instead of the API server and a node), run
 * as a child of this one, so both see the same machine.  Output: figures
 * on stdout, then as the LAST line one JSON object.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fiber/fiber.h>

#include "bench_common.h"
#include "runtime/child.h"
#include "runtime/runtime.h"

#define PROG "bench-k8s"
#define MANY 32
#define NOTE_TIMEOUT_MS 120000

int fb_process_wait_note(fiber_process *p, char *buf, size_t size,
                         int timeout_ms);

FIBER_TASK(bench_note_up) { return fb_child_note(0, "up") == 0 ? 0 : 1; }

struct figures {
    double create_ms;       /* fiber_process_start returned */
    double connected_ms;    /* the task runs, connected */
    double create_32_ms;    /* 32 starts returned */
    double connected_32_ms; /* the last of 32 runs, connected */
    double batch_create_32_ms;    /* 32 started as one batch */
    double batch_connected_32_ms; /* the last of those runs, connected */
};

static const struct bench_figure figs[] = {
    {"create_ms", offsetof(struct figures, create_ms), 1, 0},
    {"connected_ms", offsetof(struct figures, connected_ms), 1, 0},
    {"create_32_ms", offsetof(struct figures, create_32_ms), 1, 0},
    {"connected_32_ms", offsetof(struct figures, connected_32_ms), 1, 0},
    {"batch_create_32_ms", offsetof(struct figures, batch_create_32_ms), 1, 0},
    {"batch_connected_32_ms", offsetof(struct figures, batch_connected_32_ms),
     1, 0},
};

static double ms_since(uint64_t t0)
{
    return (double)(bench_now_ns() - t0) / 1e6;
}

static int one_at_a_time(long rounds, struct figures *f)
{
    double *create = calloc((size_t)rounds, sizeof *create);
    double *up = calloc((size_t)rounds, sizeof *up);
    for (long i = 0; create && up && i < rounds; i++) {
        fiber_process *p;
        char note[16];
        uint64_t t0 = bench_now_ns();
        if (fiber_process_start(&p, "bench_note_up", NULL, 0, NULL) != 0)
            goto fail;
        create[i] = ms_since(t0);
        if (fb_process_wait_note(p, note, sizeof note, NOTE_TIMEOUT_MS) != 0)
            goto fail;
        up[i] = ms_since(t0);
        fiber_process_join(p, NOTE_TIMEOUT_MS);
        fiber_process_free(p);
    }
    f->create_ms = bench_median(create, (size_t)rounds);
    f->connected_ms = bench_median(up, (size_t)rounds);
    free(create);
    free(up);
    return 0;
fail:
    fprintf(stderr, PROG ": %s\n", fiber_last_error());
    free(create);
    free(up);
    return -1;
}

/* 32 starts, then 32 notes; batched: the starts are one batch. */
static int all_at_once(long rounds, int batched, double *create_ms,
                       double *connected_ms)
{
    double create[16], up[16];
    if (rounds > 16)
        rounds = 16;
    for (long r = 0; r < rounds; r++) {
        fiber_process *ps[MANY];
        char note[16];
        uint64_t t0 = bench_now_ns();
        if (batched)
            fb_rt_batch_begin();
        for (int i = 0; i < MANY; i++)
            if (fiber_process_start(&ps[i], "bench_note_up", NULL, 0, NULL))
                goto fail;
        if (batched && fb_rt_batch_end() != 0)
            goto fail;
        create[r] = ms_since(t0);
        for (int i = 0; i < MANY; i++)
            if (fb_process_wait_note(ps[i], note, sizeof note,
                                     NOTE_TIMEOUT_MS) != 0)
                goto fail;
        up[r] = ms_since(t0);
        for (int i = 0; i < MANY; i++) {
            fiber_process_join(ps[i], NOTE_TIMEOUT_MS);
            fiber_process_free(ps[i]);
        }
    }
    *create_ms = bench_median(create, (size_t)rounds);
    *connected_ms = bench_median(up, (size_t)rounds);
    return 0;
fail:
    fprintf(stderr, PROG ": %s\n", fiber_last_error());
    return -1;
}

static void print_json(const struct figures *f, const struct figures *peer)
{
    printf("{\"bench\":\"k8s\"");
    for (size_t i = 0; i < sizeof figs / sizeof figs[0]; i++)
        printf(",\"%s\":%.1f", figs[i].key,
               *(const double *)((const char *)f + figs[i].offset));
    if (peer) {
        printf(",\"peer\":{");
        for (size_t i = 0; i < sizeof figs / sizeof figs[0]; i++)
            printf("%s\"%s\":%.1f", i ? "," : "", figs[i].key,
                   *(const double *)((const char *)peer + figs[i].offset));
        printf("}");
    } else {
        printf(",\"peer\":null");
    }
    printf("}\n");
}

/* The peer: this program on the local backend; its last line. */
static int run_local_peer(const char *self, long rounds, struct figures *p)
{
    char cmd[4400];
    snprintf(cmd, sizeof cmd,
             "FIBER_BACKEND=local '%s' --no-peer --rounds %ld", self, rounds);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    char line[1024], last[1024] = "";
    while (fgets(line, sizeof line, f))
        if (line[0] == '{')
            snprintf(last, sizeof last, "%s", line);
    if (pclose(f) != 0 || !last[0])
        return -1;
    return bench_json_read(PROG, last, figs, sizeof figs / sizeof figs[0], p);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " [--rounds N] [--no-peer]\n"
               "  pod create to job connected, one at a time (N rounds) "
               "and 32 at once;\n  run with the kubernetes backend "
               "configured (tests/k8s/run.sh does)\n");
}

int main(int argc, char **argv)
{
    if (bench_init(PROG, &argc, &argv) != 0)
        return 1;
    long rounds = 9;
    int no_peer = 0;
    const struct bench_flag flags[] = {
        {"--no-peer", .on = &no_peer},
        {"--rounds", .value = &rounds, .lo = 1, .hi = 1000},
        {NULL},
    };
    int rc = bench_parse_args(PROG, argc, argv, flags);
    if (rc != 0)
        return bench_usage_exit(rc, usage);
    char backend[32];
    fiber_config_get("backend", backend, sizeof backend);
    printf(PROG ": fiber %s, %s backend\n", fiber_version(), backend);
    struct figures f = {0}, peer = {0};
    if (one_at_a_time(rounds, &f) != 0 ||
        all_at_once(3, 0, &f.create_32_ms, &f.connected_32_ms) != 0 ||
        all_at_once(3, 1, &f.batch_create_32_ms, &f.batch_connected_32_ms) !=
            0) {
        fprintf(stderr, PROG ": FAILED\n");
        return 1;
    }
    printf("one at a time (median of %ld): start returns %.1f ms, "
           "connected %.1f ms\n",
           rounds, f.create_ms, f.connected_ms);
    printf("%d at once (median of 3): all started %.1f ms, all connected "
           "%.1f ms\n",
           MANY, f.create_32_ms, f.connected_32_ms);
    printf("%d at once as one batch (median of 3): all started %.1f ms, all "
           "connected %.1f ms\n",
           MANY, f.batch_create_32_ms, f.batch_connected_32_ms);
    int have_peer = 0;
    if (!no_peer && strcmp(backend, "local") != 0) {
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0) {
            self[n] = '\0';
            have_peer = run_local_peer(self, rounds, &peer) == 0;
        }
        if (have_peer)
            printf("peer, local backend: connected %.1f ms; 32 at once "
                   "%.1f ms (batch %.1f ms); ratios kubernetes/local: "
                   "one %.1fx, 32 %.1fx, 32 batched %.1fx\n",
                   peer.connected_ms, peer.connected_32_ms,
                   peer.batch_connected_32_ms,
                   f.connected_ms / peer.connected_ms,
                   f.connected_32_ms / peer.connected_32_ms,
                   f.batch_connected_32_ms / peer.batch_connected_32_ms);
        else
            fprintf(stderr, PROG ": no local peer figures\n");
    }
    print_json(&f, have_peer ? &peer : NULL);
    return 0;
}
