/*
 * bench_pipe.c -- fiber_pipe throughput and round trip between two
 * processes, against Python's multiprocessing.Pipe.
 *
 * The master creates a duplex pipe and starts one child with the other
 * end.  Throughput: the master sends "go", the child sends --messages
 * 64-byte messages and one end marker; the rate is messages / (time the
 * master read the end marker - time it sent go), median of --runs runs.
 * Round trip: the master sends one 64-byte message, the child sends it
 * back; --samples round trips after a warm-up, median and p99.
 *
 * The two ends are first used in two processes, so they connect directly
 * (a unix socket here; docs/pipe.md), as multiprocessing.Pipe's socket
 * pair does; the first messages may still take the relayed path while the
 * link forms.
 * The peer (peer/pipe_peer.py) measures the same with send_bytes and
 * recv_bytes (no pickling) in the same run.  The last line of output is
 * one JSON object.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fiber/fiber.h>

#include "bench_common.h"

#define PROG "bench-pipe"
#define MSG_BYTES 64
#define WARMUP 200

enum { C_GO = 1, C_RTT = 2, C_STOP = 3 };

struct job {
    uint64_t messages, samples;
    uint32_t len;
    unsigned char end[320];
};

struct options {
    long messages, runs, samples;
    int no_peer;
};

struct figures {
    struct bench_stats rate;
    double rtt_median_us, rtt_p99_us;
};

static const struct bench_figure figure_keys[] = {
    {"msgs_per_s_pipe", offsetof(struct figures, rate.median), 1, 0},
    {"pipe_rtt_median_us", offsetof(struct figures, rtt_median_us), 2, 0},
    {"pipe_rtt_p99_us", offsetof(struct figures, rtt_p99_us), 2, 0},
};
#define N_FIGURES (sizeof figure_keys / sizeof figure_keys[0])

/* ---- the child ----------------------------------------------------------- */

/* Serves commands until C_STOP: C_GO sends the stream, C_RTT echoes
 * `samples + WARMUP` messages. */
FIBER_TASK(bp_child)
{
    struct job j;
    if (len != sizeof j)
        return fiber_task_fail("bp_child: bad argument");
    memcpy(&j, arg, sizeof j);
    fiber_pipe *p;
    if (fiber_pipe_open(&p, j.end, j.len) != 0)
        return fiber_task_fail("bp_child: open: %s", fiber_last_error());
    unsigned char msg[MSG_BYTES] = {0};
    fiber_buf b = {0};
    int rc = 0;
    while (rc == 0) {
        b.len = 0;
        if ((rc = fiber_pipe_recv(p, &b, -1)) != 0 || b.len != 1)
            break;
        if (b.data[0] == C_STOP)
            break;
        if (b.data[0] == C_GO) {
            for (uint64_t i = 0; rc == 0 && i < j.messages; i++)
                rc = fiber_pipe_send(p, msg, sizeof msg, -1);
            if (rc == 0)
                rc = fiber_pipe_send(p, "e", 1, -1);
            continue;
        }
        for (uint64_t i = 0; rc == 0 && i < j.samples + WARMUP; i++) {
            b.len = 0;
            rc = fiber_pipe_recv(p, &b, -1);
            if (rc == 0)
                rc = fiber_pipe_send(p, b.data, b.len, -1);
        }
    }
    fiber_buf_free(&b);
    fiber_pipe_free(p);
    return rc ? fiber_task_fail("bp_child: %s", fiber_last_error()) : 0;
}

/* ---- the master ---------------------------------------------------------- */

static int command(fiber_pipe *p, unsigned char c)
{
    return fiber_pipe_send(p, &c, 1, -1);
}

/* One throughput run: messages per second. */
static int stream(fiber_pipe *p, long messages, double *rate)
{
    fiber_buf b = {0};
    uint64_t t0 = bench_now_ns();
    int rc = command(p, C_GO);
    long got = 0;
    while (rc == 0) {
        b.len = 0;
        rc = fiber_pipe_recv(p, &b, -1);
        if (rc == 0 && b.len == 1)
            break;
        got++;
    }
    uint64_t t1 = bench_now_ns();
    fiber_buf_free(&b);
    if (rc == 0 && got != messages) {
        fprintf(stderr, PROG ": got %ld messages, want %ld\n", got, messages);
        return -1;
    }
    *rate = (double)messages / ((double)(t1 - t0) / 1e9);
    return rc;
}

static int round_trips(fiber_pipe *p, long samples, struct figures *f)
{
    double *rtt = calloc((size_t)samples, sizeof *rtt);
    unsigned char msg[MSG_BYTES] = {0};
    fiber_buf b = {0};
    int rc = rtt ? command(p, C_RTT) : -1;
    for (long i = 0; rc == 0 && i < samples + WARMUP; i++) {
        uint64_t t0 = bench_now_ns();
        rc = fiber_pipe_send(p, msg, sizeof msg, -1);
        b.len = 0;
        if (rc == 0)
            rc = fiber_pipe_recv(p, &b, -1);
        if (rc == 0 && i >= WARMUP)
            rtt[i - WARMUP] = (double)(bench_now_ns() - t0) / 1e3;
    }
    if (rc == 0) {
        f->rtt_median_us = bench_median(rtt, (size_t)samples);
        f->rtt_p99_us = bench_percentile(rtt, (size_t)samples, 99);
    }
    fiber_buf_free(&b);
    free(rtt);
    return rc;
}

static int run_fiber(const struct options *o, struct figures *f)
{
    fiber_pipe *mine, *theirs;
    if (fiber_pipe_create(&mine, &theirs, 1) != 0)
        return -1;
    struct job j = {.messages = (uint64_t)o->messages,
                    .samples = (uint64_t)o->samples};
    fiber_buf b = {0};
    fiber_process *child = NULL;
    int rc = fiber_pipe_serialize(theirs, &b);
    if (rc == 0 && b.len <= sizeof j.end) {
        memcpy(j.end, b.data, b.len);
        j.len = (uint32_t)b.len;
        rc = fiber_process_start(&child, "bp_child", &j, sizeof j, NULL);
    }
    fiber_buf_free(&b);
    double *rates = calloc((size_t)o->runs, sizeof *rates);
    for (long r = 0; rc == 0 && r < o->runs; r++) {
        rc = stream(mine, o->messages, &rates[r]);
        if (rc == 0)
            printf("fiber  pipe run %ld: %12.0f msgs/s\n", r + 1, rates[r]);
        fflush(stdout);
    }
    if (rc == 0)
        f->rate = bench_summarize(rates, (size_t)o->runs);
    if (rc == 0)
        rc = round_trips(mine, o->samples, f);
    if (rc == 0)
        printf("fiber  pipe round trip: median %.1f us, p99 %.1f us\n",
               f->rtt_median_us, f->rtt_p99_us);
    if (rc) /* before stopping the child, which may fail too */
        fprintf(stderr, PROG ": %s\n", fiber_last_error());
    if (child) {
        command(mine, C_STOP);
        fiber_process_join(child, 60000);
        fiber_process_free(child);
    }
    free(rates);
    fiber_pipe_free(mine);
    fiber_pipe_free(theirs);
    return rc;
}

/* ---- output ---------------------------------------------------------------- */

static void print_table(const struct options *o, const struct figures *f,
                        const struct figures *p)
{
    printf("\n%-24s %12s %22s %12s %9s\n", "", "fiber", "fiber min..max",
           "mp.Pipe", "fiber/mp");
    printf("%-24s %12.0f %10.0f..%-11.0f", "msgs/s one way", f->rate.median,
           f->rate.min, f->rate.max);
    if (p)
        printf(" %12.0f %8.2fx\n", p->rate.median,
               f->rate.median / p->rate.median);
    else
        printf(" %12s %9s\n", "-", "-");
    printf("%-24s %12.1f %22s", "round trip median (us)", f->rtt_median_us,
           "");
    if (p)
        printf(" %12.1f %8.2fx\n", p->rtt_median_us,
               p->rtt_median_us / f->rtt_median_us);
    else
        printf(" %12s %9s\n", "-", "-");
    printf("%-24s %12.1f %22s", "round trip p99 (us)", f->rtt_p99_us, "");
    if (p)
        printf(" %12.1f %8.2fx\n", p->rtt_p99_us,
               p->rtt_p99_us / f->rtt_p99_us);
    else
        printf(" %12s %9s\n", "-", "-");
    printf("(%ld messages of %d bytes per run, median of %ld runs; %ld round "
           "trips;\n fiber/mp > 1 means fiber is better)\n\n",
           o->messages, MSG_BYTES, o->runs, o->samples);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--messages N] [--runs R] [--samples S] "
            "[--no-peer] [--help]\n"
            "fiber_pipe between two processes against "
            "multiprocessing.Pipe:\n"
            "one-way messages per second (64 bytes) and the round trip of "
            "one message.\n"
            "  --messages N  messages per throughput run (default 1000000)\n"
            "  --runs R      throughput runs; the median is kept (default "
            "3)\n"
            "  --samples S   round trips timed (default 5000)\n"
            "  --no-peer     skip Python multiprocessing (peer/pipe_peer.py)\n"
            "The last line of output is one JSON object.\n");
}

int main(int argc, char **argv)
{
    if (bench_init(PROG, &argc, &argv) != 0)
        return 1;
    struct options o = {1000000, 3, 5000, 0};
    const struct bench_flag flags[] = {
        {"--no-peer", .on = &o.no_peer},
        {"--messages", .value = &o.messages, .lo = 8, .hi = 1000000000L},
        {"--runs", .value = &o.runs, .lo = 1, .hi = 64},
        {"--samples", .value = &o.samples, .lo = 1, .hi = 10000000L},
        {NULL},
    };
    int rc = bench_parse_args(PROG, argc, argv, flags);
    if (rc != 0)
        return bench_usage_exit(rc, usage);
    printf(PROG ": fiber %s, local backend, %ld messages of %d bytes, %ld "
           "runs\n",
           fiber_version(), o.messages, MSG_BYTES, o.runs);
    fflush(stdout);
    struct figures f, p, *pp = NULL;
    if (run_fiber(&o, &f) != 0) {
        fprintf(stderr, PROG ": FAILED\n");
        return 1;
    }
    char args[200];
    snprintf(args, sizeof args, "--messages %ld --runs %ld --samples %ld",
             o.messages, o.runs, o.samples);
    if (!o.no_peer &&
        bench_peer_done(PROG, bench_peer_figures(PROG, "pipe_peer.py", args,
                                                 figure_keys, N_FIGURES, &p)))
        pp = &p;
    print_table(&o, &f, pp);
    bench_json_open(NULL);
    bench_json_long("messages", o.messages);
    bench_json_long("msg_bytes", MSG_BYTES);
    bench_json_long("runs", o.runs);
    bench_json_write(figure_keys, N_FIGURES, &f);
    bench_json_peer(figure_keys, N_FIGURES, pp);
    bench_json_close();
    return 0;
}
