"""peer_common.py -- what the Python peers of the benchmarks share.

Every peer prints its progress on stderr and, as the one line of its stdout,
a JSON object of numbers, which its benchmark reads as the last line.  A
peer imports this module from its own directory:

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import peer_common
"""
import argparse
import json
import math
import statistics
import sys
import time


def parser(doc):
    """An argument parser described by the first paragraph of doc."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0])


def positive_int(text):
    """An argparse type: an int of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def say(text):
    """Progress: one line on stderr, at once."""
    print(text, file=sys.stderr, flush=True)


def emit(figures):
    """The peer's result: the JSON object as the one line of stdout."""
    print(json.dumps(figures), flush=True)


def summarize(v):
    """The median, minimum and maximum of v, as bench_summarize() gives
    them."""
    return statistics.median(v), min(v), max(v)


def nearest_rank(sorted_v, p):
    """The p-th percentile (0..100) of sorted_v, by nearest rank, as
    bench_percentile() computes it: p99 of 20,000 samples is the 19,800th."""
    rank = max(1, min(len(sorted_v), math.ceil(p / 100 * len(sorted_v))))
    return sorted_v[rank - 1]


def calls_parser(doc):
    """The parser of the call-latency peers (latency, manager): --calls and
    --warmup, with their benchmarks' defaults."""
    ap = parser(doc)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=2000)
    return ap


def time_calls(fn, arg, calls, warmup):
    """Calls fn(arg) warmup times untimed, then calls times, each timed on
    its own with time.perf_counter.  Returns the median and the 99th
    percentile (nearest rank) of the microseconds, and all of them sorted."""
    for _ in range(warmup):
        fn(arg)
    us = []
    clock = time.perf_counter
    for _ in range(calls):
        t0 = clock()
        fn(arg)
        us.append((clock() - t0) * 1e6)
    us.sort()
    return statistics.median(us), nearest_rank(us, 99), us


def check_exits(procs, who):
    """Exits the peer when a joined multiprocessing.Process did not exit 0:
    a failed process spoils the figure."""
    bad = [(p.name, p.exitcode) for p in procs if p.exitcode != 0]
    if bad:
        sys.exit(f"{who}: processes did not exit 0: {bad}")


def memory_kib(pids, kind):
    """Sums VmRSS (kind "VmRSS:", from /proc/<pid>/status) or Pss ("Pss:",
    from smaps_rollup) over pids, in KiB, as bench_sum_memory_kib() does;
    processes that vanished are skipped."""
    total = 0.0
    name = "status" if kind == "VmRSS:" else "smaps_rollup"
    for pid in pids:
        try:
            with open(f"/proc/{pid}/{name}") as f:
                for line in f:
                    if line.startswith(kind):
                        total += float(line.split()[1])
                        break
        except OSError:
            pass
    return total
