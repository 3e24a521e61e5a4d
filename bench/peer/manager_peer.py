#!/usr/bin/env python3
"""manager_peer.py -- the peer of bench-manager: multiprocessing.Manager().

Times --calls pairs one by one (time.perf_counter around each) after
--warmup untimed ones, from the main process, on a Manager's objects:
a dict pair (d[key] = value; d[key], with a 16-byte key and a 64-byte
value) and a lock pair (lock.acquire(); lock.release()), and reports the
median and 99th percentile (nearest rank) in microseconds.

Progress goes to stderr; stdout holds exactly one line, a JSON object:
{"dict_set_get_median_us": .., "dict_set_get_p99_us": ..,
 "lock_pair_median_us": .., "lock_pair_p99_us": ..},
which bench-manager reads as the last line.
"""
import argparse
import json
import math
import multiprocessing
import statistics
import sys
import time

KEY = b"bench-key-00001\0"  # 16 bytes, as in bench_manager.c
VALUE = b"a 64-byte value".ljust(64, b"\0")


def dict_pair(d):
    d[KEY] = VALUE
    return d[KEY]


def lock_pair(lock):
    lock.acquire()
    lock.release()


def measure(name, pair, obj, calls, warmup):
    for _ in range(warmup):
        pair(obj)
    us = []
    clock = time.perf_counter
    for _ in range(calls):
        t0 = clock()
        pair(obj)
        us.append((clock() - t0) * 1e6)
    us.sort()
    p99 = us[max(1, math.ceil(0.99 * len(us))) - 1]
    med = statistics.median(us)
    print(f"mp     {name:<16} median {med:8.1f} us  p99 {p99:8.1f} us  "
          f"({calls} pairs)", file=sys.stderr, flush=True)
    return med, p99


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=2000)
    args = ap.parse_args()
    with multiprocessing.Manager() as mgr:
        d, lock = mgr.dict(), mgr.Lock()
        dm, dp = measure("dict set+get", dict_pair, d, args.calls,
                         args.warmup)
        lm, lp = measure("lock acquire+rel", lock_pair, lock, args.calls,
                         args.warmup)
    print(json.dumps({"dict_set_get_median_us": round(dm, 2),
                      "dict_set_get_p99_us": round(dp, 2),
                      "lock_pair_median_us": round(lm, 2),
                      "lock_pair_p99_us": round(lp, 2)}), flush=True)


if __name__ == "__main__":
    main()
