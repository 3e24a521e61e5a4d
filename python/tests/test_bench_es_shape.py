"""bench/python/es_shape.py runs end to end on a small shape: its floor
(forked processes, no framework) and fiber's shared-policy kind each
report a time per iteration, fiber's against the floor, and a bad kind
is refused by name.  The figures themselves are not asserted (the
benchmark is not a timed test)."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
ROOT = os.path.dirname(PKG)
ES_SHAPE = os.path.join(ROOT, "bench", "python", "es_shape.py")

# The benchmark lives in the host's checkout, not in a docker rerun's image.
pytestmark = pytest.mark.host_files

SMALL = ["--workers", "3", "--pairs", "7", "--params", "1000",
         "--noise-floats", "4096", "--episode-ms", "1", "--iterations", "2",
         "--peers", "none"]


def run(args, timeout=180):
    return subprocess.run([sys.executable, ES_SHAPE] + args,
                          capture_output=True, text=True, timeout=timeout)


def test_the_floor_and_fiber_shared_report_their_iterations():
    pytest.importorskip("numpy")
    r = run(SMALL + ["--kinds", "floor,fiber-shared"])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    (floor,) = out["floor"]
    (shared,) = out["fiber_shared"]
    assert floor["workers"] == 3 and shared["workers"] == 3
    # Two timed iterations each; 7 tasks of 1 ms over 3 processes take at
    # least 3 ms (one process runs 3 of them).
    assert len(floor["s_per_iter_all"]) == 2
    assert min(floor["s_per_iter_all"]) >= 0.003
    assert min(shared["s_per_iter_all"]) >= 0.003
    assert shared["x_floor"] == pytest.approx(
        shared["s_per_iter"] / floor["s_per_iter"], rel=0.02)


def test_an_unknown_kind_is_refused_by_name():
    r = run(SMALL + ["--kinds", "floor,fibre"])
    assert r.returncode != 0
    assert "unknown kind 'fibre'" in r.stderr
