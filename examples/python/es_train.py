"""The ES learner of the examples (Salimans et al. 2017, "Evolution
Strategies as a Scalable Alternative to Reinforcement Learning"), with the
pool left out: Trainer.tasks() says what to evaluate, the caller runs the
tasks on whatever pool it has (es.py: its own; pbt.py: the master's, for a
learner process), and Trainer.update() takes the results.

- mirrored sampling: each perturbation eps is evaluated as theta + sigma eps
  and theta - sigma eps, from the same start state;
- perturbations are offsets into the shared noise table (es_worker);
- fitness shaping by centered ranks over all 2n returns, and Adam with L2
  weight decay (update "es", Salimans et al.); or Mania et al. 2018's ARS
  V2-t step (update "ars", "Simple random search provides a competitive
  approach to reinforcement learning", arXiv:1803.07055): the raw fitness
  differences, a plain step lr / (b sigma_R) with sigma_R the standard
  deviation of the 2b fitnesses used;
- optionally only the top b pairs (by the better of their two fitnesses)
  make the step (cfg "top"; 0: all), as ARS V2-t does;
- observation normalisation: workers return each pair's observation sums,
  the master merges them (in pair order) after the iteration;
- the state (parameters, Adam, statistics, random stream, history) pickles
  whole, so a run resumed from a checkpoint continues bit for bit.
"""
import numpy as np

import es_worker as W

TRAIN, EVAL, TEST = 0, 1, 2   # seed streams: training, evaluation, final test


def episode_seed(run_seed, iteration, stream, index):
    """The start state of episode `index` of `stream` in `iteration`:
    training seeds are below 2**31, evaluation and test seeds above, so
    no evaluation starts where a training episode did."""
    word = np.random.SeedSequence([run_seed, iteration, stream, index]).generate_state(1)[0]
    word = int(word) & 0x7FFFFFFF
    return word if stream == TRAIN else word | 0x80000000


def centered_ranks(x):
    """Ranks of x's entries (ties in index order) mapped onto [-0.5, 0.5]."""
    flat = x.ravel()
    ranks = np.empty(flat.size, np.float64)
    ranks[np.argsort(flat, kind="stable")] = np.arange(flat.size, dtype=np.float64)
    if flat.size > 1:
        ranks /= flat.size - 1
    return (ranks - 0.5).reshape(x.shape)


def top_pairs(fitness, top):
    """Indices (ascending) of the `top` pairs whose better fitness is the
    highest (ties: the earlier pair); every pair when top is 0 or at least
    their number."""
    n = len(fitness)
    if not top or top >= n:
        return np.arange(n)
    best = fitness.max(axis=1)
    return np.sort(np.argsort(-best, kind="stable")[:top])


class ObsStats:
    """Running observation statistics: count, sum and sum of squares."""

    MIN_VAR = 1e-2   # std is at least 0.1 (Salimans et al.'s clip)

    def __init__(self, dim):
        self.count = 0.0
        self.sum = np.zeros(dim, np.float64)
        self.sumsq = np.zeros(dim, np.float64)

    def add(self, count, s, sq):
        self.count += count
        self.sum += s
        self.sumsq += sq

    def mean_std(self):
        """(mean, std) as float32, for the workers; (0, 1) before any data."""
        if self.count < 2:
            return (np.zeros_like(self.sum, np.float32), np.ones_like(self.sum, np.float32))
        mean = self.sum / self.count
        var = np.maximum(self.sumsq / self.count - np.square(mean), self.MIN_VAR)
        return mean.astype(np.float32), np.sqrt(var).astype(np.float32)

    def state(self):
        return (self.count, self.sum.copy(), self.sumsq.copy())

    def load(self, state):
        self.count, s, sq = state
        self.sum, self.sumsq = np.array(s, np.float64), np.array(sq, np.float64)


class Adam:
    """Adam (Kingma & Ba) on a flat parameter vector, minimising."""

    def __init__(self, dim, lr, beta1=0.9, beta2=0.999, eps=1e-8):
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.m = np.zeros(dim, np.float64)
        self.v = np.zeros(dim, np.float64)
        self.t = 0

    def step(self, grad):
        """The change to apply to the parameters for gradient grad."""
        self.t += 1
        a = self.lr * np.sqrt(1 - self.beta2 ** self.t) / (1 - self.beta1 ** self.t)
        self.m = self.beta1 * self.m + (1 - self.beta1) * grad
        self.v = self.beta2 * self.v + (1 - self.beta2) * np.square(grad)
        return -a * self.m / (np.sqrt(self.v) + self.eps)


class Trainer:
    """One ES learner.  cfg: a dict with env, seed, pairs, sigma, lr, l2,
    hidden (tuple; () = linear), alive_bonus, noise_seed, noise_size,
    eval_episodes, pairs_per_task, and optionally top (pairs kept for the
    step; 0 or absent: all) and update ("es", the default, or "ars").  env_info: (obs_dim, act_dim,
    discrete, low, high) of cfg["env"]."""

    def __init__(self, cfg, env_info, noise=None):
        self.cfg = dict(cfg)
        obs_dim, act_dim, discrete, low, high = env_info
        self.policy = W.Policy(obs_dim, act_dim, cfg["hidden"], discrete, low, high)
        self.noise = noise if noise is not None else W.noise_table(cfg["noise_seed"], cfg["noise_size"])
        if self.policy.num_params > self.noise.size:
            raise ValueError("the noise table (%d floats) is smaller than the policy (%d parameters)"
                             % (self.noise.size, self.policy.num_params))
        self.rng = np.random.default_rng([cfg["seed"], 0xE5])
        self.theta = self.policy.initial(self.rng).astype(np.float64)
        self.adam = Adam(self.policy.num_params, cfg["lr"])
        self.obs = ObsStats(obs_dim)
        self.iteration = 0       # iterations done
        self.timesteps = 0       # training steps done
        self.episodes = 0        # training episodes done
        self.history = []        # one dict per iteration
        self._pending = None

    # -- one iteration: tasks(), run them, update(results) -------------

    def tasks(self, evaluate):
        """The tasks of the next iteration: training pairs, then (when
        evaluate) the unperturbed policy on cfg["eval_episodes"] new start
        states, one task per episode."""
        cfg, dim = self.cfg, self.policy.num_params
        it = self.iteration + 1
        offsets = self.rng.integers(0, self.noise.size - dim + 1, size=cfg["pairs"])
        seeds = [episode_seed(cfg["seed"], it, TRAIN, j) for j in range(cfg["pairs"])]
        mean, std = self.obs.mean_std()
        theta = self.theta.astype(np.float32)
        spec = self.policy.spec()
        sigma = np.float32(cfg["sigma"])
        per = max(1, int(cfg["pairs_per_task"]))
        pairs = list(zip(offsets.tolist(), seeds))
        tasks = [("train", (cfg["env"], spec, theta, mean, std, sigma, pairs[i:i + per]))
                 for i in range(0, len(pairs), per)]
        n_eval = cfg["eval_episodes"] if evaluate else 0
        for k in range(n_eval):
            tasks.append(("eval", (cfg["env"], spec, theta, mean, std,
                                   [episode_seed(cfg["seed"], it, EVAL, k)])))
        self._pending = (offsets, len(tasks) - n_eval, n_eval)
        return tasks

    def update(self, results):
        """Applies the results of tasks() (in order); returns the
        iteration's record (returns, episodes, steps)."""
        offsets, n_train, n_eval = self._pending
        self._pending = None
        cfg, dim = self.cfg, self.policy.num_params
        pairs = [p for r in results[:n_train] for p in r]
        returns = np.array([(p[0], p[1]) for p in pairs], np.float64)
        lengths = np.array([(p[2], p[3]) for p in pairs], np.float64)
        fitness = returns - cfg["alive_bonus"] * lengths
        keep = top_pairs(fitness, cfg.get("top", 0))
        eps = np.stack([self.noise[offsets[k]:offsets[k] + dim] for k in keep]).astype(np.float64)
        self.step(fitness[keep], eps)
        for p in pairs:                       # pair order: deterministic
            self.obs.add(float(p[2] + p[3]), p[4], p[5])
        evals = [e for r in results[n_train:] for e in r]
        steps = int(lengths.sum())
        self.iteration += 1
        self.timesteps += steps
        self.episodes += returns.size
        rec = {"iteration": self.iteration,
               "mean": float(returns.mean()), "best": float(returns.max()),
               "eval": float(np.mean([e[0] for e in evals])) if evals else None,
               "episodes": int(returns.size + len(evals)),
               "steps": steps + int(sum(e[1] for e in evals)),
               "timesteps": self.timesteps}
        return rec

    def step(self, fitness, eps):
        """Moves theta along the pairs' perturbations eps (rows) by their
        fitnesses (rows of (f+, f-)).  The step size is self.adam.lr for
        either update (pbt.py changes it there)."""
        cfg = self.cfg
        if cfg.get("update", "es") == "ars":
            spread = fitness.std()
            if spread == 0:       # every episode scored the same: no direction
                return
            grad = (fitness[:, 0] - fitness[:, 1]) @ eps / (len(eps) * spread)
            self.theta += self.adam.lr * (grad - cfg["l2"] * self.theta)
            return
        shaped = centered_ranks(fitness)
        grad = (shaped[:, 0] - shaped[:, 1]) @ eps / len(eps)
        self.theta += self.adam.step(-grad + cfg["l2"] * self.theta)

    def test_tasks(self, episodes, stream=TEST):
        """Tasks scoring the current policy on `episodes` start states no
        training or evaluation episode used."""
        mean, std = self.obs.mean_std()
        theta = self.theta.astype(np.float32)
        return [("eval", (self.cfg["env"], self.policy.spec(), theta, mean, std,
                          [episode_seed(self.cfg["seed"], self.iteration, stream, k)]))
                for k in range(episodes)]

    # -- checkpoints ---------------------------------------------------

    def state(self):
        """Everything a resumed run needs, as plain picklable values."""
        return {"format": "fiber-es-1", "config": dict(self.cfg),
                "policy": self.policy.spec(),
                "theta": self.theta.copy(), "adam_m": self.adam.m.copy(),
                "adam_v": self.adam.v.copy(), "adam_t": self.adam.t,
                "adam_lr": self.adam.lr,
                "obs": self.obs.state(), "rng": self.rng.bit_generator.state,
                "iteration": self.iteration, "timesteps": self.timesteps,
                "episodes": self.episodes, "history": list(self.history)}

    def load(self, st):
        """Restores state() output (same policy shape)."""
        if st.get("format") != "fiber-es-1":
            raise ValueError("not an ES checkpoint (format %r)" % (st.get("format"),))
        if tuple(st["policy"][:3]) != tuple(self.policy.spec()[:3]):
            raise ValueError("the checkpoint's policy %r does not match %r"
                             % (st["policy"][:3], self.policy.spec()[:3]))
        self.theta = np.array(st["theta"], np.float64)
        self.adam.m, self.adam.v = np.array(st["adam_m"]), np.array(st["adam_v"])
        self.adam.t, self.adam.lr = int(st["adam_t"]), float(st["adam_lr"])
        self.cfg["sigma"] = float(st["config"]["sigma"])
        self.obs.load(st["obs"])
        self.rng.bit_generator.state = st["rng"]
        self.iteration, self.timesteps = int(st["iteration"]), int(st["timesteps"])
        self.episodes = int(st["episodes"])
        self.history = list(st["history"])
