#!/usr/bin/env python3
"""latency_peer.py -- the peer of bench-latency: multiprocessing.Pool.apply.

Times --calls calls of pool.apply(noop) one by one (time.perf_counter around
each) after --warmup untimed calls, on Pool(1) and on Pool(2), and reports
the median and 99th percentile (nearest rank) in microseconds.

Progress goes to stderr; stdout holds exactly one line, a JSON object:
{"median_us": .., "p99_us": .., "median_us_2w": .., "p99_us_2w": ..},
which bench-latency reads as the last line.
"""
import argparse
import json
import math
import multiprocessing
import statistics
import sys
import time


def noop():
    """The task: does nothing, returns None."""


def measure(workers, calls, warmup):
    with multiprocessing.Pool(workers) as pool:
        for _ in range(warmup):
            pool.apply(noop)
        us = []
        clock = time.perf_counter
        for _ in range(calls):
            t0 = clock()
            pool.apply(noop)
            us.append((clock() - t0) * 1e6)
    us.sort()
    p99 = us[max(1, math.ceil(0.99 * len(us))) - 1]
    med = statistics.median(us)
    print(f"mp     {workers} worker{'s' if workers > 1 else ' '}  median "
          f"{med:8.1f} us  p99 {p99:8.1f} us  (min {us[0]:.1f}, max "
          f"{us[-1]:.1f}, {calls} calls)", file=sys.stderr, flush=True)
    return med, p99


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=2000)
    args = ap.parse_args()
    m1, p1 = measure(1, args.calls, args.warmup)
    m2, p2 = measure(2, args.calls, args.warmup)
    print(json.dumps({"median_us": round(m1, 2), "p99_us": round(p1, 2),
                      "median_us_2w": round(m2, 2), "p99_us_2w": round(p2, 2)}),
          flush=True)


if __name__ == "__main__":
    main()
