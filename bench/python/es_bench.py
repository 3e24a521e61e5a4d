"""Seconds per iteration of examples/python/es.py's ES (Hopper-v5,
population 256 by default) on fiber, multiprocessing and Ray, measured in
one run, and each pool's parallel efficiency.

    PYTHONPATH=python build/venv-examples/bin/python bench/python/es_bench.py \
        [--env Hopper-v5] [--pairs 128] [--workers N] [--iterations 3]

Every pool runs the same iterations from the same seed, so they evaluate
exactly the same episodes (the script checks that their policies agree bit
for bit afterwards).  Per pool: the median seconds per iteration (the map
of the iteration's tasks; the update is the same everywhere and is left
out), and

  parallel efficiency = pool steps/s / (workers x one process's steps/s)

where one process's steps/s comes from the same iterations run in this
process with no pool (--pool none of es.py).  A perfect pool would take
the iteration's steps / (workers x one process's steps/s); "a perfect pool
vs multiprocessing" says how much faster than multiprocessing any pool
could be at all (1.0: multiprocessing wastes nothing).  The iterations are warm: one
iteration first, not timed, starts the workers and their noise tables.

The last line is one JSON object: per pool its figures (with a perfect
pool's s/iteration), the ratios of fiber's time per iteration against
each peer (peer / fiber: above 1 is fiber faster) and of each peer's
against a perfect pool's, and which pools could not run (Ray not
installed).
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "python")
sys.path.insert(0, EXAMPLES)

import es  # noqa: E402
import es_pools  # noqa: E402
import es_train  # noqa: E402
import es_worker  # noqa: E402


def measure(kind, workers, cfg, info, noise, iterations, start):
    """Runs 1 + iterations iterations on pool `kind` from state `start`
    (an es.py checkpoint, or None: a new policy); returns its figures and
    the final parameters."""
    trainer = es_train.Trainer(cfg, info, noise)
    if start is not None:
        trainer.load(start)
    t = time.perf_counter()
    pool = es_pools.make_pool(kind, workers, es_worker.init_worker,
                              (cfg["noise_seed"], cfg["noise_size"]))
    seconds, steps = [], 0
    try:
        for i in range(iterations + 1):
            tasks = trainer.tasks(False)
            t0 = time.perf_counter()
            results = pool.map(es_worker.run_task, tasks, chunksize=1)
            dt = time.perf_counter() - t0
            rec = trainer.update(results)
            if i == 0:
                startup = time.perf_counter() - t
                continue
            seconds.append(dt)
            steps += rec["steps"]
            print("  %-15s iteration %d: %.2f s, %d steps (%.0f steps/s)"
                  % (kind, i, dt, rec["steps"], rec["steps"] / dt), flush=True)
    finally:
        es_pools.close_pool(kind, pool)
    total = sum(seconds)
    return {"workers": workers if kind != "none" else 1,
            "s_per_iteration_median": statistics.median(seconds),
            "s_per_iteration": seconds, "steps": steps,
            "steps_per_s": steps / total, "startup_s": startup}, trainer.theta


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="Hopper-v5")
    p.add_argument("--pairs", type=int, default=128, help="mirrored pairs (population = 2x)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--iterations", type=int, default=3, help="timed iterations per pool")
    p.add_argument("--pools", default="none,fiber,multiprocessing,ray")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--from", dest="start", metavar="CHECKPOINT",
                   help="start from an es.py checkpoint's policy (of --env), so that "
                   "episodes are as long as a trained policy's; default: a new policy")
    args = p.parse_args()

    cfg = dict(es.GENERIC_DEFAULTS, **es.ENV_DEFAULTS.get(args.env, {}))
    cfg.update(env=args.env, seed=args.seed, noise_seed=12345, noise_size=2 ** 24)
    start = None
    if args.start:
        start = es.load_checkpoint(args.start)
        cfg.update(start["config"])
        if cfg["env"] != args.env:
            print("es_bench: %s is a checkpoint of %s, not %s" % (args.start, cfg["env"], args.env),
                  file=sys.stderr)
            return 2
    cfg.update(pairs=args.pairs, pairs_per_task=1)
    info = es.env_info(args.env)
    noise = es_worker.noise_table(cfg["noise_seed"], cfg["noise_size"])
    print("es_bench: %s, population %d, %d workers, %d timed iterations per pool (after 1 warm-up), "
          "from %s" % (args.env, 2 * args.pairs, args.workers, args.iterations,
                       "%s (iteration %d)" % (args.start, start["iteration"]) if start
                       else "a new policy"), flush=True)

    figures, skipped, thetas = {}, {}, {}
    for kind in args.pools.split(","):
        try:
            figures[kind], thetas[kind] = measure(kind, args.workers, cfg, info, noise,
                                                  args.iterations, start)
        except es_pools.PoolError as e:
            skipped[kind] = str(e)
            print("  %-15s skipped: %s" % (kind, e), flush=True)
    base = figures.get("none")
    for kind, f in figures.items():
        if base and kind != "none":
            f["parallel_efficiency"] = f["steps_per_s"] / (f["workers"] * base["steps_per_s"])
            # What a perfect pool would take: the steps at one process's
            # rate on every worker; above it is the pool's cost (and noise).
            f["ideal_s_per_iteration"] = (f["steps"] / len(f["s_per_iteration"])
                                          / (f["workers"] * base["steps_per_s"]))
    same = len({t.tobytes() for t in thetas.values()}) <= 1

    print("\n%-16s %14s %12s %11s %10s" % ("pool", "s/iteration", "steps/s", "efficiency", "start-up"))
    for kind, f in figures.items():
        print("%-16s %14.2f %12.0f %11s %9.2fs" % (
            kind, f["s_per_iteration_median"], f["steps_per_s"],
            "%.2f" % f["parallel_efficiency"] if "parallel_efficiency" in f else "-",
            f["startup_s"]))
    ratios = {}
    if "fiber" in figures:
        for kind in ("multiprocessing", "ray"):
            if kind in figures:
                ratios["fiber_vs_" + kind] = (figures[kind]["s_per_iteration_median"]
                                              / figures["fiber"]["s_per_iteration_median"])
                print("fiber vs %s: %.2fx (their s/iteration over fiber's)"
                      % (kind, ratios["fiber_vs_" + kind]))
                f = figures[kind]
                if "ideal_s_per_iteration" in f:
                    ratios["ideal_vs_" + kind] = (f["s_per_iteration_median"]
                                                  / f["ideal_s_per_iteration"])
                    print("a perfect pool vs %s: %.2fx (the most any pool could gain on it)"
                          % (kind, ratios["ideal_vs_" + kind]))
    print("policies identical across pools: %s" % same)
    print(json.dumps({"bench": "es_bench", "env": args.env, "population": 2 * args.pairs,
                      "workers": args.workers, "iterations": args.iterations,
                      "from": args.start, "from_iteration": start["iteration"] if start else 0,
                      "pools": figures, "ratios": ratios, "skipped": skipped,
                      "identical_policies": same}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
