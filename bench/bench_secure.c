/*
 * bench_secure.c -- what encryption (net/secure.c) costs a connection,
 * without the scheduler in the way: both ends of a socketpair run in this
 * one thread, so every figure is CPU time and system calls, plaintext
 * against encrypted.
 *
 *   round trip: a 24-byte frame one way and one back (fb_conn_flush,
 *     fb_conn_read, fb_conn_next at each end), --calls times, timed one by
 *     one: median and 99th percentile in us.  Encrypted, that is four
 *     records sealed or opened.
 *   bulk: --mib MiB of 64 KiB frames one way, --runs times: the median
 *     MiB/s.  Encrypted, every byte is sealed and opened once.
 *
 * The pool's end-to-end figures over TCP (bench-latency, bench-throughput
 * with FIBER_TRANSPORT=tcp and FIBER_ENCRYPTION=true or false) add the
 * scheduler's noise to these.  No peer.  The LAST line of output is one
 * JSON object: rtt_plain_us, rtt_secure_us, p99 of each, bulk_plain_mib_s,
 * bulk_secure_mib_s.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <fiber/fiber.h>
#include <sodium.h>

#include "bench_common.h"
#include "net/net.h"
#include "wire/wire.h"

#define PROG "bench-secure"
#define FRAME_PAYLOAD 65536u

struct pair {
    struct fb_conn a, b;
};

static int open_pair(struct pair *p, int encrypted)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
                   sv) != 0) {
        perror(PROG ": socketpair");
        return -1;
    }
    fb_conn_init(&p->a, sv[0], 1u << 20);
    fb_conn_init(&p->b, sv[1], 1u << 20);
    if (encrypted) {
        uint8_t key[FB_SEC_PSK_LEN];
        randombytes_buf(key, sizeof key);
        if (fb_conn_secure(&p->a, FB_SEC_CLIENT, key) != 0 ||
            fb_conn_secure(&p->b, FB_SEC_SERVER, key) != 0) {
            fprintf(stderr, PROG ": %s\n", fiber_last_error());
            return -1;
        }
    }
    return 0;
}

static void close_pair(struct pair *p)
{
    fb_conn_close(&p->a);
    fb_conn_close(&p->b);
}

/* Sends what `from` holds and reads `to` until it has a frame (or bytes
 * frames' worth, for bulk); counts payload bytes received in *got. */
static int move(struct fb_conn *from, struct fb_conn *to, size_t want,
                size_t *got)
{
    size_t have = 0;
    while (have < want) {
        int rc = fb_conn_flush(from);
        if (rc < 0 || (rc = fb_conn_flush(to)) < 0 ||
            (rc = fb_conn_read(to)) != 0) {
            fprintf(stderr, PROG ": %s\n",
                    rc ? fb_conn_err(to) : fb_conn_err(from));
            return -1;
        }
        struct fb_wire_hdr h;
        const uint8_t *payload;
        while ((rc = fb_conn_next(to, &h, &payload)) == 1)
            have += FB_WIRE_HDR_LEN + h.len;
        if (rc < 0) {
            fprintf(stderr, PROG ": %s\n", fb_conn_err(to));
            return -1;
        }
    }
    if (got)
        *got += have;
    return 0;
}

static int round_trip(void *ctx)
{
    struct pair *p = ctx;
    if (fb_wire_put_ping(fb_conn_out(&p->a), 1) != 0 ||
        move(&p->a, &p->b, FB_WIRE_HDR_LEN, NULL) != 0 ||
        fb_wire_put_pong(fb_conn_out(&p->b), 1) != 0 ||
        move(&p->b, &p->a, FB_WIRE_HDR_LEN, NULL) != 0)
        return -1;
    return 0;
}

static int measure_rtt(int encrypted, long calls, struct bench_latency *l)
{
    struct pair p;
    if (open_pair(&p, encrypted) != 0)
        return -1;
    int rc = bench_time_calls(PROG, encrypted ? "encrypted round trip"
                                              : "plaintext round trip",
                              round_trip, &p, 2000, calls, l);
    close_pair(&p);
    return rc;
}

/* MiB/s of one run: mib MiB of 64 KiB frames from a to b. */
static int bulk_run(int encrypted, long mib, double *mib_s)
{
    struct pair p;
    if (open_pair(&p, encrypted) != 0)
        return -1;
    fiber_buf frame = {0};
    uint8_t *blob = calloc(1, FRAME_PAYLOAD - 20);
    fiber_iov item = {blob, FRAME_PAYLOAD - 20};
    int rc = blob ? fb_wire_put_ocall(&frame, 1, 17, 1, -1, &item, 1) : -1;
    size_t total = (size_t)mib << 20, got = 0;
    double t0 = bench_now_s();
    while (rc == 0 && got < total) {
        /* Four frames queued at a time, as a busy sender would. */
        for (int k = 0; k < 4 && rc == 0; k++)
            rc = fiber_buf_append(fb_conn_out(&p.a), frame.data, frame.len);
        if (rc == 0)
            rc = move(&p.a, &p.b, 4 * frame.len, &got);
    }
    double dt = bench_now_s() - t0;
    *mib_s = (double)got / (1 << 20) / dt;
    free(blob);
    fiber_buf_free(&frame);
    close_pair(&p);
    return rc ? -1 : 0;
}

static int measure_bulk(int encrypted, long mib, long runs, double *median)
{
    double v[64];
    for (long i = 0; i < runs; i++)
        if (bulk_run(encrypted, mib, &v[i]) != 0)
            return -1;
    *median = bench_median(v, (size_t)runs);
    return 0;
}

struct figures {
    struct bench_latency plain, secure;
    double bulk_plain, bulk_secure;
};

static const struct bench_figure figure_keys[] = {
    {"rtt_plain_us", offsetof(struct figures, plain.median_us), 2, 0},
    {"rtt_secure_us", offsetof(struct figures, secure.median_us), 2, 0},
    {"p99_plain_us", offsetof(struct figures, plain.p99_us), 2, 0},
    {"p99_secure_us", offsetof(struct figures, secure.p99_us), 2, 0},
    {"bulk_plain_mib_s", offsetof(struct figures, bulk_plain), 1, 0},
    {"bulk_secure_mib_s", offsetof(struct figures, bulk_secure), 1, 0},
};
#define N_FIGURES (sizeof figure_keys / sizeof figure_keys[0])

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--calls N] [--mib N] [--runs R] [--help]\n"
            "What encryption costs one connection, both ends in one thread "
            "over a\nsocketpair: round trip of a small frame each way, and "
            "bulk MiB/s of 64 KiB\nframes, plaintext against encrypted.\n"
            "  --calls N  timed round trips of each kind (default 20000)\n"
            "  --mib N    MiB per bulk run (default 256)\n"
            "  --runs R   bulk runs of each kind, median reported (default "
            "5)\n"
            "The last line of output is one JSON object.\n");
}

int main(int argc, char **argv)
{
    if (bench_init(PROG, &argc, &argv) != 0)
        return 1;
    long calls = 20000, mib = 256, runs = 5;
    const struct bench_flag flags[] = {
        {"--calls", NULL, &calls, 1, 10000000, NULL, NULL},
        {"--mib", NULL, &mib, 1, 65536, NULL, NULL},
        {"--runs", NULL, &runs, 1, 64, NULL, NULL},
        {NULL, NULL, NULL, 0, 0, NULL, NULL}};
    int rc = bench_parse_args(PROG, argc, argv, flags);
    if (rc != 0)
        return bench_usage_exit(rc, usage);
    printf(PROG ": fiber %s, one thread, socketpair; %ld round trips, "
           "%ld x %ld MiB bulk\n", fiber_version(), calls, runs, mib);
    struct figures f;
    if (measure_rtt(0, calls, &f.plain) != 0 ||
        measure_rtt(1, calls, &f.secure) != 0 ||
        measure_bulk(0, mib, runs, &f.bulk_plain) != 0 ||
        measure_bulk(1, mib, runs, &f.bulk_secure) != 0) {
        fprintf(stderr, PROG ": FAILED\n");
        return 1;
    }
    printf("\n%-10s %14s %14s %14s\n", "", "rtt median us", "rtt p99 us",
           "bulk MiB/s");
    printf("%-10s %14.2f %14.2f %14.1f\n", "plaintext", f.plain.median_us,
           f.plain.p99_us, f.bulk_plain);
    printf("%-10s %14.2f %14.2f %14.1f\n", "encrypted", f.secure.median_us,
           f.secure.p99_us, f.bulk_secure);
    printf("(encryption adds %.2f us per round trip, %.2f us per record "
           "sealed or opened)\n\n", f.secure.median_us - f.plain.median_us,
           (f.secure.median_us - f.plain.median_us) / 4);
    bench_json_open(NULL);
    bench_json_write(figure_keys, N_FIGURES, &f);
    bench_json_null("peer");
    bench_json_close();
    return 0;
}
