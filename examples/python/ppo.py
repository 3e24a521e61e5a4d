"""PPO over fiber.gym.VectorEnv: each environment a fiber job.

    PYTHONPATH=python build/venv/bin/python examples/python/ppo.py \\
        [--env CartPole-v1] [--envs 8] [--steps N] [--updates N]
        [--epochs N] [--minibatch N] [--lr X] [--ent-coef X] [--seed 0]
        [--minutes M] [--checkpoint FILE] [--resume] [--plot FILE.png]
        [--vector fiber|async|sync]

Proximal policy optimisation (clipped objective, GAE) with two small
tanh MLPs (policy and value, 64x64) written in numpy, gradients by hand,
Adam, the learning rate annealed linearly to zero over --updates.  One
progress line per update.  At the end it evaluates the greedy policy on
20 episodes from starts it never trained on and prints their mean return.

Discrete action spaces (CartPole-v1): a softmax policy.  Defaults:
--steps 128 per environment, --updates 150, --epochs 4, --minibatch 256,
--lr 2.5e-3, --ent-coef 0.01; observations and rewards as they come.

Box action spaces (Hopper-v5, Pendulum-v1): a diagonal Gaussian policy,
its mean the MLP's linear output and its log standard deviation a vector
of its own (starting at -0.5) trained by the same Adam.  The sampled
action is clipped to the space's bounds only when sent to the
environment; its log-probability is that of the unclipped sample.  The
greedy policy is the mean, clipped.  Observations are normalised by their
running mean and variance (clipped to +-10) and rewards divided by the
running standard deviation of the discounted return (clipped to +-10).
Defaults (the usual MuJoCo ones): --steps 2048/--envs per environment
(2048 steps per update), --updates 500 (1,024,000 steps), --epochs 10,
--minibatch 64, --lr 3e-4, --ent-coef 0.  Flags given override them.

--minutes M ends the training after the first update that finishes past
M minutes of this process's wall time (the learning rate still anneals
over --updates).

--checkpoint FILE saves the networks, Adam's moments, the random
generator and the normalisers' statistics after every update; --resume
continues from it.  The environments cannot be saved, so a resumed run
resets them with a seed derived from the update it resumes at; to make a
stop and resume give the same run as one that never stopped, every update
starts from freshly seeded environments when --checkpoint is given
(episodes then never span two updates: with the Box defaults and 8
environments an episode lasts at most 256 steps, a short one for Hopper,
whose episodes run to 1000).  --vector picks the vector (fiber's,
gymnasium's AsyncVectorEnv or SyncVectorEnv) to compare them on the same
training.
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
LOG_2PI = float(np.log(2.0 * np.pi))

# The defaults the flags left at None take, by the action space's kind.
DISCRETE = {"steps": 128, "updates": 150, "epochs": 4, "minibatch": 256,
            "lr": 2.5e-3, "ent_coef": 0.01}
BOX = {"steps": None, "updates": 500, "epochs": 10, "minibatch": 64,
       "lr": 3e-4, "ent_coef": 0.0}     # steps: 2048 // --envs


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


# ---- the diagonal Gaussian policy ---------------------------------------

def gaussian_logp(mu, log_std, act):
    """log N(act; mu, diag(exp(log_std))^2), one value a row."""
    z = (act - mu) / np.exp(log_std)
    return (-0.5 * (z * z).sum(axis=1) - log_std.sum()
            - 0.5 * mu.shape[1] * LOG_2PI)


def gaussian_entropy(log_std):
    return float(log_std.sum() + 0.5 * len(log_std) * (1.0 + LOG_2PI))


def gaussian_loss(mu, log_std, act, old_logp, adv, clip, ent_coef):
    """PPO's policy loss for a Gaussian policy: minus the mean clipped
    surrogate, minus ent_coef times the entropy.  Returns the loss, its
    gradients with respect to mu (a row each) and log_std, the ratios and
    the entropy.  With z = (act - mu) / std:
        d logp / d mu      = z / std
        d logp / d log_std = z^2 - 1
        d entropy / d log_std = 1
    and d(-surrogate)/d logp = -adv * ratio / n where the unclipped term
    is the smaller one, 0 where the clipped one is."""
    std = np.exp(log_std)
    z = (act - mu) / std
    ratio = np.exp(gaussian_logp(mu, log_std, act) - old_logp)
    clipped = np.clip(ratio, 1 - clip, 1 + clip) * adv
    unclipped = ratio * adv <= clipped
    ent = gaussian_entropy(log_std)
    loss = -float(np.minimum(ratio * adv, clipped).mean()) - ent_coef * ent
    dlogp = np.where(unclipped, -adv * ratio, 0.0) / len(adv)
    dmu = dlogp[:, None] * z / std
    dlog_std = (dlogp[:, None] * (z * z - 1.0)).sum(axis=0) - ent_coef
    return loss, dmu, dlog_std, ratio, ent


class RunningStat:
    """Running mean and variance of the rows given to update (the
    pairwise merge of two samples' means and sums of squares)."""

    def __init__(self, shape):
        self.mean = np.zeros(shape)
        self.var = np.ones(shape)
        self.count = 1e-4

    def update(self, x):
        if len(x) == 0:
            return
        n = len(x)
        delta = x.mean(axis=0) - self.mean
        total = self.count + n
        m2 = (self.var * self.count + x.var(axis=0) * n
              + delta * delta * self.count * n / total)
        self.mean = self.mean + delta * n / total
        self.var = m2 / total
        self.count = total


# ---- PPO ----------------------------------------------------------------

class Agent:
    """space: the action space, Discrete (softmax policy) or Box (diagonal
    Gaussian policy, normalised observations, scaled rewards)."""

    def __init__(self, obs_dim, space, seed, lr):
        self.box = isinstance(space, gym.spaces.Box)
        out = space.shape[0] if self.box else int(space.n)
        rng = np.random.default_rng(seed)
        self.pi = mlp_init(rng, [obs_dim, 64, 64, out], 0.01)
        self.vf = mlp_init(rng, [obs_dim, 64, 64, 1], 1.0)
        # The policy's trained arrays: the MLP's, and log_std for a Box.
        self.pi_params = list(self.pi)
        if self.box:
            self.low = space.low.astype(np.float64)
            self.high = space.high.astype(np.float64)
            self.log_std = np.full(out, -0.5)
            self.pi_params.append(self.log_std)
            self.obs_stat = RunningStat(obs_dim)
            self.ret_stat = RunningStat(())
        self.pi_opt = Adam(self.pi_params, lr)
        self.vf_opt = Adam(self.vf, lr)
        self.rng = np.random.default_rng(seed + 1)

    def normalize(self, obs, learn):
        """obs as the networks see it; learn: first add it to the running
        statistics."""
        if not self.box:
            return obs
        if learn:
            self.obs_stat.update(obs)
        return np.clip((obs - self.obs_stat.mean)
                       / np.sqrt(self.obs_stat.var + 1e-8), -10.0, 10.0)

    def scale(self, r):
        """A reward as the value function learns it."""
        if not self.box:
            return r
        return np.clip(r / np.sqrt(self.ret_stat.var + 1e-8), -10.0, 10.0)

    def env_action(self, a):
        """The action the environment gets for the sampled a."""
        return np.clip(a, self.low, self.high) if self.box else a

    def act(self, obs):
        if self.box:
            mu, _ = mlp_forward(self.pi, obs)
            a = mu + np.exp(self.log_std) * self.rng.standard_normal(mu.shape)
            v, _ = mlp_forward(self.vf, obs)
            return a, gaussian_logp(mu, self.log_std, a), v[:, 0]
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
        """The action for one raw observation: the most probable one, or
        the Gaussian's mean clipped to the bounds."""
        out = mlp_forward(self.pi, self.normalize(obs[None], False))[0]
        if self.box:
            return self.env_action(out[0])
        return int(out.argmax())

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
                if self.box:
                    mu, acts = mlp_forward(self.pi, obs)
                    _, dmu, dlog_std, ratio, ent = gaussian_loss(
                        mu, self.log_std, act, b["logp"][idx], adv, clip,
                        ent_coef)
                    grads = mlp_backward(self.pi, acts, dmu) + [dlog_std]
                    self.pi_opt.step(self.pi_params, grads, lr)
                    self.fit_value(b, idx, obs, lr)
                    stats.append((float(np.mean(np.abs(ratio - 1) > clip)),
                                  ent))
                    continue
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
                self.pi_opt.step(self.pi_params,
                                 mlp_backward(self.pi, acts, dlogits), lr)
                self.fit_value(b, idx, obs, lr)
                stats.append((float(np.mean(np.abs(ratio - 1) > clip)),
                              float(ent.mean())))
        return np.mean(stats, axis=0)

    def fit_value(self, b, idx, obs, lr):
        v, vacts = mlp_forward(self.vf, obs)
        dv = (v[:, 0] - b["ret"][idx])[:, None] / len(idx)
        self.vf_opt.step(self.vf, mlp_backward(self.vf, vacts, dv), lr)

    # checkpoint: every array, in one .npz
    def state(self):
        out = {}
        for name, params, opt in (("pi", self.pi_params, self.pi_opt),
                                  ("vf", self.vf, self.vf_opt)):
            for i, p in enumerate(params):
                out["%s_p%d" % (name, i)] = p
                out["%s_m%d" % (name, i)] = opt.m[i]
                out["%s_v%d" % (name, i)] = opt.v[i]
            out[name + "_t"] = np.array(opt.t)
        if self.box:
            for name, st in (("obs", self.obs_stat), ("ret", self.ret_stat)):
                out[name + "_mean"] = np.asarray(st.mean)
                out[name + "_var"] = np.asarray(st.var)
                out[name + "_count"] = np.array(st.count)
        out["rng"] = np.frombuffer(json.dumps(
            self.rng.bit_generator.state).encode(), dtype=np.uint8)
        return out

    def load(self, z):
        for name, params, opt in (("pi", self.pi_params, self.pi_opt),
                                  ("vf", self.vf, self.vf_opt)):
            for i in range(len(params)):
                params[i][...] = z["%s_p%d" % (name, i)]
                opt.m[i][...] = z["%s_m%d" % (name, i)]
                opt.v[i][...] = z["%s_v%d" % (name, i)]
            opt.t = int(z[name + "_t"])
        if self.box:
            for name, st in (("obs", self.obs_stat), ("ret", self.ret_stat)):
                st.mean = z[name + "_mean"].copy()
                st.var = z[name + "_var"].copy()
                st.count = float(z[name + "_count"])
        self.rng.bit_generator.state = json.loads(bytes(z["rng"]).decode())


def collect(envs, agent, obs, ended, steps, gamma, lam):
    """steps vector steps; returns the batch, the next obs and end flags,
    and the returns of the episodes that finished."""
    n = envs.num_envs
    O, A, L, V, R, D, M = [], [], [], [], [], [], []
    finished, running = [], getattr(envs, "_ppo_running", np.zeros(n))
    disc = getattr(envs, "_ppo_disc", np.zeros(n))  # discounted, for scale
    for _ in range(steps):
        x = agent.normalize(obs, True)
        a, logp, v = agent.act(x)
        nobs, r, term, trunc, info = envs.step(agent.env_action(a))
        if agent.box:
            disc = disc * gamma + r
            agent.ret_stat.update(disc[~ended])
            disc = np.where(term | trunc, 0.0, disc)
        O.append(x), A.append(a), L.append(logp), V.append(v)
        R.append(agent.scale(r)), D.append(term | trunc)
        M.append(~ended)   # a step after an end only resets: not trained on
        running = np.where(ended, 0.0, running + r)
        for i in np.flatnonzero((term | trunc) & ~ended):
            finished.append(running[i])
        ended = term | trunc
        obs = nobs
    envs._ppo_running = running
    envs._ppo_disc = disc
    last_v = agent.value(agent.normalize(obs, False))
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
             "act": np.array(A).reshape((T * n,) + A[0].shape[1:])[mask],
             "logp": np.array(L).reshape(-1)[mask],
             "adv": adv.reshape(-1)[mask],
             "ret": ret.reshape(-1)[mask]}
    return batch, obs, ended, finished


def evaluate(agent, episodes=20, seed=10_000):
    """The greedy policy's mean return over episodes from seeds it never
    trained on (the normalisers frozen)."""
    env = gym.make(ENV)
    total = []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        done, ret = False, 0.0
        while not done:
            obs, r, term, trunc, _ = env.step(agent.greedy(obs))
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
    ap.add_argument("--steps", type=int,
                    help="per environment and update (see above)")
    ap.add_argument("--updates", type=int)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--minibatch", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--ent-coef", type=float)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--minutes", type=float,
                    help="end after the update that passes this wall time")
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
    space, ospace = envs.single_action_space, envs.single_observation_space
    if not isinstance(space, (gym.spaces.Discrete, gym.spaces.Box)) or \
            (isinstance(space, gym.spaces.Box) and len(space.shape) != 1):
        envs.close()
        sys.exit("ppo.py: %s's action space is %s; this example trains "
                 "Discrete and one-dimensional Box ones" % (ENV, space))
    if not isinstance(ospace, gym.spaces.Box) or len(ospace.shape) != 1:
        envs.close()
        sys.exit("ppo.py: %s's observation space is %s; this example needs "
                 "a one-dimensional Box" % (ENV, ospace))
    box = isinstance(space, gym.spaces.Box)
    for k, v in (BOX if box else DISCRETE).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.steps is None:
        a.steps = max(1, 2048 // a.envs)
    agent = Agent(ospace.shape[0], space, a.seed, a.lr)
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
            envs._ppo_disc = np.zeros(a.envs)
        frac = 1.0 - u / a.updates
        batch, obs, ended, finished = collect(envs, agent, obs, ended,
                                              a.steps, 0.99, 0.95)
        clipfrac, ent = agent.update(batch, a.epochs, a.minibatch, 0.2,
                                     a.ent_coef, a.lr * frac)
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
        if a.minutes is not None and time.time() - t0 >= a.minutes * 60:
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
        plt.title("PPO on %s, %d environments (%s)" % (
            ENV, a.envs, {"fiber": "fiber.gym.VectorEnv",
                          "async": "AsyncVectorEnv",
                          "sync": "SyncVectorEnv"}[a.vector]))
        plt.savefig(a.plot, dpi=80)
    return score


if __name__ == "__main__":
    main()
