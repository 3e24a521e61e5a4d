/*
 * bench_common.h -- what the pool benchmarks (bench-overhead,
 * bench-latency, bench-throughput, bench-scale) share: clocks, medians and
 * percentiles, command-line numbers, and running a Python peer whose last
 * line of stdout is one flat JSON object of numbers.
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

#ifndef FIBER_BENCH_PEER_DIR
#error "FIBER_BENCH_PEER_DIR must name the directory holding the peers"
#endif

/* CLOCK_MONOTONIC, which every process of the machine shares. */
uint64_t bench_now_ns(void);
double bench_now_s(void);

/* Sorts v (n > 0) in place and returns its median (the mean of the two
 * middle values when n is even). */
double bench_median(double *v, size_t n);

/* The p-th percentile (0..100) of v, which must already be sorted: the
 * nearest-rank value, so p99 of 20,000 samples is the 19,800th. */
double bench_percentile(const double *v, size_t n, double p);

/* Parses text as an integer in lo..hi.  Returns 0, or -1 after telling
 * stderr which option (`what`) wanted what. */
int bench_parse_long(const char *prog, const char *what, const char *text,
                     long lo, long hi, long *out);

/* Runs `python3 <FIBER_BENCH_PEER_DIR>/<script> <args>` (args: words the
 * caller made; only digits, letters, '-', ',' and '.' are passed) and
 * copies the last non-empty line of its stdout into last.  The peer's
 * stderr (its progress) passes through.  Returns 0, or -1 after saying on
 * stderr why there is no result (python3 missing, nonzero exit, ...). */
int bench_run_peer(const char *prog, const char *script, const char *args,
                   char *last, size_t size);

/* Parses the number after "key": in a flat JSON object.  Returns 0, or -1
 * when the key is missing or its value is not a finite number (null). */
int bench_json_number(const char *json, const char *key, double *out);

/* Sums VmRSS (kind "VmRSS:") or, from smaps_rollup, Pss ("Pss:") of the
 * given processes, in KiB.  Returns the number of processes read; those
 * that vanished are skipped. */
int bench_sum_memory_kib(const long *pids, size_t n, const char *kind,
                         double *kib);

#endif /* FIBER_BENCH_COMMON_H */
