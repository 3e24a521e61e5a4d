"""examples/python/es.py on gymnasium's CartPole-v1: it trains to 500, a
run resumed from a checkpoint continues bit for bit, and bad input gets a
clear error.  Skipped when gymnasium is missing, except under CI=true,
where the project's scripts install it (scripts/python-env.sh) and a
missing gymnasium fails."""
import importlib.util
import os
import pickle
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
ROOT = os.path.dirname(PKG)
ES = os.path.join(ROOT, "examples", "python", "es.py")
PBT = os.path.join(ROOT, "examples", "python", "pbt.py")

# The jobs import examples/python/es_worker.py from the host's file system:
# left out of a docker rerun, whose image holds only the test folder.
pytestmark = pytest.mark.host_files


@pytest.fixture
def gym():
    if importlib.util.find_spec("gymnasium") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("gymnasium is missing: scripts/python-env.sh installs it in build/venv")
        pytest.skip("gymnasium is not installed (scripts/python-env.sh installs it)")


def run(script, args, cwd, timeout=180):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PKG] + [p for p in [env.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, script] + args, capture_output=True, text=True,
                          timeout=timeout, cwd=str(cwd), env=env)


def iteration_lines(out):
    """{iteration: (mean, best, eval)} from the progress lines."""
    rows = {}
    for m in re.finditer(r"^iter +(\d+) +mean +(\S+) +best +(\S+) +eval +(\S+)", out, re.M):
        rows[int(m.group(1))] = m.group(2, 3, 4)
    return rows


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def test_cartpole_trains_to_500_and_a_resumed_run_continues_identically(gym, tmp_path):
    common = ["--env", "CartPole-v1", "--seed", "2", "--pool", "fiber"]
    full = run(ES, common + ["--workers", "2", "--checkpoint", "full.pkl"], tmp_path)
    assert full.returncode == 0, full.stdout + full.stderr
    m = re.search(r"solved at iteration (\d+) .* averages ([\d.]+) on 20 new start states "
                  r"\(lowest ([\d.]+)\)", full.stdout)
    assert m, full.stdout
    solved_at = int(m.group(1))
    assert float(m.group(2)) == 500.0 and float(m.group(3)) == 500.0
    assert solved_at >= 3, "too easy to test a resume: %s" % full.stdout

    # The same run, stopped after 2 iterations, then resumed (with another
    # number of workers, which must not change a thing).
    part = run(ES, common + ["--workers", "2", "--iterations", "2", "--checkpoint", "part.pkl"],
               tmp_path)
    assert part.returncode == 1 and "target 500 not reached in 2 iterations" in part.stdout, \
        part.stdout + part.stderr
    assert load(tmp_path / "part.pkl")["iteration"] == 2
    resumed = run(ES, ["--resume", "part.pkl", "--checkpoint", "part.pkl", "--workers", "1"],
                  tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed part.pkl at iteration 2" in resumed.stdout

    a, b = load(tmp_path / "full.pkl"), load(tmp_path / "part.pkl")
    assert a["iteration"] == b["iteration"] == solved_at
    for key in ("theta", "adam_m", "adam_v"):
        assert a[key].tobytes() == b[key].tobytes(), key
    assert a["adam_t"] == b["adam_t"] and a["rng"] == b["rng"]
    for x, y in zip(a["obs"][1:], b["obs"][1:]):
        assert x.tobytes() == y.tobytes()
    figures = ("iteration", "mean", "best", "eval", "episodes", "steps", "timesteps")
    assert [[h[k] for k in figures] for h in a["history"]] == \
        [[h[k] for k in figures] for h in b["history"]]
    lines_full, lines_resumed = iteration_lines(full.stdout), iteration_lines(resumed.stdout)
    assert sorted(lines_resumed) == list(range(3, solved_at + 1))
    for i in lines_resumed:
        assert lines_resumed[i] == lines_full[i], i


def test_the_pools_agree_bit_for_bit(gym, tmp_path):
    common = ["--env", "CartPole-v1", "--seed", "3", "--iterations", "2", "--workers", "2"]
    for pool in ("fiber", "multiprocessing", "none"):
        r = run(ES, common + ["--pool", pool, "--checkpoint", pool + ".pkl"], tmp_path)
        assert r.returncode in (0, 1), r.stdout + r.stderr
    thetas = [load(tmp_path / (p + ".pkl"))["theta"].tobytes()
              for p in ("fiber", "multiprocessing", "none")]
    assert thetas[0] == thetas[1] == thetas[2]


def test_bad_input_gets_a_clear_error(gym, tmp_path):
    r = run(ES, ["--env", "NoSuchEnv-v0", "--iterations", "1"], tmp_path)
    assert r.returncode == 1 and "unknown environment 'NoSuchEnv-v0'" in r.stderr, r.stderr

    r = run(ES, ["--env", "CartPole-v1", "--iterations", "1", "--checkpoint", "c.pkl"], tmp_path)
    assert r.returncode in (0, 1), r.stderr
    r = run(ES, ["--resume", "c.pkl", "--sigma", "0.5"], tmp_path)
    assert r.returncode == 2 and "--sigma 0.5 differs from the checkpoint's 0.1" in r.stderr, r.stderr

    (tmp_path / "junk.pkl").write_bytes(b"not a pickle")
    r = run(ES, ["--resume", "junk.pkl"], tmp_path)
    assert r.returncode == 2 and "cannot read checkpoint junk.pkl" in r.stderr, r.stderr

    r = run(ES, ["--env", "CartPole-v1", "--hidden", "64,x"], tmp_path)
    assert r.returncode == 2 and "--hidden wants sizes like 64,64" in r.stderr, r.stderr


def test_a_missing_environment_package_is_named(gym, tmp_path):
    if importlib.util.find_spec("mujoco") is not None:
        pytest.skip("mujoco is installed here: its absence cannot be shown")
    r = run(ES, ["--env", "Hopper-v5", "--iterations", "1"], tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'Hopper-v5 needs gymnasium[mujoco]: pip install "gymnasium[mujoco]"' in r.stderr, r.stderr


def test_ray_pool_without_ray_says_so(gym, tmp_path):
    if importlib.util.find_spec("ray") is not None:
        pytest.skip("ray is installed here")
    r = run(ES, ["--env", "CartPole-v1", "--pool", "ray", "--iterations", "1"], tmp_path)
    assert r.returncode == 1 and "--pool ray needs Ray" in r.stderr, r.stderr


def round_lines(out):
    """The round lines without their times."""
    return [re.sub(r" +[\d.]+ s ", " ", line) for line in out.splitlines()
            if line.startswith("round ")]


def test_pbt_solves_cartpole_and_reads_the_board_back(gym, tmp_path):
    r = run(PBT, ["--env", "CartPole-v1", "--learners", "3"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"solved in round \d+ .* averages 500\.0 on 100 new start states", r.stdout), r.stdout
    for i in range(3):
        assert re.search(r"^  L%d  round +\d+  score" % i, r.stdout, re.M), r.stdout
    assert "best score of the run: 500.0" in r.stdout


def test_pbt_exploits_and_is_deterministic_on_either_pool(gym, tmp_path):
    common = ["--env", "Pendulum-v1", "--rounds", "3", "--learners", "4", "--seed", "1"]
    a = run(PBT, common + ["--pool", "fiber"], tmp_path)
    b = run(PBT, common + ["--pool", "multiprocessing"], tmp_path)
    assert a.returncode == 1 and b.returncode == 1, a.stdout + a.stderr + b.stdout + b.stderr
    ra, rb = round_lines(a.stdout), round_lines(b.stdout)
    assert len(ra) == 3 and ra == rb, (ra, rb)
    m = re.search(r"^(\d+) exploit steps", a.stdout, re.M)
    assert m and int(m.group(1)) >= 1 and "*" in "".join(ra[1:]), a.stdout


@pytest.mark.parametrize("requeue", [False, True])
def test_a_run_stopped_by_the_cluster_and_restarted_ends_identically(gym, tmp_path, requeue):
    """SIGTERM (the cluster's stop) once iteration 3 is reported: the stop
    callback saves and the run exits 3; restarted with FIBER_RESUMED=1 (as
    `fiber run --requeue` restarts it) it continues from its checkpoint and
    ends with the same policy, bit for bit, as a run never stopped.  With
    requeue, as a master of `fiber run --requeue` (FIBER_BOOT_REQUEUE=1):
    it ends with 75 right after the callback, mid-iteration."""
    import signal
    import time
    common = ["--env", "CartPole-v1", "--seed", "3", "--pool", "fiber", "--workers", "2",
              "--target", "1e9", "--eval-every", "0", "--test-episodes", "0",
              "--iterations", "12"]
    full = run(ES, common + ["--checkpoint", "full.pkl"], tmp_path)
    assert full.returncode == 1 and "not reached in 12 iterations" in full.stdout, \
        full.stdout + full.stderr

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PKG] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("FIBER_RESUMED", None)
    env.pop("SLURM_RESTART_COUNT", None)
    if requeue:
        env["FIBER_BOOT_REQUEUE"] = "1"
    proc = subprocess.Popen([sys.executable, ES] + common + ["--checkpoint", "stop.pkl"],
                            cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("iter    3 "):
            proc.send_signal(signal.SIGTERM)
            break
    rest, _ = proc.communicate(timeout=120)
    out = "".join(seen) + rest
    assert proc.returncode == (75 if requeue else 3), out
    # Either the stop callback saved (on fiber's stop thread), or the loop
    # saw fiber.stop_requested() first and saved between iterations (on a
    # loaded machine the stop thread can be that late; the guard is then
    # disarmed, the callback saves nothing, and a requeued master still
    # ends with 75 once it has run).  At least one of them saved.
    cb = re.search(r"es: stop requested \(signal 15\): saved iteration (\d+)", out)
    loop = re.search(r"stopped by signal 15 after iteration (\d+)", out)
    assert cb or loop, out
    for m in (cb, loop):
        assert not m or 3 <= int(m.group(1)) < 12, out
    if not requeue:
        assert loop, out
        assert load(tmp_path / "stop.pkl")["iteration"] == int(loop.group(1))
    m = re.match(r"(\d+)", str(load(tmp_path / "stop.pkl")["iteration"]))  # resumed from

    env.pop("FIBER_BOOT_REQUEUE", None)
    env["FIBER_RESUMED"] = "1"
    again = subprocess.run([sys.executable, ES] + common + ["--checkpoint", "stop.pkl"],
                           cwd=str(tmp_path), env=env, capture_output=True, text=True,
                           timeout=180)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "resumed stop.pkl at iteration %s" % m.group(1) in again.stdout, again.stdout
    a, b = load(tmp_path / "full.pkl"), load(tmp_path / "stop.pkl")
    assert a["iteration"] == b["iteration"] == 12
    for key in ("theta", "adam_m", "adam_v"):
        assert a[key].tobytes() == b[key].tobytes(), key


def test_resume_alone_needs_a_checkpoint(gym, tmp_path):
    r = run(ES, ["--env", "CartPole-v1", "--resume", "--iterations", "1"], tmp_path)
    assert r.returncode == 2 and "--resume without a file needs --checkpoint FILE" in r.stderr, \
        r.stdout + r.stderr


def test_top_pairs_keeps_the_pairs_with_the_best_episode():
    sys.path.insert(0, os.path.dirname(ES))
    try:
        import es_train
    finally:
        sys.path.remove(os.path.dirname(ES))
    import numpy as np
    fitness = np.array([[1.0, 5.0], [3.0, 2.0], [4.0, 0.0], [0.0, 0.0], [4.0, -1.0]])
    assert es_train.top_pairs(fitness, 2).tolist() == [0, 2]      # 5, then the first 4
    assert es_train.top_pairs(fitness, 3).tolist() == [0, 2, 4]
    assert es_train.top_pairs(fitness, 0).tolist() == [0, 1, 2, 3, 4]
    assert es_train.top_pairs(fitness, 9).tolist() == [0, 1, 2, 3, 4]


def test_an_ars_run_resumed_continues_identically(gym, tmp_path):
    """--update ars --top: Mania et al.'s step on the best pairs; stopped
    after 2 iterations and resumed, it ends where an uninterrupted run does."""
    common = ["--env", "CartPole-v1", "--seed", "4", "--pool", "fiber", "--workers", "2",
              "--update", "ars", "--top", "6", "--sigma", "0.2", "--lr", "0.1",
              "--target", "1e9", "--eval-every", "0", "--test-episodes", "0"]
    full = run(ES, common + ["--iterations", "5", "--checkpoint", "full.pkl"], tmp_path)
    assert full.returncode == 1, full.stdout + full.stderr
    assert "16 mirrored pairs per iteration (top 6 step), update ars" in full.stdout, full.stdout
    part = run(ES, common + ["--iterations", "2", "--checkpoint", "part.pkl"], tmp_path)
    assert part.returncode == 1, part.stdout + part.stderr
    again = run(ES, ["--resume", "part.pkl", "--checkpoint", "part.pkl", "--iterations", "5",
                     "--workers", "1", "--target", "1e9", "--eval-every", "0",
                     "--test-episodes", "0"], tmp_path)
    assert again.returncode == 1 and "resumed part.pkl at iteration 2" in again.stdout, \
        again.stdout + again.stderr
    a, b = load(tmp_path / "full.pkl"), load(tmp_path / "part.pkl")
    assert a["iteration"] == b["iteration"] == 5
    assert a["theta"].tobytes() == b["theta"].tobytes()
    assert a["config"]["update"] == b["config"]["update"] == "ars"
    assert a["config"]["top"] == b["config"]["top"] == 6
    # the step moved the policy: the run is not a no-op
    assert a["theta"].any()

    r = run(ES, ["--resume", "part.pkl", "--top", "3"], tmp_path)
    assert r.returncode == 2 and "--top 3 differs from the checkpoint's 6" in r.stderr, r.stderr
    r = run(ES, ["--env", "CartPole-v1", "--top", "17", "--iterations", "1"], tmp_path)
    assert r.returncode == 2 and "--top 17 must be between 0 (all pairs) and --pairs 16" in r.stderr, \
        r.stderr


def test_a_bipedal_episode_is_a_function_of_its_seed(gym):
    """A reused BipedalWalker-v3 replays a seed into another episode once
    it has run others; es_worker gives it a new instance per episode, so a
    pair scores the same whatever the worker ran before."""
    if importlib.util.find_spec("Box2D") is None:
        pytest.skip("Box2D is not installed (gymnasium[box2d]; scripts/examples-env.sh)")
    import numpy as np
    sys.path.insert(0, os.path.dirname(ES))
    try:
        import es_worker as W
    finally:
        sys.path.remove(os.path.dirname(ES))
    W.init_worker(12345, 2 ** 16)
    policy = W.Policy(24, 4, (), False, [-1.0] * 4, [1.0] * 4)
    theta = np.random.default_rng(0).standard_normal(96).astype(np.float32)
    obs = (np.zeros(24, np.float32), np.ones(24, np.float32))

    def task(pairs):
        return ("BipedalWalker-v3", policy.spec(), theta) + obs + (np.float32(0.5), pairs)

    first = W.train_task(task([(10, 5)]))[0]
    W.train_task(task([(99, 7), (50, 8)]))
    again = W.train_task(task([(10, 5)]))[0]
    assert first[:4] == again[:4]
    assert first[4].tobytes() == again[4].tobytes()
