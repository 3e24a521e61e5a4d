"""Python benchmarks of fiber against multiprocessing (and Fiber 0.2.1, Ray
or Dask when importable), measured in the same run.

    build/venv/bin/python bench/python/bench_python.py [--quick]

Prints one line per figure, then one JSON object on the last line:
fiber's figures under their names, the peers' under "peer"
("peer": {"multiprocessing": {...}, "ray": {...}}), and ratios under
"ratio_vs_<peer>" (peer time / fiber time, or fiber rate / peer rate:
above 1 is fiber ahead).  Fiber 0.2.1, Ray and Dask are measured on the
pool figures when bench/python/peers-env.sh has installed them into
build/venv-peers (each in a process of its own: Uber's package is also
called `fiber`).

Figures (2-core machine):
- overhead_1ms_us, overhead_10ms_us: the Fiber paper's overhead test with
  Python tasks, as bench-overhead measures it: 5 workers, rounds of 5
  apply_async of a task sleeping 1 ms (10 ms) that returns the sleep it
  measured; overhead per round = (elapsed - floor) / rounds, the floor
  being the sum of each round's longest measured sleep.
- the overhead test with no framework (overhead_floor.py: five forked
  Python processes over socket pairs, the same rounds), under "floor",
  and fiber's figures over it under "x_floor": what this machine's
  wake-ups cost a round whatever the framework (docs/python.md has the
  figures of the VMs it ran on).
- apply_rtt_median_us: one worker, apply() of a no-op, median of n after
  as many untimed ones.  The steady state: on the 2-core VM the first
  thousands of round trips after a pool starts are slower for every peer
  (fiber 22-26 us then 14-19 us, multiprocessing 190-210 us then 160-185
  us, 2026-12-05).
- map_c1_tasks_per_s, map_auto_tasks_per_s: no-op tasks through map with
  2 workers, chunksize 1 and automatic (map(noop, range(n))): the median
  of 5 maps after an untimed one.
- imap_c1_tasks_per_s, imap_unordered_c1_tasks_per_s, imap_c100_tasks_per_s:
  no-op tasks through imap (imap_unordered) with 2 workers, chunksize 1
  and 100, every result taken by iterating.
- numpy_map_gb_per_s: map over 1,000 arrays of 1 MiB returning a scalar.
- queue_msgs_per_s: 64-byte messages, one producer process, one consumer.
- manager_dict_setget_median_us: set then get on a manager dict.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_tasks as T  # noqa: E402


class _pool:
    """`with _pool(mod, n) as pool`: mod.Pool(n), terminated at the end
    (Fiber 0.2.1's pool is no context manager)."""

    def __init__(self, mod, n):
        self.pool = mod.Pool(n)

    def __enter__(self):
        return self.pool

    def __exit__(self, *exc):
        self.pool.terminate()


def warm_up(pool, n):
    """Returns once n workers are up: n tasks of 0.2 s, one each."""
    wait = getattr(pool, "wait_until_workers_up", None)
    if wait is not None and "fiber" in type(pool).__module__:
        wait()
    pool.map(T.sleep, [0.2] * n, 1)


def timed(fn, *a):
    t = time.perf_counter()
    fn(*a)
    return time.perf_counter() - t


def overhead(mod, t, rounds):
    """The Fiber paper's seq test as bench-overhead measures it: rounds of 5
    apply_async of a task that sleeps t and returns the sleep it measured;
    overhead per round = (total - floor) / rounds, where the floor is the
    sum over rounds of each round's longest measured sleep."""
    with _pool(mod, 5) as pool:
        warm_up(pool, 5)
        floor = 0.0
        start = time.perf_counter()
        for _ in range(rounds):
            rs = [pool.apply_async(T.sleep, (t,)) for _ in range(5)]
            floor += max(r.get() for r in rs)
        total = time.perf_counter() - start
    return (total - floor) / rounds * 1e6


def apply_rtt(mod, n):
    with _pool(mod, 1) as pool:
        warm_up(pool, 1)
        for _ in range(n):
            pool.apply(T.noop, (0,))
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            pool.apply(T.noop, (0,))
            samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def map_rate(mod, n, chunksize, runs=5):
    """The median rate of runs maps of n no-op tasks, after one untimed
    map (the steady state: a single map of 100,000 no-op tasks lasts
    10-20 ms, and the first in a new pool also pays for the heaps the
    master and the workers grow, for every peer)."""
    with _pool(mod, 2) as pool:
        warm_up(pool, 2)
        pool.map(T.noop, range(n), chunksize)
        els = [timed(pool.map, T.noop, range(n), chunksize)
               for _ in range(runs)]
    return n / statistics.median(els)


def imap_rate(mod, n, chunksize, unordered=False):
    with _pool(mod, 2) as pool:
        warm_up(pool, 2)
        t = time.perf_counter()
        it = (pool.imap_unordered if unordered else pool.imap)(
            T.noop, range(n), chunksize)
        for _ in it:
            pass
        el = time.perf_counter() - t
    return n / el


def numpy_rate(mod, n):
    import numpy as np
    arrays = [np.full(1 << 17, i, dtype=np.float64) for i in range(n)]  # 1 MiB
    with _pool(mod, 2) as pool:
        warm_up(pool, 2)
        el = timed(pool.map, T.asum, arrays, 1)
    return n * (1 << 20) / el / 1e9


def queue_rate(mod, n):
    q = mod.Queue()
    p = mod.Process(target=T.produce, args=(q, n))
    p.start()
    q.get()  # the producer is up
    t = time.perf_counter()
    for _ in range(n):
        q.get()
    el = time.perf_counter() - t
    p.join()
    return n / el


def manager_setget(mod, n):
    m = mod.Manager()
    d = m.dict()
    samples = []
    for i in range(n):
        t = time.perf_counter()
        d["k"] = i
        d["k"]
        samples.append(time.perf_counter() - t)
    m.shutdown()
    return statistics.median(samples) * 1e6


def measure_pool(mod, quick):
    """The pool figures, which every peer is measured on."""
    s = 0.25 if quick else 1.0
    r = {}
    r["overhead_1ms_us"] = overhead(mod, 0.001, int(200 * s))
    r["overhead_10ms_us"] = overhead(mod, 0.010, int(50 * s))
    r["apply_rtt_median_us"] = apply_rtt(mod, int(2000 * s))
    r["map_c1_tasks_per_s"] = map_rate(mod, int(20000 * s), 1)
    r["map_auto_tasks_per_s"] = map_rate(mod, int(100000 * s), None)
    return r


def measure(mod, quick):
    s = 0.25 if quick else 1.0
    r = measure_pool(mod, quick)
    r["imap_c1_tasks_per_s"] = imap_rate(mod, int(20000 * s), 1)
    r["imap_unordered_c1_tasks_per_s"] = imap_rate(mod, int(20000 * s), 1,
                                                   True)
    r["imap_c100_tasks_per_s"] = imap_rate(mod, int(500000 * s), 100)
    try:
        r["numpy_map_gb_per_s"] = numpy_rate(mod, int(1000 * s))
    except ImportError:
        pass
    r["queue_msgs_per_s"] = queue_rate(mod, int(20000 * s))
    r["manager_dict_setget_median_us"] = manager_setget(mod, int(2000 * s))
    return r


def measure_peer(name, venv, quick):
    """A peer's pool figures from peer_measure.py in its own venv, or None
    (with the reason printed) when it is not installed or fails."""
    import subprocess
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        print("peer %s: %s is missing (bench/python/peers-env.sh makes it)"
              % (name, venv))
        return None
    cmd = [py, os.path.join(HERE, "peer_measure.py"), "--peer", name]
    if quick:
        cmd.append("--quick")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # this fiber must not shadow Uber's
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                             env=env)
    except subprocess.TimeoutExpired:
        print("peer %s: timed out" % name)
        return None
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        err = (out.stderr.strip().splitlines() or ["no output"])[-1]
        print("peer %s: not measured (%s)" % (name, err))
        return None
    return json.loads(lines[-1])


def measure_floor(quick):
    """The overhead test with no framework (overhead_floor.py, in a fresh
    interpreter: it forks), or None with the reason printed."""
    import subprocess
    cmd = [sys.executable, os.path.join(HERE, "overhead_floor.py")]
    if quick:
        cmd.append("--quick")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        err = (out.stderr.strip().splitlines() or ["no output"])[-1]
        print("floor: not measured (%s)" % err)
        return None
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--peers", default="fiber021,ray,dask",
                    help="peers besides multiprocessing, measured from "
                    "--peers-venv when installed there (comma-separated; "
                    "'' for none)")
    ap.add_argument("--peers-venv", default=os.path.join(
        os.path.dirname(os.path.dirname(HERE)), "build", "venv-peers"))
    args = ap.parse_args()
    import fiber
    import multiprocessing
    mods = {"multiprocessing": multiprocessing.get_context("spawn")}
    out = {"peer": {}}
    print("fiber %s, Python %s, %d CPUs" % (fiber.__version__,
                                           sys.version.split()[0],
                                           os.cpu_count()))
    fib = measure(fiber, args.quick)
    for k, v in fib.items():
        print("fiber            %-32s %12.1f" % (k, v))
    out.update(fib)
    floor = measure_floor(args.quick)
    if floor is not None:
        out["floor"] = floor
        out["x_floor"] = {}
        for k, v in floor.items():
            print("floor            %-32s %12.1f" % (k, v))
            out["x_floor"][k] = fib[k] / v
            print("fiber / floor    %-32s %8.2fx" % (k, fib[k] / v))
    for name, mod in mods.items():
        res = measure(mod, args.quick)
        out["peer"][name] = res
        for k, v in res.items():
            print("%-16s %-32s %12.1f" % (name, k, v))
    for name in [p for p in args.peers.split(",") if p]:
        res = measure_peer(name, args.peers_venv, args.quick)
        if res is None:
            continue
        out["peer"][name] = res
        for k, v in res.items():
            print("%-16s %-32s %12.1f" % (name, k, v))
    ratios = {}
    mp = out["peer"]["multiprocessing"]
    for k, v in fib.items():
        if k not in mp or not v or not mp[k]:
            continue
        lower_is_better = k.endswith("_us")
        ratios[k] = mp[k] / v if lower_is_better else v / mp[k]
        print("ratio vs multiprocessing %-32s %8.2fx" % (k, ratios[k]))
    out["ratio_vs_multiprocessing"] = ratios
    for name, res in out["peer"].items():
        if name == "multiprocessing":
            continue
        for k, v in res.items():
            if k in fib and v and fib[k]:
                r = v / fib[k] if k.endswith("_us") else fib[k] / v
                out.setdefault("ratio_vs_" + name, {})[k] = r
                print("ratio vs %-15s %-32s %8.2fx" % (name, k, r))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
