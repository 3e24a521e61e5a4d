"""PPO over fiber.gym.VectorEnv: each environment a fiber job.

    PYTHONPATH=python build/venv/bin/python examples/python/ppo.py \\
        [--env CartPole-v1] [--envs 8] [--steps 128] [--updates 150]
        [--seed 0] [--checkpoint FILE] [--resume] [--plot FILE.png]
        [--vector fiber|async|sync]

Proximal policy optimisation (clipped objective, GAE) with two small
tanh MLPs (policy and value) written in numpy, gradients by hand, Adam.
Discrete action spaces (CartPole); one progress line per update.  At the
end it evaluates the greedy policy on 20 episodes from starts it never
trained on and prints their mean return.

--checkpoint FILE saves the networks, Adam's moments and the random
generator after every update; --resume continues from it.  The
environments cannot be saved, so a resumed run resets them with a seed
derived from the update it resumes at; to make a stop and resume give the
same run as one that never stopped, every update starts from freshly
seeded environments when --checkpoint is given (episodes then never span
two updates).  --vector picks the vector (fiber's, gymnasium's
AsyncVectorEnv or SyncVectorEnv) to compare them on the same training.
"""
import argparse
import functools
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                "python"))

import gymnasium as gym  # noqa: E402

from fiber.gym import VectorEnv  # noqa: E402

ENV = "CartPole-v1"


# ---- a tanh MLP, by hand -----------------------------------------------

def mlp_init(rng, sizes, last_scale):
    params = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        scale = last_scale if i == len(sizes) - 2 else np.sqrt(2.0)
        w = rng.standard_normal((a, b)) / np.sqrt(a) * scale / np.sqrt(2.0)
        params += [w.astype(np.float64), np.zeros(b)]
    return params


def mlp_forward(params, x):
    acts = [x]
    h = x
    n = len(params) // 2
    for i in range(n):
        h = h @ params[2 * i] + params[2 * i + 1]
        if i < n - 1:
            h = np.tanh(h)
        acts.append(h)
    return h, acts


def mlp_backward(params, acts, dout):
    grads = [None] * len(params)
    n = len(params) // 2
    d = dout
    for i in reversed(range(n)):
        grads[2 * i] = acts[i].T @ d
        grads[2 * i + 1] = d.sum(axis=0)
        if i > 0:
            d = (d @ params[2 * i].T) * (1.0 - acts[i] ** 2)
    return grads


class Adam:
    def __init__(self, params, lr):
        self.lr = lr
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.t = 0

    def step(self, params, grads, lr=None, max_norm=0.5):
        norm = np.sqrt(sum(float((g * g).sum()) for g in grads))
        if norm > max_norm:
            grads = [g * (max_norm / norm) for g in grads]
        self.t += 1
        lr = self.lr if lr is None else lr
        for p, g, m, v in zip(params, grads, self.m, self.v):
            m *= 0.9
            m += 0.1 * g
            v *= 0.999
            v += 0.001 * g * g
            mhat = m / (1 - 0.9 ** self.t)
            vhat = v / (1 - 0.999 ** self.t)
            p -= lr * mhat / (np.sqrt(vhat) + 1e-5)


def softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


# ---- PPO ----------------------------------------------------------------

class Agent:
    def __init__(self, obs_dim, n_actions, seed, lr):
        rng = np.random.default_rng(seed)
        self.pi = mlp_init(rng, [obs_dim, 64, 64, n_actions], 0.01)
        self.vf = mlp_init(rng, [obs_dim, 64, 64, 1], 1.0)
        self.pi_opt = Adam(self.pi, lr)
        self.vf_opt = Adam(self.vf, lr)
        self.rng = np.random.default_rng(seed + 1)

    def act(self, obs):
        logits, _ = mlp_forward(self.pi, obs)
        p = softmax(logits)
        u = self.rng.random(len(p))[:, None]
        a = (p.cumsum(axis=1) < u).sum(axis=1)
        a = np.minimum(a, p.shape[1] - 1)
        logp = np.log(p[np.arange(len(a)), a] + 1e-12)
        v, _ = mlp_forward(self.vf, obs)
        return a, logp, v[:, 0]

    def value(self, obs):
        return mlp_forward(self.vf, obs)[0][:, 0]

    def greedy(self, obs):
        return mlp_forward(self.pi, obs[None])[0].argmax()

    def update(self, b, epochs, minibatch, clip, ent_coef, lr):
        n = len(b["obs"])
        stats = []
        for _ in range(epochs):
            order = self.rng.permutation(n)
            for s in range(0, n, minibatch):
                idx = order[s:s + minibatch]
                obs, act = b["obs"][idx], b["act"][idx]
                adv = b["adv"][idx]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                logits, acts = mlp_forward(self.pi, obs)
                p = softmax(logits)
                logp_all = np.log(p + 1e-12)
                logp = logp_all[np.arange(len(act)), act]
                ratio = np.exp(logp - b["logp"][idx])
                unclipped = (ratio * adv <= np.clip(ratio, 1 - clip,
                                                    1 + clip) * adv)
                # d(-surrogate)/dlogp, then through the softmax.
                dlogp = np.where(unclipped, -adv * ratio, 0.0) / len(idx)
                onehot = np.zeros_like(p)
                onehot[np.arange(len(act)), act] = 1.0
                dlogits = dlogp[:, None] * (onehot - p)
                ent = -(p * logp_all).sum(axis=1)
                dlogits += ent_coef * p * (logp_all + ent[:, None]) / len(idx)
                self.pi_opt.step(self.pi, mlp_backward(self.pi, acts,
                                                       dlogits), lr)
                v, vacts = mlp_forward(self.vf, obs)
                dv = (v[:, 0] - b["ret"][idx])[:, None] / len(idx)
                self.vf_opt.step(self.vf, mlp_backward(self.vf, vacts, dv),
                                 lr)
                stats.append((float(np.mean(np.abs(ratio - 1) > clip)),
                              float(ent.mean())))
        return np.mean(stats, axis=0)

    # checkpoint: every array, in one .npz
    def state(self):
        out = {}
        for name, params, opt in (("pi", self.pi, self.pi_opt),
                                  ("vf", self.vf, self.vf_opt)):
            for i, p in enumerate(params):
                out["%s_p%d" % (name, i)] = p
                out["%s_m%d" % (name, i)] = opt.m[i]
                out["%s_v%d" % (name, i)] = opt.v[i]
            out[name + "_t"] = np.array(opt.t)
        out["rng"] = np.frombuffer(json.dumps(
            self.rng.bit_generator.state).encode(), dtype=np.uint8)
        return out

    def load(self, z):
        for name, params, opt in (("pi", self.pi, self.pi_opt),
                                  ("vf", self.vf, self.vf_opt)):
            for i in range(len(params)):
                params[i][...] = z["%s_p%d" % (name, i)]
                opt.m[i][...] = z["%s_m%d" % (name, i)]
                opt.v[i][...] = z["%s_v%d" % (name, i)]
            opt.t = int(z[name + "_t"])
        self.rng.bit_generator.state = json.loads(bytes(z["rng"]).decode())


def collect(envs, agent, obs, ended, steps, gamma, lam):
    """steps vector steps; returns the batch, the next obs and end flags,
    and the returns of the episodes that finished."""
    n = envs.num_envs
    O, A, L, V, R, D, M = [], [], [], [], [], [], []
    finished, running = [], getattr(envs, "_ppo_running", np.zeros(n))
    for _ in range(steps):
        a, logp, v = agent.act(obs)
        nobs, r, term, trunc, info = envs.step(a)
        O.append(obs), A.append(a), L.append(logp), V.append(v)
        R.append(r), D.append(term | trunc)
        M.append(~ended)   # a step after an end only resets: not trained on
        running = np.where(ended, 0.0, running + r)
        for i in np.flatnonzero((term | trunc) & ~ended):
            finished.append(running[i])
        ended = term | trunc
        obs = nobs
    envs._ppo_running = running
    last_v = agent.value(obs)
    V.append(last_v)
    T = steps
    adv = np.zeros((T, n))
    gae = np.zeros(n)
    for t in reversed(range(T)):
        nonterm = 1.0 - D[t]
        delta = R[t] + gamma * V[t + 1] * nonterm - V[t]
        gae = delta + gamma * lam * nonterm * gae
        gae = np.where(M[t], gae, 0.0)
        adv[t] = gae
    mask = np.array(M).reshape(-1)
    ret = adv + np.array(V[:-1])
    batch = {"obs": np.array(O).reshape(T * n, -1)[mask],
             "act": np.array(A).reshape(-1)[mask],
             "logp": np.array(L).reshape(-1)[mask],
             "adv": adv.reshape(-1)[mask],
             "ret": ret.reshape(-1)[mask]}
    return batch, obs, ended, finished


def evaluate(agent, episodes=20, seed=10_000):
    env = gym.make(ENV)
    total = []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        done, ret = False, 0.0
        while not done:
            obs, r, term, trunc, _ = env.step(int(agent.greedy(obs)))
            ret += r
            done = term or trunc
        total.append(ret)
    env.close()
    return float(np.mean(total))


def main(argv=None):
    global ENV
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default=ENV)
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--updates", type=int, default=150)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--minibatch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2.5e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=float, default=None,
                    help="stop once the last 20 episodes average this")
    ap.add_argument("--checkpoint")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--stop-after", type=int, default=None,
                    help="end after this many updates of this run")
    ap.add_argument("--plot")
    ap.add_argument("--vector", choices=["fiber", "async", "sync"],
                    default="fiber")
    a = ap.parse_args(argv)
    if a.resume and not a.checkpoint:
        ap.error("--resume needs --checkpoint")
    ENV = a.env
    cls = {"fiber": VectorEnv, "async": gym.vector.AsyncVectorEnv,
           "sync": gym.vector.SyncVectorEnv}[a.vector]
    # gym.make pickles by name: each job makes the environment itself.
    envs = cls([functools.partial(gym.make, ENV)] * a.envs)
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        envs.close()
        sys.exit("ppo.py: %s has a continuous action space; this example "
                 "trains discrete ones" % ENV)
    agent = Agent(envs.single_observation_space.shape[0],
                  int(envs.single_action_space.n), a.seed, a.lr)
    start = 0
    if a.resume and os.path.exists(a.checkpoint):
        with np.load(a.checkpoint) as z:
            agent.load(z)
            start = int(z["update"])
        print("resumed from %s at update %d" % (a.checkpoint, start),
              flush=True)
    obs, _ = envs.reset(seed=a.seed * 1000 + start)
    ended = np.zeros(a.envs, dtype=bool)
    recent, curve = [], []
    t0 = time.time()
    done_updates = 0
    for u in range(start, a.updates):
        if a.checkpoint and u > start:
            obs, _ = envs.reset(seed=a.seed * 1000 + u)
            ended[:] = False
            envs._ppo_running = np.zeros(a.envs)
        frac = 1.0 - u / a.updates
        batch, obs, ended, finished = collect(envs, agent, obs, ended,
                                              a.steps, 0.99, 0.95)
        clipfrac, ent = agent.update(batch, a.epochs, a.minibatch, 0.2,
                                     0.01, a.lr * frac)
        recent = (recent + finished)[-20:]
        mean = float(np.mean(recent)) if recent else 0.0
        curve.append((u + 1, (u + 1) * a.steps * a.envs, mean))
        print("update %4d  steps %7d  return(20) %6.1f  entropy %.3f  "
              "clip %.3f  %5.1f s" % (u + 1, (u + 1) * a.steps * a.envs,
                                      mean, ent, clipfrac,
                                      time.time() - t0), flush=True)
        if a.checkpoint:
            tmp = a.checkpoint + ".tmp"
            with open(tmp, "wb") as f:
                np.savez(f, update=np.array(u + 1), **agent.state())
            os.replace(tmp, a.checkpoint)
        done_updates += 1
        if a.stop_after and done_updates >= a.stop_after:
            break
        if a.target is not None and len(recent) == 20 and mean >= a.target:
            break
    envs.close()
    score = evaluate(agent)
    print("greedy policy on 20 unseen starts: mean return %.1f (%.1f s)"
          % (score, time.time() - t0), flush=True)
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        xs = [c[1] for c in curve]
        plt.plot(xs, [c[2] for c in curve])
        plt.xlabel("environment steps")
        plt.ylabel("mean return of the last 20 episodes")
        plt.title("PPO on %s, %d fiber environments" % (ENV, a.envs))
        plt.savefig(a.plot, dpi=100)
    return score


if __name__ == "__main__":
    main()
