#!/usr/bin/env python3
"""latency_peer.py -- the peer of bench-latency: multiprocessing.Pool.apply.

Times --calls calls of pool.apply(noop) one by one (time.perf_counter around
each) after --warmup untimed calls, on Pool(1) and on Pool(2), and reports
the median and 99th percentile (nearest rank) in microseconds.

Progress goes to stderr; stdout holds exactly one line, a JSON object:
{"median_us": .., "p99_us": .., "median_us_2w": .., "p99_us_2w": ..},
which bench-latency reads as the last line.
"""
import multiprocessing
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (found through the line above)


def noop():
    """The task: does nothing, returns None."""


def measure(workers, calls, warmup):
    with multiprocessing.Pool(workers) as pool:
        med, p99, us = peer_common.time_calls(pool.apply, noop, calls, warmup)
    peer_common.say(f"mp     {workers} worker{'s' if workers > 1 else ' '}  "
                    f"median {med:8.1f} us  p99 {p99:8.1f} us  (min "
                    f"{us[0]:.1f}, max {us[-1]:.1f}, {calls} calls)")
    return med, p99


def main():
    args = peer_common.calls_parser(__doc__).parse_args()
    m1, p1 = measure(1, args.calls, args.warmup)
    m2, p2 = measure(2, args.calls, args.warmup)
    peer_common.emit({"median_us": round(m1, 2), "p99_us": round(p1, 2),
                      "median_us_2w": round(m2, 2),
                      "p99_us_2w": round(p2, 2)})


if __name__ == "__main__":
    main()
