#!/usr/bin/env python3
"""scale_peer.py -- the peer of bench-scale: multiprocessing.Pool(N).

connect_s: from just before multiprocessing.Pool(N, initializer=record)
until the last worker has run its initializer, which appends its pid and a
CLOCK_MONOTONIC timestamp to a file (the method bench-scale uses: a worker
runs its initializer as soon as it is up, before it takes a task).
total_s: one pool.map of 100 * N tasks that each sleep 10 ms and return
their pid, with map's default chunking (ideal 1.0 s).
rss_per_worker_kib: the sum of VmRSS over the N worker pids / N (Pss too).

Progress goes to stderr; stdout holds exactly one line, a JSON object:
{"workers": N, "connect_s": .., "total_s": .., "rss_per_worker_kib": ..,
 "pss_per_worker_kib": .., "create_s": ..}, which bench-scale reads as the
last line.
"""
import multiprocessing
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (found through the line above)

TASKS_PER_WORKER = 100
TASK_S = 0.010


def now_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def record(path):
    """The initializer: appends '<pid> <ns>' to path in one write."""
    line = f"{os.getpid()} {now_ns()}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def task(_):
    time.sleep(TASK_S)
    return os.getpid()


def read_records(path):
    with open(path) as f:
        recs = [line.split() for line in f if line.strip()]
    return [(int(p), int(t)) for p, t in recs]


def main():
    ap = peer_common.parser(__doc__)
    ap.add_argument("--workers", type=int, default=1024)
    ap.add_argument("--timeout", type=int, default=300)
    args = ap.parse_args()
    n = args.workers
    fd, path = tempfile.mkstemp(prefix="fiber-scale-peer-")
    os.close(fd)
    try:
        t0 = now_ns()
        pool = multiprocessing.Pool(n, initializer=record, initargs=(path,))
        create_s = (now_ns() - t0) / 1e9
        peer_common.say(f"mp     Pool({n}) returned after {create_s:.3f} s")
        deadline = time.monotonic() + args.timeout
        while True:
            recs = read_records(path)
            if len(recs) >= n:
                break
            if time.monotonic() > deadline:
                sys.exit(f"scale_peer: only {len(recs)} of {n} workers "
                         f"started within {args.timeout} s")
            time.sleep(0.002)
        connect_s = (max(t for _, t in recs) - t0) / 1e9
        peer_common.say(f"mp     {n} workers up after {connect_s:.3f} s")
        t1 = time.perf_counter()
        pids = pool.map(task, range(n * TASKS_PER_WORKER))
        total_s = time.perf_counter() - t1
        workers = [p for p, _ in recs]
        rss = peer_common.memory_kib(workers, "VmRSS:") / n
        pss = peer_common.memory_kib(workers, "Pss:") / n
        peer_common.say(f"mp     {len(pids)} tasks of 10 ms in "
                        f"{total_s:.3f} s on {len(set(pids))} workers; "
                        f"VmRSS/worker {rss:.0f} KiB, Pss {pss:.0f} KiB")
        t2 = time.perf_counter()
        pool.terminate()
        pool.join()
        peer_common.say(f"mp     terminate+join took "
                        f"{time.perf_counter() - t2:.3f} s")
    finally:
        os.unlink(path)
    peer_common.emit({"workers": n, "connect_s": round(connect_s, 4),
                      "total_s": round(total_s, 4),
                      "rss_per_worker_kib": round(rss, 1),
                      "pss_per_worker_kib": round(pss, 1),
                      "create_s": round(create_s, 4)})


if __name__ == "__main__":
    main()
