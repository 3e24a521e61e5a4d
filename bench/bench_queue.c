/*
 * bench_queue.c -- fiber_queue throughput and latency between processes,
 * against Python's multiprocessing.Queue.
 *
 * Throughput: the master creates a queue (capacity 1024 by default) on
 * its object server and starts P producer and C consumer processes
 * (fiber_process_start, each given the serialised handles in its
 * argument).  Every process opens the queues, says it is ready, and the
 * producers wait for a "go" so that process start-up is not timed.  The
 * producers then put --messages 64-byte messages between them (each
 * followed by one end marker per producer); each consumer takes messages
 * until it sees one end marker.  The rate is messages / (last get of any
 * consumer - first put of any producer), both read from CLOCK_MONOTONIC,
 * which all processes of the machine share.  Shapes 1x1 and 4x4; each is
 * repeated --runs times and the median is reported.
 *
 * Latency: one producer and one consumer, one message in flight at a
 * time: the producer stamps a message with CLOCK_MONOTONIC and puts it,
 * the consumer gets it, records now - stamp, and answers on a second
 * queue; only then does the producer send the next.  The median (and p99)
 * of put-to-get latency are reported.
 *
 * The peer (peer/queue_peer.py) measures the same shapes with
 * multiprocessing.Queue in the same run.  Output: progress and a table on
 * stdout, then as the LAST line one JSON object; diagnostics on stderr.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fiber/fiber.h>

#include "bench_common.h"

#define PROG "bench-queue"
#define MSG_BYTES 64
#define MAX_SIDE 4                /* producers or consumers per shape */
#define HANDLE_MAX 320            /* a serialised handle: tens of bytes */
#define READY_TIMEOUT_MS 120000   /* children start and connect */
#define POLL_MS 5000              /* how often a waiting master checks */
#define RUN_TIMEOUT_MS 3600000    /* one run may take at most an hour */
#define LAT_WARMUP 100            /* latency samples thrown away first */

enum { K_DATA = 1, K_END = 2, K_READY = 3, K_RESULT = 4, K_GO = 5 };
enum { R_PRODUCER = 1, R_CONSUMER = 2 };

/* Every data message is exactly MSG_BYTES long. */
struct msg {
    uint64_t seq;
    uint64_t stamp_ns; /* CLOCK_MONOTONIC when the producer put it */
    uint32_t kind;
    uint8_t pad[MSG_BYTES - 20];
};
_Static_assert(sizeof(struct msg) == MSG_BYTES, "a message is 64 bytes");

/* What a child sends back on the control queue when it is done. */
struct result {
    uint32_t kind; /* K_RESULT (K_READY for "ready") */
    uint32_t role;
    uint64_t count;    /* messages put or got (end markers excluded) */
    uint64_t first_ns; /* producer: before its first put */
    uint64_t last_ns;  /* consumer: after its last data get */
    int32_t error;     /* 0, or the FIBER_E* code that stopped it */
    double lat_median_us, lat_p99_us; /* latency consumer only */
};

struct handle {
    uint32_t len;
    unsigned char data[HANDLE_MAX];
};

/* A child's argument. */
struct job {
    uint32_t role;
    uint64_t count; /* producer: messages to put; latency: samples */
    struct handle data, ctl, go, ack;
};

struct options {
    long messages, runs, samples, capacity;
    int no_peer;
};

struct figures {
    struct bench_stats rate_1x1, rate_4x4; /* messages per second */
    double lat_median_us, lat_p99_us;
};

/* In the JSON line and the peer's, in this order. */
static const struct bench_figure figure_keys[] = {
    {"msgs_per_s_1x1", offsetof(struct figures, rate_1x1.median), 1, 0},
    {"msgs_per_s_4x4", offsetof(struct figures, rate_4x4.median), 1, 0},
    {"latency_median_us", offsetof(struct figures, lat_median_us), 2, 0},
    {"latency_p99_us", offsetof(struct figures, lat_p99_us), 2, 0},
};
#define N_FIGURES (sizeof figure_keys / sizeof figure_keys[0])

/* ---- children ------------------------------------------------------------ */

static int open_all(const struct job *j, fiber_queue **data, fiber_queue **ctl,
                    fiber_queue **go, fiber_queue **ack)
{
    *data = *ctl = *go = *ack = NULL;
    if (fiber_queue_open(data, j->data.data, j->data.len) != 0 ||
        fiber_queue_open(ctl, j->ctl.data, j->ctl.len) != 0)
        return -1;
    if (j->go.len && fiber_queue_open(go, j->go.data, j->go.len) != 0)
        return -1;
    if (j->ack.len && fiber_queue_open(ack, j->ack.data, j->ack.len) != 0)
        return -1;
    return 0;
}

static void free_all(fiber_queue *a, fiber_queue *b, fiber_queue *c,
                     fiber_queue *d)
{
    fiber_queue_free(a);
    fiber_queue_free(b);
    fiber_queue_free(c);
    fiber_queue_free(d);
}

static int say(fiber_queue *ctl, const struct result *r)
{
    return fiber_queue_put(ctl, r, sizeof *r, -1);
}

/* What every child holds: its job, its queues and its report. */
struct child {
    struct job j;
    fiber_queue *data, *ctl, *go, *ack;
    struct result r;
};

/* Reads the job in arg and opens its queues.  Returns 0, or the task's
 * failure. */
static int child_begin(struct child *c, const void *arg, size_t len,
                       const char *name, uint32_t role)
{
    if (len != sizeof c->j)
        return fiber_task_fail("%s: bad argument", name);
    memcpy(&c->j, arg, sizeof c->j);
    if (open_all(&c->j, &c->data, &c->ctl, &c->go, &c->ack) != 0)
        return fiber_task_fail("%s: open: %s", name, fiber_last_error());
    memset(&c->r, 0, sizeof c->r);
    c->r.kind = K_READY;
    c->r.role = role;
    return 0;
}

/* Reports rc on the control queue, closes the queues and returns the
 * task's result. */
static int child_end(struct child *c, int rc, const char *name)
{
    c->r.kind = K_RESULT;
    c->r.error = rc;
    say(c->ctl, &c->r);
    free_all(c->data, c->ctl, c->go, c->ack);
    return rc ? fiber_task_fail("%s: %s", name, fiber_last_error()) : 0;
}

/* After the go, puts j.count messages, then one end marker.  For latency,
 * LAT_WARMUP more messages go first, each stamped and sent only after the
 * previous one's acknowledgement. */
static int producer(const void *arg, size_t len, const char *name,
                    int latency)
{
    struct child c;
    int rc = child_begin(&c, arg, len, name, R_PRODUCER);
    if (rc)
        return rc;
    rc = say(c.ctl, &c.r);
    if (rc == 0)
        rc = fiber_queue_get(c.go, NULL, -1);
    struct msg m;
    memset(&m, 0, sizeof m);
    m.kind = K_DATA;
    uint64_t n = c.j.count + (latency ? LAT_WARMUP : 0);
    c.r.first_ns = bench_now_ns();
    for (uint64_t i = 0; rc == 0 && i < n; i++) {
        m.seq = i;
        if (latency)
            m.stamp_ns = bench_now_ns();
        rc = fiber_queue_put(c.data, &m, sizeof m, -1);
        if (rc == 0 && latency)
            rc = fiber_queue_get(c.ack, NULL, -1);
        if (rc == 0)
            c.r.count++;
    }
    m.kind = K_END;
    if (rc == 0)
        rc = fiber_queue_put(c.data, &m, sizeof m, -1);
    c.r.last_ns = bench_now_ns();
    return child_end(&c, rc, name);
}

/* Gets until the first end marker.  For latency, records now - stamp of
 * every message after the first LAT_WARMUP and acknowledges each. */
static int consumer(const void *arg, size_t len, const char *name,
                    int latency)
{
    struct child c;
    int rc = child_begin(&c, arg, len, name, R_CONSUMER);
    if (rc)
        return rc;
    double *lat = NULL;
    if (latency && !(lat = calloc(c.j.count ? c.j.count : 1, sizeof *lat)))
        return fiber_task_fail("%s: out of memory", name);
    rc = say(c.ctl, &c.r);
    fiber_buf b = {0};
    size_t n = 0;
    for (uint64_t i = 0; rc == 0; i++) {
        b.len = 0;
        rc = fiber_queue_get(c.data, &b, -1);
        uint64_t now = bench_now_ns();
        if (rc)
            break;
        struct msg m;
        if (b.len != sizeof m) {
            rc = fiber_task_fail("%s: a message of %zu bytes", name, b.len);
            break;
        }
        memcpy(&m, b.data, sizeof m);
        if (m.kind == K_END)
            break;
        c.r.count++;
        c.r.last_ns = now;
        if (!latency)
            continue;
        if (i >= LAT_WARMUP && n < c.j.count)
            lat[n++] = (double)(now - m.stamp_ns) / 1e3;
        rc = fiber_queue_put(c.ack, "a", 1, -1);
    }
    fiber_buf_free(&b);
    if (rc == 0 && n > 0) {
        c.r.lat_median_us = bench_median(lat, n); /* sorts lat */
        c.r.lat_p99_us = bench_percentile(lat, n, 99);
    }
    free(lat);
    return child_end(&c, rc, name);
}

FIBER_TASK(bq_producer)
{
    return producer(arg, len, "bq_producer", 0);
}

FIBER_TASK(bq_consumer)
{
    return consumer(arg, len, "bq_consumer", 0);
}

FIBER_TASK(bq_lat_producer)
{
    return producer(arg, len, "bq_lat_producer", 1);
}

FIBER_TASK(bq_lat_consumer)
{
    return consumer(arg, len, "bq_lat_consumer", 1);
}

/* ---- the master ---------------------------------------------------------- */

struct queues {
    fiber_queue *data, *ctl, *go, *ack;
};

static int set_handle(struct handle *h, fiber_queue *q)
{
    fiber_buf b = {0};
    int rc = fiber_queue_serialize(q, &b);
    if (rc == 0 && b.len > sizeof h->data) {
        fprintf(stderr, PROG ": a serialised handle of %zu bytes\n", b.len);
        rc = -1;
    }
    if (rc == 0) {
        memcpy(h->data, b.data, b.len);
        h->len = (uint32_t)b.len;
    }
    fiber_buf_free(&b);
    return rc;
}

static int create_queues(struct queues *q, long capacity)
{
    memset(q, 0, sizeof *q);
    if (fiber_queue_create(&q->data, (size_t)capacity) != 0 ||
        fiber_queue_create(&q->ctl, 0) != 0 ||
        fiber_queue_create(&q->go, 0) != 0 ||
        fiber_queue_create(&q->ack, 0) != 0) {
        fprintf(stderr, PROG ": fiber_queue_create: %s\n", fiber_last_error());
        return -1;
    }
    return 0;
}

static void free_queues(struct queues *q)
{
    free_all(q->data, q->ctl, q->go, q->ack);
}

/* Is every process still running (or ended with 0)?  Says which is not. */
static int all_well(fiber_process **procs, int n)
{
    for (int i = 0; i < n; i++) {
        if (fiber_process_is_alive(procs[i]) == 0) {
            int code = -1;
            fiber_process_exitcode(procs[i], &code);
            if (code != 0) {
                fprintf(stderr, PROG ": %s (pid %ld) ended with %d\n",
                        fiber_process_name(procs[i]),
                        fiber_process_pid(procs[i]), code);
                return -1;
            }
        }
    }
    return 0;
}

/* Takes the next control message of kind `kind`, waiting while the
 * children are well, up to limit_ms in all. */
static int ctl_next(fiber_queue *ctl, fiber_process **procs, int n,
                    uint32_t kind, long limit_ms, struct result *r)
{
    fiber_buf b = {0};
    int rc = -1;
    long waited = 0;
    for (; waited < limit_ms; waited += POLL_MS) {
        b.len = 0;
        int e = fiber_queue_get(ctl, &b, POLL_MS);
        if (e == FIBER_ETIMEDOUT) {
            if (all_well(procs, n) != 0)
                break;
            continue;
        }
        if (e != 0) {
            fprintf(stderr, PROG ": control queue: %s\n", fiber_last_error());
            break;
        }
        if (b.len != sizeof *r) {
            fprintf(stderr, PROG ": control message of %zu bytes\n", b.len);
            break;
        }
        memcpy(r, b.data, sizeof *r);
        if (r->kind != kind) {
            fprintf(stderr, PROG ": control message of kind %u, want %u\n",
                    r->kind, kind);
            break;
        }
        rc = 0;
        break;
    }
    if (rc && waited >= limit_ms)
        fprintf(stderr, PROG ": no word from the children in %ld s\n",
                limit_ms / 1000);
    fiber_buf_free(&b);
    return rc;
}

static int finish(fiber_process **procs, int n, int ok)
{
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (!ok)
            fiber_process_terminate(procs[i]);
        if (fiber_process_join(procs[i], 30000) != 0) {
            fprintf(stderr, PROG ": %s did not end\n",
                    fiber_process_name(procs[i]));
            fiber_process_terminate(procs[i]);
            fiber_process_join(procs[i], 10000);
            bad++;
            continue;
        }
        int code = -1;
        fiber_process_exitcode(procs[i], &code);
        if (ok && code != 0) {
            fprintf(stderr, PROG ": %s exited with %d\n",
                    fiber_process_name(procs[i]), code);
            bad++;
        }
    }
    for (int i = 0; i < n; i++)
        fiber_process_free(procs[i]);
    return bad ? -1 : 0;
}

/* One run of a shape: np producers sharing `messages`, nc consumers (or,
 * with latency, one of each exchanging `messages` samples).  Returns 0
 * with the rate in *rate (throughput) or the latencies in *lat_med and
 * *lat_p99. */
static int run_once(struct queues *q, int np, int nc, long messages,
                    int latency, double *rate, double *lat_med,
                    double *lat_p99)
{
    fiber_process *procs[2 * MAX_SIDE];
    int n = 0, rc = 0;
    struct job j;
    memset(&j, 0, sizeof j);
    if (set_handle(&j.data, q->data) != 0 || set_handle(&j.ctl, q->ctl) != 0)
        return -1;
    /* The consumers first, then the producers (k: the producer's index). */
    static const char *const tasks[2][2] = {
        {"bq_consumer", "bq_producer"},
        {"bq_lat_consumer", "bq_lat_producer"}};
    for (int i = 0; i < nc + np && rc == 0; i++) {
        int k = i - nc, is_producer = k >= 0;
        j.role = is_producer ? R_PRODUCER : R_CONSUMER;
        j.count = is_producer ? (uint64_t)(messages / np + (k < messages % np))
                              : (uint64_t)messages;
        j.go.len = 0;
        if (is_producer)
            rc = set_handle(&j.go, q->go);
        if (rc == 0 && latency)
            rc = set_handle(&j.ack, q->ack);
        if (rc == 0 &&
            fiber_process_start(&procs[n], tasks[latency][is_producer], &j,
                                sizeof j, NULL) != 0) {
            fprintf(stderr, PROG ": starting a %s: %s\n",
                    is_producer ? "producer" : "consumer",
                    fiber_last_error());
            rc = -1;
        }
        if (rc == 0)
            n++;
    }
    struct result r;
    for (int i = 0; i < n && rc == 0; i++)
        rc = ctl_next(q->ctl, procs, n, K_READY, READY_TIMEOUT_MS, &r);
    /* Everybody has connected: let the producers go. */
    for (int i = 0; i < np && rc == 0; i++) {
        uint32_t go = K_GO;
        if (fiber_queue_put(q->go, &go, sizeof go, -1) != 0) {
            fprintf(stderr, PROG ": go: %s\n", fiber_last_error());
            rc = -1;
        }
    }
    uint64_t first = UINT64_MAX, last = 0, got = 0, put = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        rc = ctl_next(q->ctl, procs, n, K_RESULT, RUN_TIMEOUT_MS, &r);
        if (rc == 0 && r.error) {
            fprintf(stderr, PROG ": a %s failed with %s\n",
                    r.role == R_PRODUCER ? "producer" : "consumer",
                    fiber_errname(r.error));
            rc = -1;
        }
        if (rc)
            continue;
        if (r.role == R_PRODUCER) {
            put += r.count;
            if (r.first_ns < first)
                first = r.first_ns;
        } else {
            got += r.count;
            if (r.last_ns > last)
                last = r.last_ns;
            if (latency) {
                *lat_med = r.lat_median_us;
                *lat_p99 = r.lat_p99_us;
            }
        }
    }
    if (rc == 0 && !latency && (got != put || put != (uint64_t)messages)) {
        fprintf(stderr, PROG ": %llu put, %llu got, want %ld\n",
                (unsigned long long)put, (unsigned long long)got, messages);
        rc = -1;
    }
    if (rc == 0 && !latency) {
        if (last <= first) {
            fprintf(stderr, PROG ": no time passed\n");
            rc = -1;
        } else {
            *rate = (double)messages / ((double)(last - first) / 1e9);
        }
    }
    if (finish(procs, n, rc == 0) != 0)
        rc = -1;
    return rc;
}

static int run_fiber(const struct options *o, struct figures *f)
{
    struct queues q;
    if (create_queues(&q, o->capacity) != 0)
        return -1;
    int rc = 0;
    static const int shapes[2] = {1, 4};
    struct bench_stats *stats[2] = {&f->rate_1x1, &f->rate_4x4};
    for (int s = 0; s < 2 && rc == 0; s++) {
        double v[64];
        for (long r = 0; r < o->runs && rc == 0; r++) {
            rc = run_once(&q, shapes[s], shapes[s], o->messages, 0, &v[r],
                          NULL, NULL);
            if (rc == 0) {
                printf("fiber  %dx%d run %ld: %10.0f msgs/s\n", shapes[s],
                       shapes[s], r + 1, v[r]);
                fflush(stdout);
            }
        }
        if (rc == 0)
            *stats[s] = bench_summarize(v, (size_t)o->runs);
    }
    if (rc == 0)
        rc = run_once(&q, 1, 1, o->samples, 1, NULL, &f->lat_median_us,
                      &f->lat_p99_us);
    if (rc == 0) {
        printf("fiber  latency: median %.1f us, p99 %.1f us (%ld samples)\n",
               f->lat_median_us, f->lat_p99_us, o->samples);
        fflush(stdout);
    }
    free_queues(&q);
    return rc;
}

/* ---- the peer ---------------------------------------------------------- */

static int run_peer(const struct options *o, struct figures *p)
{
    char args[256];
    snprintf(args, sizeof args,
             "--messages %ld --runs %ld --samples %ld --capacity %ld",
             o->messages, o->runs, o->samples, o->capacity);
    return bench_peer_figures(PROG, "queue_peer.py", args, figure_keys,
                              N_FIGURES, p);
}

/* ---- output ------------------------------------------------------------ */

/* A row of messages per second; fiber/mp = f / p. */
static void rate_row(const char *what, const struct bench_stats *f,
                     const struct bench_stats *p)
{
    printf("%-26s %14.0f %10.0f..%-11.0f", what, f->median, f->min, f->max);
    if (p)
        printf(" %14.0f %9.2fx\n", p->median, f->median / p->median);
    else
        printf(" %14s %10s\n", "-", "-");
}

/* A row of microseconds; fiber/mp = p / f. */
static void latency_row(const char *what, double f, const double *p)
{
    printf("%-26s %14.1f %22s", what, f, "");
    if (p)
        printf(" %14.1f %9.2fx\n", *p, *p / f);
    else
        printf(" %14s %10s\n", "-", "-");
}

static void print_table(const struct options *o, const struct figures *f,
                        const struct figures *p)
{
    printf("\n%-26s %14s %22s %14s %10s\n", "", "fiber", "fiber min..max",
           "mp.Queue", "fiber/mp");
    rate_row("msgs/s 1 prod x 1 cons", &f->rate_1x1, p ? &p->rate_1x1 : NULL);
    rate_row("msgs/s 4 prod x 4 cons", &f->rate_4x4, p ? &p->rate_4x4 : NULL);
    latency_row("latency median (us)", f->lat_median_us,
                p ? &p->lat_median_us : NULL);
    latency_row("latency p99 (us)", f->lat_p99_us, p ? &p->lat_p99_us : NULL);
    printf("(%ld messages of %d bytes per run, capacity %ld, median of %ld "
           "runs;\n latency: one message in flight, %ld samples; fiber/mp > "
           "1 means fiber is better)\n\n",
           o->messages, MSG_BYTES, o->capacity, o->runs, o->samples);
}

static void print_json(const struct options *o, const struct figures *f,
                       const struct figures *p)
{
    bench_json_open(NULL);
    bench_json_long("messages", o->messages);
    bench_json_long("msg_bytes", MSG_BYTES);
    bench_json_long("capacity", o->capacity);
    bench_json_long("runs", o->runs);
    bench_json_write(figure_keys, N_FIGURES, f);
    bench_json_peer(figure_keys, N_FIGURES, p);
    bench_json_close();
}

/* ---- main -------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--messages N] [--runs R] [--samples S] "
            "[--capacity C]\n"
            "                   [--no-peer] [--help]\n"
            "fiber_queue between processes against multiprocessing.Queue:\n"
            "messages per second with 1 producer x 1 consumer and 4 x 4 "
            "processes\n(64-byte messages), and put-to-get latency with one "
            "message in flight.\n"
            "  --messages N  messages per throughput run (default 1000000)\n"
            "  --runs R      runs per shape; the median is kept (default 3)\n"
            "  --samples S   latency samples (default 2000)\n"
            "  --capacity C  the data queue's capacity (default 1024)\n"
            "  --no-peer     skip Python multiprocessing "
            "(peer/queue_peer.py)\n"
            "The last line of output is one JSON object.\n");
}

int main(int argc, char **argv)
{
    if (bench_init(PROG, &argc, &argv) != 0)
        return 1;
    struct options o = {1000000, 3, 2000, 1024, 0};
    const struct bench_flag flags[] = {
        {"--no-peer", .on = &o.no_peer},
        {"--messages", .value = &o.messages, .lo = 8, .hi = 1000000000L},
        {"--runs", .value = &o.runs, .lo = 1, .hi = 64},
        {"--samples", .value = &o.samples, .lo = 1, .hi = 10000000L},
        {"--capacity", .value = &o.capacity, .lo = 1, .hi = 1000000L},
        {NULL},
    };
    int rc = bench_parse_args(PROG, argc, argv, flags);
    if (rc != 0)
        return bench_usage_exit(rc, usage);
    printf(PROG ": fiber %s, local backend, %ld messages of %d bytes, "
           "capacity %ld, %ld runs\n",
           fiber_version(), o.messages, MSG_BYTES, o.capacity, o.runs);
    fflush(stdout);
    struct figures f, p, *pp = NULL;
    if (run_fiber(&o, &f) != 0) {
        fprintf(stderr, PROG ": FAILED\n");
        return 1;
    }
    if (!o.no_peer && bench_peer_done(PROG, run_peer(&o, &p)))
        pp = &p;
    print_table(&o, &f, pp);
    print_json(&o, &f, pp);
    return 0;
}
