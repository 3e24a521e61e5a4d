"""A scikit-learn grid search on fiber's joblib backend against joblib's
default (loky), measured in the same run.

    build/venv/bin/python bench/python/bench_sklearn.py [--jobs 2]
        [--samples 2000] [--repeat 1]

The search: GridSearchCV of an RBF SVC on make_classification(samples,
20 features), 5-fold cross-validation over 40 parameter sets (10 values of
C times 4 of gamma): 200 fits.  Each backend runs it `--repeat` times
under ``joblib.parallel_backend(name, n_jobs=jobs)``; the figure is the
best wall time, the workers' start included in the first run of each
(joblib reuses both backends' workers between calls, so a second repeat
shows the warm time).  Both must find the same best parameters and score.
Last line: one JSON object, loky under "peer".
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))  # the package, in place

import joblib  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import make_classification  # noqa: E402
from sklearn.model_selection import GridSearchCV  # noqa: E402
from sklearn.svm import SVC  # noqa: E402

import fiber.joblib_backend  # noqa: E402,F401  (registers "fiber")


def search(backend, jobs, X, y):
    grid = {"C": np.logspace(-3, 3, 10), "gamma": [0.01, 0.1, 1.0, 10.0]}
    t0 = time.perf_counter()
    with joblib.parallel_backend(backend, n_jobs=jobs):
        s = GridSearchCV(SVC(), grid, cv=5).fit(X, y)
    return time.perf_counter() - t0, s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    X, y = make_classification(n_samples=a.samples, n_features=20,
                               random_state=0)
    times, found = {}, {}
    for backend in ("fiber", "loky"):
        runs = []
        for _ in range(a.repeat):
            took, s = search(backend, a.jobs, X, y)
            runs.append(took)
            found[backend] = (s.best_params_, s.best_score_)
        times[backend] = runs
        print("%-5s: %s s (best %.2f s), best %s score %.4f" % (
            backend, " ".join("%.2f" % t for t in runs), min(runs),
            found[backend][0], found[backend][1]), flush=True)
    if found["fiber"][1] != found["loky"][1]:
        sys.exit("the two searches disagree: %r against %r" %
                 (found["fiber"], found["loky"]))
    ratio = min(times["loky"]) / min(times["fiber"])
    print("fiber is %.2fx loky's speed (200 fits, %d jobs)" % (ratio, a.jobs))
    print(json.dumps({
        "fits": 200, "jobs": a.jobs, "samples": a.samples,
        "seconds": round(min(times["fiber"]), 3),
        "runs": [round(t, 3) for t in times["fiber"]],
        "peer": {"loky": {"seconds": round(min(times["loky"]), 3),
                          "runs": [round(t, 3) for t in times["loky"]]}},
        "speed_vs_loky": round(ratio, 3)}))


if __name__ == "__main__":
    main()
