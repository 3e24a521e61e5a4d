"""What a worker pays to resolve a shared object it has not seen yet: the
ES shape's cost per worker per iteration (a new policy each time).

    build/venv/bin/python bench/python/resolve_cost.py [--params 100000]
        [--rounds 200] [--workers 1]

Each round the master puts a new float32 policy of --params parameters
twice: as the bare array (fiber.objects stores it without pickle) and
wrapped in a list (the pickle path, protocol 5 with the array's bytes out
of band: what every other value takes), and each worker resolves both in
one task, timing with time.process_time() (the worker's CPU, its threads
included):
- object_get_us: _fiber.object_get of the new blob (ask the master's blob
  server, map the master's copy);
- decode_first_us / decode_again_us: fiber.objects._decode of that blob,
  the first time and once more (the first pays what the process has not
  touched yet);
(the order of the two alternates by round: the first resolve of a task
also unmaps the blobs released since, see _probe's caller)
for the array path and, in the same run, the pickle path: the peer here
is fiber's own pickle path, the ratio is pickle time / array time.
Medians over rounds after the first 10.  Last line: one JSON object.
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
from fiber import _fiber, _runtime, objects  # noqa: E402


def _probe(ref):
    c0 = time.process_time()
    blob = _fiber.object_get(ref.key, _runtime.child_mode)
    c1 = time.process_time()
    objects._decode(blob)
    c2 = time.process_time()
    objects._decode(blob)
    c3 = time.process_time()
    return c1 - c0, c2 - c1, c3 - c2


def probe(refs):
    return [_probe(r) for r in refs]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--workers", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    theta = rng.standard_normal(a.params).astype(np.float32)
    rows = {"array": [], "pickle": []}
    with fiber.Pool(a.workers) as pool:
        pool.map(abs, range(a.workers), chunksize=1)
        for i in range(a.rounds):
            theta = theta + np.float32(0.01)
            ra, rp = fiber.put(theta), fiber.put([theta + np.float32(0.5)])
            try:
                # The first resolve in a task also unmaps the blobs the
                # master released since (the last process to unmap one
                # frees its pages): alternate which path goes first.
                refs = (ra, rp) if i % 2 == 0 else (rp, ra)
                for out in pool.map(probe, [refs] * a.workers,
                                    chunksize=1):
                    if i >= 10:
                        if i % 2:
                            out = out[::-1]
                        rows["array"].append(out[0])
                        rows["pickle"].append(out[1])
            finally:
                ra.release()
                rp.release()
    names = ["object_get_us", "decode_first_us", "decode_again_us"]
    result = {"params": a.params, "workers": a.workers, "rounds": a.rounds}
    for path in ("array", "pickle"):
        result[path] = {n: round(statistics.median(r[k] for r in rows[path])
                                 * 1e6, 1) for k, n in enumerate(names)}
    for n in names:
        print("%-16s array %7.1f us   pickle %7.1f us   ratio %.2fx" % (
            n, result["array"][n], result["pickle"][n],
            result["pickle"][n] / max(result["array"][n], 1e-3)))
    result["ratio_decode_first"] = round(
        result["pickle"]["decode_first_us"] /
        max(result["array"]["decode_first_us"], 1e-3), 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
