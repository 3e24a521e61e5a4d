#!/usr/bin/env python3
"""throughput_peer.py -- the peer of bench-throughput: Pool(2).map.

No-op tasks per second through multiprocessing.Pool(2).map: over
--chunk1-tasks ints with chunksize=1 (every task travels alone), and over
--tasks ints with map's default chunking (len / (4 * workers) per chunk).
The no-op returns its argument; the result is checked.  Each is repeated
--runs times and the median kept.

Progress goes to stderr; stdout holds exactly one line, a JSON object:
{"chunk1_tasks_per_s": .., "auto_tasks_per_s": ..}, which bench-throughput
reads as the last line.
"""
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (found through the line above)

WORKERS = 2


def echo(x):
    """The no-op task: returns its argument."""
    return x


def one_map(pool, n, chunksize):
    data = range(n)
    t0 = time.perf_counter()
    if chunksize:
        out = pool.map(echo, data, chunksize=chunksize)
    else:
        out = pool.map(echo, data)
    t = time.perf_counter() - t0
    if out != list(data):
        sys.exit("throughput_peer: map returned wrong results")
    return n / t


def measure(pool, n, chunksize, runs):
    med, lo, hi = peer_common.summarize(
        [one_map(pool, n, chunksize) for _ in range(runs)])
    peer_common.say(f"mp     chunksize {chunksize or 'auto':<5} {med:12.0f} "
                    f"tasks/s  (min {lo:.0f}, max {hi:.0f}, {runs} runs of "
                    f"{n})")
    return med


def main():
    ap = peer_common.parser(__doc__)
    ap.add_argument("--tasks", type=int, default=1000000)
    ap.add_argument("--chunk1-tasks", type=int, default=200000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with multiprocessing.Pool(WORKERS) as pool:
        one_map(pool, 20000, 0)  # untimed: both workers are up
        c1 = measure(pool, args.chunk1_tasks, 1, args.runs)
        auto = measure(pool, args.tasks, 0, args.runs)
    peer_common.emit({"chunk1_tasks_per_s": round(c1),
                      "auto_tasks_per_s": round(auto)})


if __name__ == "__main__":
    main()
