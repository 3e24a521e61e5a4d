"""How long until N local Python workers of a pool are ready: fiber
against multiprocessing, measured in the same run.

    build/venv/bin/python bench/python/bench_start.py [--workers 32,128,256]
        [--modes fiber,mp-fork,mp-spawn] [--timeout 300]

One figure per mode and N: the time from creating Pool(N) until
pool.map(task, range(N), chunksize=1) has returned N results from N
distinct worker processes (each task writes its pid into a folder and
waits until N pids are there, so no worker can run two of them; the map
returns when the last worker has started and run its task).  Each figure
is measured in a fresh interpreter (this script run with --one), whose
main module, this script, imports numpy as a real program's would: a
spawned worker imports it again, a forked one has it already.

Modes: fiber (the local backend, jobs forked from its fork server, the
default), fiber-spawn (the same with fork_server = false: every job a new
interpreter), mp-fork (multiprocessing's default start method on Linux)
and mp-spawn (its 'spawn').  Ratios are fiber's time over each peer's.
The last line is one JSON object: fiber's figures as ready_<N>_s, the
peers' under "peer".
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy  # noqa: F401  (what a real program's workers import)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def touch_and_wait(arg):
    """Records this worker's pid in folder, then waits until n workers
    have; returns the pid."""
    folder, n, deadline = arg
    pid = os.getpid()
    open(os.path.join(folder, str(pid)), "w").close()
    while len(os.listdir(folder)) < n and time.time() < deadline:
        time.sleep(0.005)
    return pid


def measure(mode, n, timeout):
    folder = tempfile.mkdtemp(prefix="bench-start-")
    try:
        if mode.startswith("fiber"):
            sys.path.insert(0, os.path.join(ROOT, "python"))
            import fiber
            fiber.init(backend="local", fork_server=(mode == "fiber"))
            make_pool = fiber.Pool
        else:
            import multiprocessing
            ctx = multiprocessing.get_context(
                "spawn" if mode == "mp-spawn" else "fork")
            make_pool = ctx.Pool
        start = time.perf_counter()
        deadline = time.time() + timeout
        with make_pool(n) as pool:
            pids = pool.map(touch_and_wait,
                            [(folder, n, deadline)] * n, chunksize=1)
            elapsed = time.perf_counter() - start
            pool.terminate()
        return {"seconds": elapsed, "distinct": len(set(pids))}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_one(mode, n, timeout):
    """Measures in a fresh interpreter; returns seconds or None."""
    cmd = [sys.executable, os.path.abspath(__file__), "--one", mode, str(n),
           "--timeout", str(timeout)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True,
                             timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        print("  %s N=%d: timed out" % (mode, n), flush=True)
        return None
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        print("  %s N=%d failed (exit %d): %s" % (
            mode, n, out.returncode, out.stderr.strip()[-500:]), flush=True)
        return None
    r = json.loads(lines[-1])
    if r["distinct"] != n:
        print("  %s N=%d: only %d distinct workers" % (mode, n, r["distinct"]))
        return None
    return r["seconds"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default="32,128,256")
    ap.add_argument("--modes", default="fiber,mp-fork,mp-spawn")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--settle", type=float, default=5,
                    help="seconds to wait between measurements, for the "
                    "last one's processes to end")
    ap.add_argument("--one", nargs=2, metavar=("MODE", "N"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(measure(a.one[0], int(a.one[1]), a.timeout)))
        return
    modes = a.modes.split(",")
    for m in modes:
        if m not in ("fiber", "fiber-spawn", "mp-fork", "mp-spawn"):
            sys.exit("bench_start: unknown mode %r (fiber, fiber-spawn, "
                     "mp-fork, mp-spawn)" % m)
    sizes = [int(x) for x in a.workers.split(",")]
    print("time until N workers of a Pool(N) have each run a task (s), "
          "%d CPUs" % os.cpu_count(), flush=True)
    fig = {m: {} for m in modes}
    for n in sizes:
        for m in modes:
            fig[m][n] = run_one(m, n, a.timeout)
            time.sleep(a.settle)
        row = "  N=%-4d " % n + "  ".join(
            "%s %s" % (m, "-" if fig[m][n] is None else "%.2f" % fig[m][n])
            for m in modes)
        base = fig.get("fiber", {}).get(n)
        for m in modes:
            if m != "fiber" and base and fig[m][n]:
                row += "  fiber/%s %.2fx" % (m, base / fig[m][n])
        print(row, flush=True)
    key = {"fiber-spawn": "fiber_spawn", "mp-fork": "mp_fork",
           "mp-spawn": "mp_spawn"}
    result = {"ready_%d_s" % n: fig["fiber"][n]
              for n in sizes if "fiber" in fig}
    result["peer"] = {key[m]: {"ready_%d_s" % n: fig[m][n] for n in sizes}
                      for m in modes if m != "fiber"}
    for m in modes:
        if m == "fiber" or "fiber" not in fig:
            continue
        for n in sizes:
            if fig["fiber"][n] and fig[m][n]:
                result["ratio_%s_%d" % (key[m], n)] = round(
                    fig["fiber"][n] / fig[m][n], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
