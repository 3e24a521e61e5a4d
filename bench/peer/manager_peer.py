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
import multiprocessing
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (found through the line above)

KEY = b"bench-key-00001\0"  # 16 bytes, as in bench_manager.c
VALUE = b"a 64-byte value".ljust(64, b"\0")


def dict_pair(d):
    d[KEY] = VALUE
    return d[KEY]


def lock_pair(lock):
    lock.acquire()
    lock.release()


def measure(name, pair, obj, calls, warmup):
    med, p99, _ = peer_common.time_calls(pair, obj, calls, warmup)
    peer_common.say(f"mp     {name:<16} median {med:8.1f} us  p99 "
                    f"{p99:8.1f} us  ({calls} pairs)")
    return med, p99


def main():
    args = peer_common.calls_parser(__doc__).parse_args()
    with multiprocessing.Manager() as mgr:
        d, lock = mgr.dict(), mgr.Lock()
        dm, dp = measure("dict set+get", dict_pair, d, args.calls,
                         args.warmup)
        lm, lp = measure("lock acquire+rel", lock_pair, lock, args.calls,
                         args.warmup)
    peer_common.emit({"dict_set_get_median_us": round(dm, 2),
                      "dict_set_get_p99_us": round(dp, 2),
                      "lock_pair_median_us": round(lm, 2),
                      "lock_pair_p99_us": round(lp, 2)})


if __name__ == "__main__":
    main()
