/*
 * bench_common.h -- what every benchmark shares: start-up, the command
 * line, clocks, medians and percentiles, timing loops, running a Python
 * peer whose last line of stdout is one JSON object of numbers, reading
 * figures from that line, writing the benchmark's own JSON line, and
 * /proc readers.
 *
 * Every benchmark prints progress and a table on stdout, then as its LAST
 * line one JSON object; diagnostics go to stderr.  The peer runs in the
 * same invocation (unless --no-peer) so that both sides see the same
 * machine load; when it fails, the benchmark says why on stderr and
 * reports "peer": null.
 */
#ifndef FIBER_BENCH_COMMON_H
#define FIBER_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifndef FIBER_BENCH_PEER_DIR
#error "FIBER_BENCH_PEER_DIR must name the directory holding the peers"
#endif

/* ---- start-up and the command line ------------------------------------- */

/* fiber_init for main(): returns 0, or -1 after saying why on stderr (main
 * then returns 1).  Children started by fiber never return from it. */
int bench_init(const char *prog, int *argc, char ***argv);

/* One option for bench_parse_args; a table of them ends with {NULL}.  Set
 * exactly one of on, value or parse. */
struct bench_flag {
    const char *name; /* "--calls" */
    int *on;          /* a switch: set to 1 when given */
    long *value;      /* or takes a number in lo..hi */
    long lo, hi;
    /* or takes a word the benchmark parses: returns 0, or -1 (after
     * saying why, if it wants to) */
    int (*parse)(const char *prog, const char *text, void *ctx);
    void *ctx;
};

/* Parses argv[1..] against flags.  Returns 0; 1 for --help or -h; or -1
 * after saying on stderr what is wrong (an unknown argument, a missing or
 * out-of-range value). */
int bench_parse_args(const char *prog, int argc, char **argv,
                     const struct bench_flag *flags);

/* For main() after parsing gave rc != 0: prints usage (on stdout for
 * --help, rc > 0; on stderr for a bad command line) and returns main's
 * exit status, 0 or 2. */
int bench_usage_exit(int rc, void (*usage)(FILE *));

/* Parses text as an integer in lo..hi.  Returns 0, or -1 after telling
 * stderr which option (`what`) wanted what. */
int bench_parse_long(const char *prog, const char *what, const char *text,
                     long lo, long hi, long *out);

/* ---- clocks and statistics --------------------------------------------- */

/* CLOCK_MONOTONIC, which every process of the machine shares. */
uint64_t bench_now_ns(void);
double bench_now_s(void);

/* Sorts v (n > 0) in place and returns its median (the mean of the two
 * middle values when n is even). */
double bench_median(double *v, size_t n);

/* The p-th percentile (0..100) of v, which must already be sorted: the
 * nearest-rank value, so p99 of 20,000 samples is the 19,800th. */
double bench_percentile(const double *v, size_t n, double p);

struct bench_stats {
    double median, min, max;
};

/* Sorts v (n > 0) in place and returns its median, minimum and maximum. */
struct bench_stats bench_summarize(double *v, size_t n);

struct bench_latency {
    double median_us, p99_us, min_us, max_us;
};

/* Calls call(ctx) `warmup` times untimed, then `calls` times, each call
 * timed on its own, and summarizes the microseconds in *out.  Returns 0,
 * or -1 after saying on stderr "<prog>: <what>: <why>" (the failed call's
 * fiber_last_error(), or that there was no memory for the samples). */
int bench_time_calls(const char *prog, const char *what,
                     int (*call)(void *ctx), void *ctx, long warmup,
                     long calls, struct bench_latency *out);

/* ---- the peer ---------------------------------------------------------- */

/* Runs `python3 <FIBER_BENCH_PEER_DIR>/<script> <args>` (args: words the
 * caller made; only digits, letters, '-', ',' and '.' are passed) and
 * copies the last non-empty line of its stdout into last.  The peer's
 * stderr (its progress) passes through.  Returns 0, or -1 after saying on
 * stderr why there is no result (python3 missing, nonzero exit, ...). */
int bench_run_peer(const char *prog, const char *script, const char *args,
                   char *last, size_t size);

/* For main(): rc is what running the peer returned.  Returns 1 when the
 * peer's figures are in (rc == 0); otherwise says on stderr that "peer"
 * will be null and returns 0. */
int bench_peer_done(const char *prog, int rc);

/* Formats a JSON key (printf-style) into a static buffer, valid until the
 * next call: bench_key("ms_per_proc_%d", n). */
const char *bench_key(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* Parses the number after "key": in a flat JSON object.  Returns 0, or -1
 * when the key is missing or its value is not a finite number (null). */
int bench_json_number(const char *json, const char *key, double *out);

/* Copies the object that follows "key": in json into buf.  The peers'
 * nested objects hold numbers only, so the first '}' closes it.  Returns
 * 0, or -1 when there is none or it does not fit. */
int bench_json_object(const char *json, const char *key, char *buf,
                      size_t size);

/* A figure a benchmark reports in its JSON line and reads from its peer's:
 * a double at `offset` in the benchmark's own struct. */
struct bench_figure {
    const char *key;
    size_t offset;
    int decimals; /* written with %.<decimals>f */
    int optional; /* reading: a missing figure is left as it was */
};

/* Reads n figures from the peer's line json into the struct at base.
 * Returns 0, or -1 after saying on stderr which figure is missing. */
int bench_json_read(const char *prog, const char *json,
                    const struct bench_figure *figs, size_t n, void *base);

/* bench_run_peer, then bench_json_read of the peer's line into base. */
int bench_peer_figures(const char *prog, const char *script, const char *args,
                       const struct bench_figure *figs, size_t n, void *base);

/* ---- the JSON line ----------------------------------------------------- */

/* The benchmark's last line, written member by member in order; the
 * commas are added as needed.  bench_json_open(NULL) opens the line's
 * object, bench_json_open(key) a nested one as the member key;
 * bench_json_close closes the innermost, and closing the line's object
 * ends the line. */
void bench_json_open(const char *key);
void bench_json_close(void);
void bench_json_num(const char *key, int decimals, double v);
void bench_json_long(const char *key, long v);
void bench_json_null(const char *key);
void bench_json_string(const char *key, const char *s); /* s: no escapes */

/* Writes n figures of the struct at base, with bench_json_num. */
void bench_json_write(const struct bench_figure *figs, size_t n,
                      const void *base);

/* Starts the member "peer": opens it as an object and returns 1 when peer
 * is not NULL (the caller writes its members and closes it); otherwise
 * writes null and returns 0. */
int bench_json_open_peer(const void *peer);

/* Writes "peer": the n figures of the struct at peer as an object, or null
 * when peer is NULL. */
void bench_json_peer(const struct bench_figure *figs, size_t n,
                     const void *peer);

/* ---- the call-latency benchmarks ------------------------------------- */

/* bench-latency and bench-manager time single calls (bench_time_calls);
 * they and their peers take --calls N (default 20,000), --warmup N
 * (default 2,000) and --no-peer. */
#define BENCH_DEFAULT_CALLS 20000
#define BENCH_DEFAULT_WARMUP 2000

struct bench_calls_options {
    long calls, warmup;
    int no_peer;
};

/* Parses that command line into *o; --warmup must be at least min_warmup.
 * Returns as bench_parse_args does. */
int bench_parse_calls_args(const char *prog, int argc, char **argv,
                           long min_warmup, struct bench_calls_options *o);

/* Runs the peer script with the same --calls and --warmup and reads its
 * figures, as bench_peer_figures does; returns 1 when they are in,
 * otherwise 0 after saying on stderr why "peer" will be null (see
 * bench_peer_done).  Skips the peer (returns 0) for --no-peer. */
int bench_peer_calls(const char *prog, const char *script,
                     const struct bench_calls_options *o,
                     const struct bench_figure *figs, size_t n, void *base);

/* The JSON line: the figures of own, "calls", and the peer's figures (null
 * when peer is NULL). */
void bench_json_calls_line(const struct bench_figure *figs, size_t n,
                           const void *own, long calls, const void *peer);

/* ---- /proc and the like ------------------------------------------------ */

/* Sums VmRSS (kind "VmRSS:") or, from smaps_rollup, Pss ("Pss:") of the
 * given processes, in KiB.  Returns the number of processes read; those
 * that vanished are skipped. */
int bench_sum_memory_kib(const long *pids, size_t n, const char *kind,
                         double *kib);

/* The first number in a file such as /proc/sys/kernel/pid_max, or -1. */
long bench_read_long_file(const char *path);

/* How many descriptors this process has open (/proc/self/fd). */
long bench_count_open_fds(void);

#endif /* FIBER_BENCH_COMMON_H */
