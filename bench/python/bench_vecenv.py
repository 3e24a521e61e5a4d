"""fiber.gym.VectorEnv against gymnasium's AsyncVectorEnv, same run.

    build/venv/bin/python bench/python/bench_vecenv.py [--envs 2,8,32]
        [--steps 2000] [--env CartPole-v1]
    build/venv-examples/bin/python bench/python/bench_vecenv.py \
        --env Hopper-v5 --envs 8       # MuJoCo: make python-examples

For each count of sub-environments: build the vector, reset it, step it
`--steps` times with random actions (one untimed warm-up of 50 steps),
and report env-steps per second (steps x sub-environments / seconds),
for fiber's vector (each sub-environment a fiber job, local backend by
default; FIBER_BACKEND picks another) and AsyncVectorEnv (multiprocessing,
shared memory), and the ratio.  Last line: one JSON object, AsyncVectorEnv
under "peer".
"""
import argparse
import functools
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))  # the package, in place

import gymnasium as gym  # noqa: E402

from fiber.gym import VectorEnv  # noqa: E402

def rate(envs, steps, n):
    envs.reset(seed=0)
    envs.action_space.seed(0)
    acts = [envs.action_space.sample() for _ in range(64)]
    for k in range(50):
        envs.step(acts[k % 64])
    t0 = time.perf_counter()
    for k in range(steps):
        envs.step(acts[k % 64])
    took = time.perf_counter() - t0
    envs.close()
    return steps * n / took


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", default="2,8,32")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--env", default="CartPole-v1")
    a = ap.parse_args()
    # gym.make and the name pickle by reference: each job (and each
    # AsyncVectorEnv process) makes the environment itself.
    make = functools.partial(gym.make, a.env)
    out = {"env": a.env, "steps": a.steps, "fiber": {}, "peer": {"async": {}},
           "ratio": {}}
    for n in [int(x) for x in a.envs.split(",")]:
        f = rate(VectorEnv([make] * n), a.steps, n)
        m = rate(gym.vector.AsyncVectorEnv([make] * n), a.steps, n)
        print("%s x %d: fiber %.0f env-steps/s, AsyncVectorEnv %.0f: %.2fx"
              % (a.env, n, f, m, f / m), flush=True)
        out["fiber"][n] = round(f)
        out["peer"]["async"][n] = round(m)
        out["ratio"][n] = round(f / m, 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
