"""fiber.gym.VectorEnv against gymnasium's AsyncVectorEnv, same run.

    build/venv/bin/python bench/python/bench_vecenv.py [--envs 2,8,32]
        [--steps 2000] [--rounds 5] [--env CartPole-v1]
    build/venv-examples/bin/python bench/python/bench_vecenv.py \
        --env Hopper-v5 --envs 8       # MuJoCo: make python-examples

For each count of sub-environments: build both vectors, fiber's (each
sub-environment a fiber job, local backend by default; FIBER_BACKEND
picks another) and AsyncVectorEnv (multiprocessing, shared memory), reset
them and warm each up with 50 untimed steps.  Then `--rounds` rounds, each
stepping fiber's vector and then AsyncVectorEnv `--steps`/`--rounds` times
with random actions, so a slow spell of this (noisy, shared) machine falls
on both.  Reported: each one's median over the rounds of env-steps per
second (steps x sub-environments / seconds), and the ratio of the
medians.  Last line: one JSON object, AsyncVectorEnv under "peer", each
round's rates under "rounds".
"""
import argparse
import functools
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))  # the package, in place

import gymnasium as gym  # noqa: E402

from fiber.gym import VectorEnv  # noqa: E402

def warm(envs):
    envs.reset(seed=0)
    envs.action_space.seed(0)
    acts = [envs.action_space.sample() for _ in range(64)]
    for k in range(50):
        envs.step(acts[k % 64])
    return acts


def rate(envs, acts, steps, n):
    t0 = time.perf_counter()
    for k in range(steps):
        envs.step(acts[k % 64])
    return steps * n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", default="2,8,32")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    # gym.make and the name pickle by reference: each job (and each
    # AsyncVectorEnv process) makes the environment itself.
    make = functools.partial(gym.make, a.env)
    out = {"env": a.env, "steps": a.steps, "fiber": {}, "peer": {"async": {}},
           "ratio": {}, "rounds": {}}
    per_round = max(1, a.steps // a.rounds)
    for n in [int(x) for x in a.envs.split(",")]:
        ours = VectorEnv([make] * n)
        peer = gym.vector.AsyncVectorEnv([make] * n)
        try:
            acts_f, acts_m = warm(ours), warm(peer)
            fs, ms = [], []
            for _ in range(a.rounds):
                fs.append(rate(ours, acts_f, per_round, n))
                ms.append(rate(peer, acts_m, per_round, n))
        finally:
            ours.close()
            peer.close()
        f, m = statistics.median(fs), statistics.median(ms)
        print("%s x %d: fiber %.0f env-steps/s, AsyncVectorEnv %.0f: %.2fx "
              "(medians of %d rounds; fiber %.0f-%.0f, AsyncVectorEnv "
              "%.0f-%.0f)" % (a.env, n, f, m, f / m, a.rounds, min(fs),
                              max(fs), min(ms), max(ms)), flush=True)
        out["rounds"][n] = {"fiber": [round(x) for x in fs],
                            "async": [round(x) for x in ms]}
        out["fiber"][n] = round(f)
        out["peer"]["async"][n] = round(m)
        out["ratio"][n] = round(f / m, 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
