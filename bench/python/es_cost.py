"""Where the CPU of an ES iteration goes at many workers: the es_shape.py
iteration in variants, each timed over many iterations in one pool, with
the whole machine's CPU.

    build/venv/bin/python bench/python/es_cost.py [--workers 256]
        [--iterations 40] [--variants new,same,nodot-new,nodot-same,plain]

One pool of --workers workers (each builds a 4 MiB noise table in its
initializer, as in es_shape.py), then for each variant --iterations maps
of 1,024 tasks (chunksize 1), each sleeping 10 ms:
- new: es_shape.py's iteration: a new 100,000-float32 policy every
  iteration through ``shared=``, and a dot product of it with a slice of
  the noise table;
- same: the same policy every iteration (cached in every worker after
  the first): new minus same is what resolving a new policy costs;
- nodot-new, nodot-same: as new and same without the dot product (the
  task's own arithmetic);
- plain: no shared value at all, only the sleep: the pool's own cost.
Per variant: the median seconds per iteration, the CPU of the whole
machine per iteration (from /proc/stat: every process, the kernel
included; other load on the machine counts too, so run it alone), the
same per task, and the master's own CPU per iteration.  The peer here is
the variants themselves: new against same, in the same pool.  Last line:
one JSON object.
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402

import fiber  # noqa: E402

NOISE = None
TASKS = 1024


def init_worker(noise_floats):
    global NOISE
    NOISE = np.random.default_rng(7).standard_normal(noise_floats,
                                                     dtype=np.float32)


def episode(theta, seed):
    n = theta.shape[0]
    at = (seed * 7919) % (NOISE.shape[0] - n)
    r = float(np.dot(theta, NOISE[at:at + n]))
    time.sleep(0.01)
    return r, -r


def episode_nodot(theta, seed):
    time.sleep(0.01)
    return 0.0, 0.0


def sleep_only(seed):
    time.sleep(0.01)
    return 0.0, 0.0


def ready(_):
    time.sleep(0.05)
    return os.getpid()


def machine_cpu_s():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # not idle


def run_variant(pool, name, theta, iterations):
    func = episode_nodot if name.startswith("nodot") else episode
    walls = []
    c0, m0 = machine_cpu_s(), time.process_time()
    for _ in range(iterations):
        if name.endswith("new"):
            theta = theta + np.float32(0.01)
        t0 = time.perf_counter()
        if name == "plain":
            pool.map(sleep_only, range(TASKS), chunksize=1)
        else:
            pool.map(func, range(TASKS), chunksize=1, shared=theta)
        walls.append(time.perf_counter() - t0)
    c1, m1 = machine_cpu_s(), time.process_time()
    cpu = (c1 - c0) / iterations
    return theta, {"s_per_iter": round(statistics.median(walls), 4),
                   "machine_cpu_ms_per_iter": round(cpu * 1e3, 1),
                   "machine_cpu_us_per_task": round(cpu / TASKS * 1e6, 1),
                   "master_cpu_ms_per_iter":
                       round((m1 - m0) / iterations * 1e3, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=256)
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--variants", default="new,same,nodot-new,nodot-same,"
                    "plain")
    a = ap.parse_args()
    variants = [v for v in a.variants.split(",") if v]
    for v in variants:
        if v not in ("new", "same", "nodot-new", "nodot-same", "plain"):
            raise SystemExit("unknown variant %r" % v)
    theta = np.random.default_rng(1).standard_normal(100_000).astype(
        np.float32)
    out = {"workers": a.workers, "iterations": a.iterations}
    with fiber.Pool(a.workers, initializer=init_worker,
                    initargs=(1 << 20,)) as pool:
        pids = set()
        while len(pids) < a.workers:
            pids.update(pool.map(ready, range(a.workers), chunksize=1))
        for name in variants:
            theta, r = run_variant(pool, name, theta, a.iterations)
            out[name] = r
            print("%-11s %.4f s/iteration  machine CPU %6.1f ms/iteration "
                  "(%5.1f us/task)  master %5.1f ms/iteration" % (
                      name, r["s_per_iter"], r["machine_cpu_ms_per_iter"],
                      r["machine_cpu_us_per_task"],
                      r["master_cpu_ms_per_iter"]), flush=True)
    if "new" in out and "same" in out:
        d = out["new"]["machine_cpu_ms_per_iter"] - \
            out["same"]["machine_cpu_ms_per_iter"]
        out["resolve_cpu_ms_per_iter"] = round(d, 1)
        print("resolving each iteration's new policy: %.1f ms of machine "
              "CPU an iteration (%.0f us a worker)" % (
                  d, d * 1e3 / a.workers))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
