"""fiber.gym.VectorEnv against gymnasium's AsyncVectorEnv, same run.

    build/venv/bin/python bench/python/bench_vecenv.py [--envs 2,8,32]
        [--steps 2000] [--env CartPole-v1]

For each count of sub-environments: build the vector, reset it, step it
`--steps` times with random actions (one untimed warm-up of 50 steps),
and report env-steps per second (steps x sub-environments / seconds),
for fiber's vector (each sub-environment a fiber job, local backend by
default; FIBER_BACKEND picks another) and AsyncVectorEnv (multiprocessing,
shared memory), and the ratio.  Last line: one JSON object, AsyncVectorEnv
under "peer".
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))  # the package, in place

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

from fiber.gym import VectorEnv  # noqa: E402

ENV = "CartPole-v1"


def make():
    return gym.make(ENV)


def rate(envs, steps, n):
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    acts = [envs.action_space.sample() for _ in range(64)]
    for k in range(50):
        envs.step(acts[k % 64])
    t0 = time.perf_counter()
    for k in range(steps):
        envs.step(acts[k % 64])
    took = time.perf_counter() - t0
    envs.close()
    del rng
    return steps * n / took


def main():
    global ENV
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", default="2,8,32")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--env", default=ENV)
    a = ap.parse_args()
    ENV = a.env
    out = {"env": ENV, "steps": a.steps, "fiber": {}, "peer": {"async": {}},
           "ratio": {}}
    for n in [int(x) for x in a.envs.split(",")]:
        f = rate(VectorEnv([make] * n), a.steps, n)
        m = rate(gym.vector.AsyncVectorEnv([make] * n), a.steps, n)
        print("%s x %d: fiber %.0f env-steps/s, AsyncVectorEnv %.0f: %.2fx"
              % (ENV, n, f, m, f / m), flush=True)
        out["fiber"][n] = round(f)
        out["peer"]["async"][n] = round(m)
        out["ratio"][n] = round(f / m, 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
