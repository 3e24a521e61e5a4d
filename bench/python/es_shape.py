"""The Fiber paper's ES shape with Python tasks, at many workers: fiber with
and without shared objects, next to multiprocessing, in one run.

    build/venv/bin/python bench/python/es_shape.py [--workers 32,128,256]
        [--pairs 1024] [--params 100000] [--episode-ms 10]
        [--iterations 3] [--peers mp] [--noise-floats 1048576]

One iteration: a policy of --params float32 parameters and --pairs
mirrored-pair tasks (population 2 x pairs); each task reads its slice of
a noise table that the pool's initializer built in every worker, "runs" an
episode of --episode-ms milliseconds (a sleep, so that hundreds of workers
fit on two cores: the figure is the pool's overhead, not the machine's
arithmetic), and returns two returns.  Then the master changes the policy
for the next iteration.

- plain: ``pool.map(evaluate, [(theta, seed), ...], chunksize=1)``: the
  policy is pickled into every task (pairs x 400 KB at 100,000 params);
- shared (fiber only): ``pool.map(evaluate_shared, seeds, chunksize=1,
  shared=theta)``: the policy is put once into the object store and every
  worker fetches it once per iteration.

Per configuration: median seconds per iteration over --iterations (after
one untimed iteration that starts the workers; the policy changes every
iteration, so each worker fetches it again), the master's CPU seconds
per iteration (this process's user+system time, its C threads included),
the ideal (pairs x episode / workers), and the workers' start-up time (the
pool created until every worker has run a first task).  Last line: one
JSON object, multiprocessing under "peer".
"""
import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import fiber  # noqa: E402

NOISE = None
EPISODE_S = 0.01


def init_worker(noise_floats, episode_s):
    global NOISE, EPISODE_S
    NOISE = np.random.default_rng(7).standard_normal(noise_floats,
                                                     dtype=np.float32)
    EPISODE_S = episode_s


def _episode(theta, seed):
    n = theta.shape[0]
    at = (seed * 7919) % (NOISE.shape[0] - n)
    eps = NOISE[at:at + n]
    r = float(np.dot(theta, eps))
    time.sleep(EPISODE_S)
    return r, -r


def evaluate(task):
    theta, seed = task
    return _episode(theta, seed)


def evaluate_shared(theta, seed):
    return _episode(theta, seed)


def ready(_):
    time.sleep(0.05)
    return os.getpid()


def run_config(kind, workers, a):
    """kind: 'fiber', 'fiber-shared' or 'mp'.  Returns its figures."""
    init = (a.noise_floats, a.episode_ms / 1000.0)
    t0 = time.perf_counter()
    if kind == "mp":
        pool = multiprocessing.get_context("spawn").Pool(
            workers, initializer=init_worker, initargs=init)
    else:
        pool = fiber.Pool(workers, initializer=init_worker, initargs=init)
    try:
        # Start-up: every worker has run its initializer and a first task.
        pids = set()
        while len(pids) < workers:
            pids.update(pool.map(ready, range(workers), chunksize=1))
            if time.perf_counter() - t0 > 600:
                raise SystemExit("%s: %d workers not up in 600 s" % (kind, workers))
        startup = time.perf_counter() - t0
        rng = np.random.default_rng(1)
        theta = rng.standard_normal(a.params).astype(np.float32)
        seconds, cpu = [], []
        for it in range(a.iterations + 1):
            seeds = list(range(it * a.pairs, (it + 1) * a.pairs))
            c0, w0 = time.process_time(), time.perf_counter()
            if kind == "fiber-shared":
                out = pool.map(evaluate_shared, seeds, chunksize=1,
                               shared=theta)
            else:
                out = pool.map(evaluate, [(theta, s) for s in seeds],
                               chunksize=1)
            w1, c1 = time.perf_counter(), time.process_time()
            assert len(out) == a.pairs
            # A new policy every iteration, as ES makes (before 2026-12-06
            # it changed only when out[0][0] > 0, and shared objects were
            # then reused from the workers' caches half the time).
            theta = theta + np.float32(0.01) * np.float32(
                1.0 if out[0][0] > 0 else -1.0)
            if it > 0:
                seconds.append(w1 - w0)
                cpu.append(c1 - c0)
    finally:
        pool.terminate()
        if kind == "mp":
            pool.join()
    ideal = a.pairs * a.episode_ms / 1000.0 / workers
    s = statistics.median(seconds)
    return {"workers": workers, "s_per_iter": round(s, 4),
            "s_per_iter_all": [round(x, 4) for x in seconds],
            "master_cpu_s_per_iter": round(statistics.median(cpu), 4),
            "ideal_s": round(ideal, 4), "x_ideal": round(s / ideal, 2),
            "startup_s": round(startup, 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="32,128,256")
    ap.add_argument("--pairs", type=int, default=1024)
    ap.add_argument("--params", type=int, default=100_000)
    ap.add_argument("--episode-ms", type=float, default=10.0)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--noise-floats", type=int, default=1 << 20)
    ap.add_argument("--peers", default="mp",
                    help="comma-separated: mp, or none")
    ap.add_argument("--kinds", default="fiber-shared,fiber")
    a = ap.parse_args()
    kinds = [k for k in a.kinds.split(",") if k]
    if "mp" in a.peers.split(","):
        kinds.append("mp")
    results = {}
    for w in [int(x) for x in a.workers.split(",")]:
        for kind in kinds:
            r = run_config(kind, w, a)
            results.setdefault(kind, []).append(r)
            print("%-13s %4d workers: %.3f s/iteration (%.1fx ideal %.3f s), "
                  "master CPU %.3f s/iteration, start-up %.1f s"
                  % (kind, w, r["s_per_iter"], r["x_ideal"], r["ideal_s"],
                     r["master_cpu_s_per_iter"], r["startup_s"]), flush=True)
    out = {"pairs": a.pairs, "params": a.params, "episode_ms": a.episode_ms,
           "fiber_shared": results.get("fiber-shared"),
           "fiber": results.get("fiber"),
           "peer": {"multiprocessing": results.get("mp")}}
    if results.get("mp") and results.get("fiber-shared"):
        out["ratio_vs_multiprocessing"] = [
            round(m["s_per_iter"] / f["s_per_iter"], 2)
            for f, m in zip(results["fiber-shared"], results["mp"])]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
