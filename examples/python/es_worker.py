"""What a pool worker of the ES examples runs (es.py, pbt.py): the shared
noise table, the policies, the gymnasium environments and the rollouts.

A worker imports this module by name (it is on the master's sys.path, and
on Ray's workers through PYTHONPATH), so the globals the pool initializer
sets (the noise table, the environments already made) stay in the worker
and serve every task it runs.

Tasks are plain tuples of numpy arrays and numbers; results are returned
in the order of the task's records, so the master's merge does not depend
on which worker ran what.
"""
import numpy as np

NOISE = None       # the worker's noise table, set by init_worker
NOISE_KEY = None   # (seed, size) the table was built from
ENVS = {}          # environment name -> the worker's instance

OBS_CLIP = 5.0     # normalised observations are clipped to +-OBS_CLIP

# What an environment needs beyond gymnasium itself, for the error that
# names it.
EXTRA_PACKAGE = {
    "BipedalWalker": "gymnasium[box2d]",
    "LunarLander": "gymnasium[box2d]",
    "CarRacing": "gymnasium[box2d]",
    "Hopper": "gymnasium[mujoco]",
    "Humanoid": "gymnasium[mujoco]",
    "HalfCheetah": "gymnasium[mujoco]",
    "Walker2d": "gymnasium[mujoco]",
    "Ant": "gymnasium[mujoco]",
    "Swimmer": "gymnasium[mujoco]",
}


class EnvError(RuntimeError):
    """An environment cannot be made here: its message says why and what
    to install."""


def noise_table(seed, size):
    """The shared noise table: `size` standard normal float32s from `seed`.
    Every worker and the master build the same table from the same seed,
    so a perturbation travels as an offset into it."""
    return np.random.default_rng(seed).standard_normal(size, dtype=np.float32)


def init_worker(noise_seed, noise_size):
    """The pool initializer: builds this worker's noise table once."""
    global NOISE, NOISE_KEY
    if NOISE_KEY != (noise_seed, noise_size):
        NOISE = noise_table(noise_seed, noise_size)
        NOISE_KEY = (noise_seed, noise_size)


def _install_hint(name):
    for prefix, package in EXTRA_PACKAGE.items():
        if name.startswith(prefix):
            return package
    return None


def make_env(name):
    """gym.make(name), or EnvError naming the package to install."""
    try:
        import gymnasium as gym
    except ImportError:
        raise EnvError("the ES examples need gymnasium: pip install gymnasium "
                       "(or run scripts/examples-env.sh, which makes "
                       "build/venv-examples with every environment)") from None
    try:
        return gym.make(name)
    except gym.error.DependencyNotInstalled as e:
        package = _install_hint(name) or "the environment's dependencies"
        raise EnvError("%s needs %s: pip install \"%s\" (or run "
                       "scripts/examples-env.sh) [%s]"
                       % (name, package, package, str(e).strip())) from None
    except (gym.error.NameNotFound, gym.error.VersionNotFound,
            gym.error.UnregisteredEnv) as e:
        raise EnvError("unknown environment %r: %s" % (name, e)) from None
    except ImportError as e:
        package = _install_hint(name) or "its package"
        raise EnvError("%s needs %s: pip install \"%s\" [%s]"
                       % (name, package, package, e)) from None


# Environments whose reset(seed=s) does not give the same episode again
# once the instance has run other episodes: a reused BipedalWalker-v3
# (gymnasium 1.4.0) replays the same seed and actions into another
# trajectory, while a new instance replays it exactly (its Box2D world is
# made once and outlives reset; which of its state carries over we did not
# pin down).  They get a new instance per episode, so that an episode is a
# function of its seed whichever worker ran what before it.
FRESH_PER_EPISODE = ("BipedalWalker",)


def worker_env(name):
    env = ENVS.get(name)
    if env is None:
        env = ENVS[name] = make_env(name)
    return env


def episode_env(name):
    """The environment for the next episode: the worker's instance, or a
    new one for the FRESH_PER_EPISODE environments."""
    if name.startswith(FRESH_PER_EPISODE):
        old = ENVS.pop(name, None)
        if old is not None:
            old.close()
    return worker_env(name)


class Policy:
    """A deterministic policy over normalised observations, with its
    parameters in one flat float32 vector.

    hidden == () is Mania et al.'s linear policy a = W x (no bias); else an
    MLP with tanh hidden layers.  Discrete actions are the argmax of the
    outputs; continuous ones are clipped to the action box (linear) or
    tanh-squashed into it (MLP)."""

    def __init__(self, obs_dim, act_dim, hidden, discrete, low=None, high=None):
        self.obs_dim, self.act_dim = int(obs_dim), int(act_dim)
        self.hidden = tuple(int(h) for h in hidden)
        self.discrete = bool(discrete)
        self.low = None if low is None else np.asarray(low, np.float32)
        self.high = None if high is None else np.asarray(high, np.float32)
        sizes = (self.obs_dim,) + self.hidden + (self.act_dim,)
        self.shapes = []   # (rows, cols, has_bias) per layer
        for i in range(len(sizes) - 1):
            self.shapes.append((sizes[i + 1], sizes[i], bool(self.hidden)))
        self.num_params = sum(r * c + (r if b else 0) for r, c, b in self.shapes)

    def spec(self):
        """What rebuilds this policy elsewhere (a task, a checkpoint)."""
        return (self.obs_dim, self.act_dim, self.hidden, self.discrete,
                None if self.low is None else self.low.tolist(),
                None if self.high is None else self.high.tolist())

    @classmethod
    def from_spec(cls, spec):
        return cls(*spec)

    def layers(self, params):
        """Views of params as [(W, b or None)], one per layer."""
        out, at = [], 0
        for rows, cols, has_bias in self.shapes:
            w = params[at:at + rows * cols].reshape(rows, cols)
            at += rows * cols
            b = None
            if has_bias:
                b = params[at:at + rows]
                at += rows
            out.append((w, b))
        return out

    def initial(self, rng):
        """Initial parameters: zeros for the linear policy (as ARS), else
        Salimans et al.'s normalised-columns init (std 1, output 0.01)."""
        theta = np.zeros(self.num_params, np.float32)
        if not self.hidden:
            return theta
        at = 0
        for i, (rows, cols, _) in enumerate(self.shapes):
            std = 0.01 if i == len(self.shapes) - 1 else 1.0
            w = rng.standard_normal((rows, cols))
            w *= std / np.sqrt(np.square(w).sum(axis=1, keepdims=True))
            theta[at:at + rows * cols] = w.ravel()
            at += rows * cols + rows   # biases stay 0
        return theta

    def act(self, layers, x):
        last = len(layers) - 1
        for i, (w, b) in enumerate(layers):
            x = w @ x
            if b is not None:
                x = x + b
            if i < last:
                x = np.tanh(x)
        if self.discrete:
            return int(np.argmax(x))
        if self.hidden:
            return np.tanh(x) * self.high
        return np.clip(x, self.low, self.high)


def rollout(env, policy, params, mean, std, seed, collect):
    """One episode of `policy` with `params` from env.reset(seed=seed).
    Returns (return, length, obs_sum, obs_sumsq): the observation sums
    (float64) when collect, else None."""
    layers = policy.layers(params)
    obs, _ = env.reset(seed=int(seed))
    seen = [] if collect else None
    total, steps = 0.0, 0
    while True:
        if collect:
            seen.append(obs)
        x = np.clip((np.asarray(obs, np.float32) - mean) / std, -OBS_CLIP, OBS_CLIP)
        obs, reward, terminated, truncated, _ = env.step(policy.act(layers, x))
        total += float(reward)
        steps += 1
        if terminated or truncated:
            break
    if not collect:
        return total, steps, None, None
    o = np.asarray(seen, np.float64)
    return total, steps, o.sum(axis=0), np.square(o).sum(axis=0)


def _params(theta):
    """The policy's parameters: the array itself, or (on fiber) the
    ObjectRef it was put under, resolved once per worker and iteration."""
    get = getattr(theta, "get", None)
    return get() if get is not None and not isinstance(theta, np.ndarray) else theta


def train_task(task):
    """Evaluates mirrored pairs: task = (env_name, policy_spec, theta,
    mean, std, sigma, pairs) with pairs a list of (noise_offset, seed).
    Both episodes of a pair start from the same seed.  Returns one tuple
    per pair, in order: (return+, return-, length+, length-, obs_sum,
    obs_sumsq), the sums over both episodes."""
    env_name, spec, theta, mean, std, sigma, pairs = task
    theta = _params(theta)
    policy = Policy.from_spec(spec)
    dim = policy.num_params
    out = []
    for offset, seed in pairs:
        eps = NOISE[offset:offset + dim]
        rp, lp, sp, qp = rollout(episode_env(env_name), policy, theta + sigma * eps,
                                 mean, std, seed, True)
        rm, lm, sm, qm = rollout(episode_env(env_name), policy, theta - sigma * eps,
                                 mean, std, seed, True)
        out.append((rp, rm, lp, lm, sp + sm, qp + qm))
    return out


def eval_task(task):
    """Evaluates the unperturbed policy: task = (env_name, policy_spec,
    theta, mean, std, seeds).  Returns [(return, length)] in seed order;
    observation statistics are not collected."""
    env_name, spec, theta, mean, std, seeds = task
    theta = _params(theta)
    policy = Policy.from_spec(spec)
    return [rollout(episode_env(env_name), policy, theta, mean, std, s, False)[:2]
            for s in seeds]


def run_task(task):
    """The one function the pools map: ("train", ...) or ("eval", ...)."""
    kind, body = task
    if kind == "train":
        return train_task(body)
    if kind == "eval":
        return eval_task(body)
    raise ValueError("unknown ES task kind %r" % (kind,))
