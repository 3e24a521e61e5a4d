"""fiber.experimental.Ring's allreduce from Python against the C ring's,
measured in the same run.

    build/venv/bin/python bench/python/bench_ring.py [--members 4]
        [--mib 64] [--rounds 9] [--repeat 5] [--c-bench build/bin/bench-ring]

Python: a Ring of N members (local fiber processes) each allreduces a
float32 numpy array of MiB mebibytes R times in place (one untimed call
first; before each timed call the members line up with a one-element
allreduce); each member times its own call, a round takes as long as its
slowest member, and the figure is the median round, as bench-ring
(bench/bench_ring.c) measures the C ring.  Reported as bus bandwidth,
2(N-1)/N * bytes / time (NCCL's convention).  The C figure is
bench-ring's busbw_gbps_64mib_n4 from the same run (it measures N = 2, 4,
8 on 1 and 64 MiB; only its 64 MiB 4-member figure is compared, so the
defaults match it).  The two take turns `--repeat` times (Python, then
C), so a slow spell of the machine falls on both; each side's figure is
the median of its repeats, and each repeat's own ratio is printed too.
Last line: one JSON object, the C ring under "peer".
multiprocessing has no allreduce, so no multiprocessing figure.
"""
import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))  # the package, in place

import fiber  # noqa: E402
from fiber.experimental import Ring  # noqa: E402
from fiber.experimental import ring as fring  # noqa: E402


def member(q, mib, rounds, rank, size):
    a = np.ones((mib << 20) // 4, dtype=np.float32)
    one = np.zeros(1, dtype=np.float32)
    fring.allreduce(a)                     # untimed: pages, buffers
    times = []
    for _ in range(rounds):
        fring.allreduce(one)               # line up
        t0 = time.perf_counter()
        fring.allreduce(a)
        times.append(time.perf_counter() - t0)
    q.put((rank, times))


def python_busbw(n, mib, rounds):
    q = fiber.SimpleQueue()
    Ring(n, functools.partial(member, q, mib, rounds), members=False).run()
    per_member = dict(q.get() for _ in range(n))
    rounds_s = [max(per_member[r][i] for r in range(n)) for i in range(rounds)]
    t = statistics.median(rounds_s)
    return 2 * (n - 1) / n * (mib << 20) / t / 1e9, t * 1e3


def c_busbw(path, n, mib, rounds):
    out = subprocess.run([path, "--rounds", str(rounds)], capture_output=True,
                         text=True, timeout=1800, check=True).stdout
    last = json.loads(out.strip().splitlines()[-1])
    key = "busbw_gbps_%dmib_n%d" % (mib, n)
    if key not in last:
        sys.exit("bench-ring has no %s (it measures 1 and 64 MiB on 2, 4 and "
                 "8 members)" % key)
    return last[key], last.get("ms_%dmib_n%d" % (mib, n))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--c-bench", default=os.path.join(ROOT, "build", "bin",
                                                       "bench-ring"))
    a = ap.parse_args()
    ap_pairs = []
    for k in range(a.repeat):
        py, py_ms = python_busbw(a.members, a.mib, a.rounds)
        c, c_ms = c_busbw(a.c_bench, a.members, a.mib, a.rounds)
        print("repeat %d: python Ring.allreduce %.3f GB/s busbw (median round "
              "%.1f ms), C fiber_ring_allreduce (bench-ring) %.3f GB/s "
              "(median round %s ms): %.2fx" % (k + 1, py, py_ms, c, c_ms,
                                               py / c), flush=True)
        ap_pairs.append((py, py_ms, c, c_ms))
    py = statistics.median(p[0] for p in ap_pairs)
    py_ms = statistics.median(p[1] for p in ap_pairs)
    c = statistics.median(p[2] for p in ap_pairs)
    c_ms = statistics.median(p[3] for p in ap_pairs)
    print("python Ring.allreduce: %d members, %d MiB float32: %.3f GB/s busbw "
          "(median of %d repeats)" % (a.members, a.mib, py, a.repeat))
    print("C fiber_ring_allreduce (bench-ring), same run: %.3f GB/s busbw"
          % c)
    print("python / C: %.2fx" % (py / c))
    print(json.dumps({
        "members": a.members, "mib": a.mib, "rounds": a.rounds,
        "repeat": a.repeat,
        "busbw_gbps": round(py, 4), "median_ms": round(py_ms, 3),
        "peer": {"c_ring": {"busbw_gbps": c, "median_ms": c_ms}},
        "repeats": [{"python_gbps": round(p[0], 4), "c_gbps": p[2]}
                    for p in ap_pairs],
        "ratio_vs_c_ring": round(py / c, 3)}))


if __name__ == "__main__":
    main()
