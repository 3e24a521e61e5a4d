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
  worker fetches it once per iteration;
- floor (no framework): what this machine needs for the same work.  A
  fresh interpreter forks --workers processes that each run the same
  initializer; each iteration the master writes the new policy into
  memory they all map (communication for free) and releases them
  through a pipe; each runs its even share of the same tasks
  (``_episode`` on the same seeds) and says so through a pipe.  No pool
  can beat it: a pool must also send tasks and results and hand the
  policy over.  On 2 cores 256 processes' wake-ups and noise-table reads
  already take longer than the ideal, so fiber's figure is also given
  against the floor (x_floor).

Per configuration: median seconds per iteration over --iterations (after
one untimed iteration that starts the workers; the policy changes every
iteration, so each worker fetches it again), the master's CPU seconds
per iteration (this process's user+system time, its C threads included),
the ideal (pairs x episode / workers), the workers' start-up time (the
pool created until every worker has run a first task) and, when the
floor is measured (--kinds includes floor, the default), the ratio to
the floor measured just before at the same number of workers.  Last line:
one JSON object, multiprocessing under "peer", the floor under "floor".
"""
import argparse
import json
import mmap
import multiprocessing
import os
import statistics
import subprocess
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


def _floor_worker(i, workers, a, theta_mem, go_r, done_w, quit_r):
    """A floor process: the pool's initializer, then per iteration its even
    share of the map's seeds (i, i + workers, ...) as the tasks run them."""
    init_worker(a.noise_floats, a.episode_ms / 1000.0)
    theta = np.frombuffer(theta_mem, dtype=np.float32)
    os.write(done_w, b"r")
    for it in range(a.iterations + 1):
        os.read(go_r, 1)
        for s in range(it * a.pairs + i, (it + 1) * a.pairs, workers):
            _episode(theta, s)
        os.write(done_w, b"d")
    os.read(quit_r, 1)  # exits only after the last timing (exits cost CPU)


def _read_n(fd, n):
    got = 0
    while got < n:
        b = os.read(fd, n - got)
        if not b:
            raise SystemExit("floor: a process died")
        got += len(b)


def floor_main(workers, a):
    """Runs in a fresh interpreter (--floor-only): forks the floor's
    processes and prints one JSON object."""
    theta_mem = mmap.mmap(-1, a.params * 4)  # shared with the children
    theta = np.frombuffer(theta_mem, dtype=np.float32)
    theta[:] = np.random.default_rng(1).standard_normal(a.params).astype(
        np.float32)
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    quit_r, quit_w = os.pipe()
    pids = []
    for i in range(workers):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _floor_worker(i, workers, a, theta_mem, go_r, done_w, quit_r)
            except BaseException:
                code = 1
            os._exit(code)
        pids.append(pid)
    _read_n(done_r, workers)
    seconds = []
    for it in range(a.iterations + 1):
        theta += np.float32(0.01)  # a new policy, written in place
        t0 = time.perf_counter()
        os.write(go_w, b"g" * workers)
        _read_n(done_r, workers)
        if it > 0:
            seconds.append(time.perf_counter() - t0)
    os.write(quit_w, b"q" * workers)
    bad = sum(os.waitpid(p, 0)[1] != 0 for p in pids)
    if bad:
        raise SystemExit("floor: %d processes failed" % bad)
    print(json.dumps({"workers": workers,
                      "s_per_iter": round(statistics.median(seconds), 4),
                      "s_per_iter_all": [round(x, 4) for x in seconds]}))


def run_floor(workers, a):
    cmd = [sys.executable, os.path.abspath(__file__), "--floor-only",
           str(workers), "--pairs", str(a.pairs), "--params", str(a.params),
           "--episode-ms", str(a.episode_ms), "--iterations",
           str(a.iterations), "--noise-floats", str(a.noise_floats)]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["ideal_s"] = round(a.pairs * a.episode_ms / 1000.0 / workers, 4)
    return r


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
    ap.add_argument("--kinds", default="floor,fiber-shared,fiber",
                    help="comma-separated: floor, fiber-shared, fiber")
    ap.add_argument("--floor-only", type=int, metavar="WORKERS",
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.floor_only:
        floor_main(a.floor_only, a)
        return
    kinds = [k for k in a.kinds.split(",") if k]
    for k in kinds:
        if k not in ("floor", "fiber-shared", "fiber"):
            raise SystemExit("unknown kind %r (floor, fiber-shared, fiber; "
                             "multiprocessing is --peers mp)" % k)
    if "mp" in a.peers.split(","):
        kinds.append("mp")
    results = {}
    for w in [int(x) for x in a.workers.split(",")]:
        floor = None
        for kind in kinds:
            if kind == "floor":
                floor = run_floor(w, a)
                results.setdefault(kind, []).append(floor)
                print("%-13s %4d workers: %.3f s/iteration (ideal %.3f s): "
                      "forked processes, no framework" % (
                          kind, w, floor["s_per_iter"], floor["ideal_s"]),
                      flush=True)
                continue
            r = run_config(kind, w, a)
            if floor:
                r["x_floor"] = round(r["s_per_iter"] / floor["s_per_iter"], 2)
            results.setdefault(kind, []).append(r)
            print("%-13s %4d workers: %.3f s/iteration (%.1fx ideal %.3f s%s), "
                  "master CPU %.3f s/iteration, start-up %.1f s"
                  % (kind, w, r["s_per_iter"], r["x_ideal"], r["ideal_s"],
                     ", %.2fx floor" % r["x_floor"] if floor else "",
                     r["master_cpu_s_per_iter"], r["startup_s"]), flush=True)
    out = {"pairs": a.pairs, "params": a.params, "episode_ms": a.episode_ms,
           "fiber_shared": results.get("fiber-shared"),
           "fiber": results.get("fiber"),
           "floor": results.get("floor"),
           "peer": {"multiprocessing": results.get("mp")}}
    if results.get("mp") and results.get("fiber-shared"):
        out["ratio_vs_multiprocessing"] = [
            round(m["s_per_iter"] / f["s_per_iter"], 2)
            for f, m in zip(results["fiber-shared"], results["mp"])]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
