"""fiber.gym.VectorEnv: gymnasium's vector-environment API with each
sub-environment in a fiber job, on whatever backend fiber is configured
for, and a vector that survives its sub-environments' crashes.

    import gymnasium as gym
    from fiber.gym import VectorEnv

    envs = VectorEnv([lambda: gym.make("CartPole-v1")] * 8)
    obs, info = envs.reset(seed=0)
    obs, reward, terminated, truncated, info = envs.step(actions)

It is a ``gymnasium.vector.VectorEnv``: ``reset``, ``step``, ``close``,
``call``, ``get_attr``, ``set_attr``, batched ``observation_space`` and
``action_space`` (as gymnasium batches identical spaces), and gymnasium's
default autoreset mode, NEXT_STEP: the step after a sub-environment's
episode ended resets it and returns its first observation with reward 0,
terminated and truncated False.

Survival: a sub-environment whose job dies (SIGKILL, a segfault, OOM) or
whose ``step``/``reset`` raises is rebuilt from its env_fn (in a new job,
or in the same job after an exception) and reset; the step that saw it go
reports that sub-environment's episode as truncated, with reward 0, the
first observation of the new episode, and in ``info`` the key
``"fiber_restarted"`` (True at that index) and ``"fiber_error"`` (why, a
string).  Each death is reported once, at the step that saw it.  A
sub-environment that cannot be rebuilt (its env_fn raises) fails the
call with RuntimeError naming it.  ``restarts`` counts the rebuilds.

Messages go over fiber pipes (a direct socket between the master and each
job once both ends are in use); a round of requests (a step, a reset) is
one call into the C core, _fiber.Pipe.exchange, which sends every
request before it reads any answer.  A step of a sub-environment whose
observation space is a ``Box`` and whose action space is a ``Discrete`` or
a ``Box`` travels unpickled: the action as its bytes, the answer as a
fixed header (reward, terminated, truncated), the observation's bytes
(written into the batch array: no pickling copy) and the info dict, which
alone is pickled, and only when it is not empty.  Everything else (reset,
call, a step of other spaces, a restart) is pickled with protocol 5.
"""
import pickle
import struct

import numpy as np

import gymnasium as gym
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from . import _fiber
from .process import Process
from .queues import Pipe

__all__ = ["VectorEnv"]

_DEAD = (EOFError, OSError, _fiber.FiberError)

# The unpickled step (see the module's doc).  A request is _STEP and the
# action's bytes; an answer is _OBS, _HEAD (reward, terminated, truncated),
# the observation's bytes, then the pickled info when it is not empty.
# Pickles start with 0x80, so either side tells the two kinds apart by
# the first byte.
_STEP = b"S"
_OBS = b"O"
_HEAD = struct.Struct("<d??")


class _Codec:
    """The unpickled step for one pair of spaces, or None when they are
    not a Box of observations and a Discrete or Box of actions."""

    def __init__(self, obs_space, act_space):
        self.obs_dtype = np.dtype(obs_space.dtype)
        self.obs_shape = tuple(obs_space.shape)
        self.obs_count = int(np.prod(self.obs_shape))
        self.obs_bytes = self.obs_count * self.obs_dtype.itemsize
        # A Discrete action is an int; a Box action, even of shape (), an
        # array of the space's dtype.
        self.discrete = isinstance(act_space, gym.spaces.Discrete)
        if self.discrete:
            self.act_dtype, self.act_shape = np.dtype("<i8"), ()
        else:
            self.act_dtype = np.dtype(act_space.dtype)
            self.act_shape = tuple(act_space.shape)

    @staticmethod
    def make(obs_space, act_space):
        if isinstance(obs_space, gym.spaces.Box) and isinstance(
                act_space, (gym.spaces.Discrete, gym.spaces.Box)):
            return _Codec(obs_space, act_space)
        return None

    def request(self, action):
        return _STEP + np.asarray(action, dtype=self.act_dtype).tobytes()

    def action(self, data):
        if self.discrete:
            return int.from_bytes(data[1:9], "little", signed=True)
        a = np.frombuffer(data, dtype=self.act_dtype, offset=1)
        return a.reshape(self.act_shape).copy()

    def answer(self, obs, reward, term, trunc, info):
        """The answer's bytes, or None when obs does not fit the space
        (then the step is answered pickled)."""
        obs = np.asarray(obs)
        if obs.dtype != self.obs_dtype or obs.shape != self.obs_shape:
            return None
        parts = [_OBS, _HEAD.pack(float(reward), bool(term), bool(trunc)),
                 np.ascontiguousarray(obs).tobytes()]
        if info:
            parts.append(pickle.dumps(info, protocol=5))
        return b"".join(parts)

    def read(self, data):
        """(obs, reward, terminated, truncated, info) of an answer; obs is
        a read-only view of data."""
        reward, term, trunc = _HEAD.unpack_from(data, 1)
        start = 1 + _HEAD.size
        end = start + self.obs_bytes
        obs = np.frombuffer(data, dtype=self.obs_dtype, count=self.obs_count,
                            offset=start).reshape(self.obs_shape)
        info = pickle.loads(memoryview(data)[end:]) if len(data) > end \
            else {}
        return obs, reward, term, trunc, info


def _worker(env_fn, conn):
    """A sub-environment's job: serves the master's commands until close."""
    env = env_fn()
    conn.send(("ready", env.observation_space, env.action_space,
               getattr(env, "metadata", {}), getattr(env, "render_mode",
                                                     None)))
    codec = _Codec.make(env.observation_space, env.action_space)
    ended = False            # the last step ended an episode: reset next
    pipe = conn._p           # the handle: no checks a message (ours only)
    while True:
        try:
            data = pipe.recv(-1)
        except _DEAD:       # the master went away or dropped the vector
            env.close()
            return
        if data[:1] == _STEP:
            cmd, arg = "step", codec.action(data)
        else:
            cmd, arg = pickle.loads(data)
        try:
            if cmd == "step":
                if ended:   # NEXT_STEP autoreset: this step only resets
                    obs, info = env.reset()
                    obs, reward, term, trunc = obs, 0.0, False, False
                else:
                    obs, reward, term, trunc, info = env.step(arg)
                ended = bool(term or trunc)
                out = codec.answer(obs, reward, term, trunc, info) \
                    if codec is not None else None
                if out is not None:
                    pipe.send(out, -1)
                else:
                    conn.send(("ok", (obs, float(reward), bool(term),
                                      bool(trunc), info)))
            elif cmd == "reset":
                seed, options = arg
                obs, info = env.reset(seed=seed, options=options)
                ended = False
                conn.send(("ok", (obs, info)))
            elif cmd == "call":
                name, args, kwargs = arg
                attr = getattr(env, name)
                conn.send(("ok", attr(*args, **kwargs) if callable(attr)
                           else attr))
            elif cmd == "get_attr":
                conn.send(("ok", getattr(env, arg)))
            elif cmd == "set_attr":
                setattr(env, arg[0], arg[1])
                conn.send(("ok", None))
            elif cmd == "close":
                env.close()
                conn.send(("ok", None))
                return
            else:
                conn.send(("bad", "unknown command %r" % (cmd,)))
        except Exception as e:      # the env raised: rebuild it here
            reason = "%s: %s" % (type(e).__name__, e)
            try:
                env.close()
            except Exception:
                pass
            env = env_fn()
            obs, info = env.reset()
            ended = False
            conn.send(("restarted", (obs, info, reason)))


class _Sub:
    """The master's side of one sub-environment."""

    def __init__(self, env_fn):
        self.env_fn = env_fn
        self.conn = None
        self.proc = None
        self.start()

    def start(self):
        mine, theirs = Pipe()
        self.proc = Process(target=_worker, args=(self.env_fn, theirs),
                            daemon=True)
        self.proc.start()
        self.conn = mine
        msg = self.conn.recv()
        if msg[0] != "ready":
            raise RuntimeError("a sub-environment's job answered %r at its "
                               "start" % (msg[0],))
        self.info = msg[1:]   # spaces, metadata, render mode
        self.codec = _Codec.make(msg[1], msg[2])

    def stop(self, kill=False):
        if self.proc is not None:
            if kill:
                self.proc.kill()
            self.proc.join(10)
            if self.proc.exitcode is None:
                self.proc.kill()
                self.proc.join(10)
        try:
            self.conn.close()
        except Exception:
            pass


class VectorEnv(gym.vector.VectorEnv):
    """gymnasium.vector.VectorEnv over fiber jobs (see the module's doc)."""

    def __init__(self, env_fns, copy=True):
        env_fns = list(env_fns)
        if not env_fns:
            raise ValueError("fiber.gym.VectorEnv needs at least one env_fn")
        for i, fn in enumerate(env_fns):
            if not callable(fn):
                raise TypeError("env_fns[%d] is not callable: %r" % (i, fn))
        self.num_envs = len(env_fns)
        self.copy = copy
        self.restarts = 0
        self._subs = []
        try:
            for fn in env_fns:
                self._subs.append(_Sub(fn))
            obs_space, act_space, metadata, render_mode = self._subs[0].info
        except BaseException:
            self._close_subs(kill=True)
            raise
        self.single_observation_space = obs_space
        self.single_action_space = act_space
        self.observation_space = batch_space(obs_space, self.num_envs)
        self.action_space = batch_space(act_space, self.num_envs)
        self.metadata = dict(metadata or {})
        self.metadata["autoreset_mode"] = gym.vector.AutoresetMode.NEXT_STEP
        self.render_mode = render_mode
        self._obs = create_empty_array(obs_space, n=self.num_envs,
                                       fn=np.zeros)
        # The unpickled step for the whole vector, when every
        # sub-environment has it (their spaces are the first one's).
        self._codec = self._subs[0].codec
        if self._codec is not None:
            if any(sub.codec is None for sub in self._subs):
                self._codec = None
            else:
                try:
                    self._obs_bytes = memoryview(self._obs).cast("B")
                except (TypeError, ValueError):  # a dtype memoryview
                    self._codec = None           # cannot cast: per answer
        self.closed = False

    @staticmethod
    def _answer(sub):
        kind, value = sub.conn.recv()
        if kind != "ok":
            raise RuntimeError("sub-environment: %s" % (value,))
        return value

    def _check(self):
        if self.closed:
            raise gym.error.ClosedEnvironmentError(
                "fiber.gym.VectorEnv: the vector is closed")

    def _revive(self, i, reason):
        """Sub-environment i's job died: a new job, reset; returns its
        (obs, info)."""
        sub = self._subs[i]
        sub.stop(kill=True)
        try:
            sub.start()
        except _DEAD as e:
            raise RuntimeError("sub-environment %d died (%s) and could not "
                               "be restarted: %s" % (i, reason, e)) from None
        sub.conn.send(("reset", (None, None)))
        kind, value = sub.conn.recv()
        if kind != "ok":
            raise RuntimeError("sub-environment %d died (%s) and its new "
                               "job's reset failed: %s" % (i, reason, value))
        self.restarts += 1
        return value

    def _died(self, i):
        sub = self._subs[i]
        code = sub.proc.exitcode if sub.proc is not None else None
        if code is None:
            sub.proc.join(1)
            code = sub.proc.exitcode
        return "its job ended (exit code %s)" % (code,)

    def _exchange(self, msgs, raw=False):
        """Sends msgs[i] to sub-environment i, all before any answer is
        read, then yields (i, value, None) for each answer, or (i, (obs,
        info), reason) for a sub-environment that died (restarted here in
        a new job) or raised (rebuilt in its own job): reason says why.
        The round is one call into the C core (Pipe.exchange): no Python
        runs between the messages.  With raw, an unpickled step's answer
        is yielded as its bytes (for step to read) instead of decoded."""
        answers = _fiber.Pipe.exchange(
            [sub.conn._p for sub in self._subs],
            [msg if isinstance(msg, bytes) else pickle.dumps(msg, protocol=5)
             for msg in msgs])
        for i, (sub, data) in enumerate(zip(self._subs, answers)):
            kind = value = None
            if data is not None:
                if data[:1] == _OBS:
                    kind, value = "ok", data if raw else sub.codec.read(data)
                else:
                    kind, value = pickle.loads(data)
            if kind is None:
                reason = self._died(i)
                yield i, self._revive(i, reason), reason
            elif kind == "restarted":
                obs, info, reason = value
                self.restarts += 1
                yield i, (obs, info), reason
            elif kind != "ok":
                raise RuntimeError("sub-environment %d: %s" % (i, value))
            else:
                yield i, value, None

    def reset(self, *, seed=None, options=None):
        self._check()
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i
                     for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError("reset(seed=...) wants %d seeds, got %d"
                                 % (self.num_envs, len(seeds)))
        if seed is not None:
            self._np_random, self._np_random_seed = \
                gym.utils.seeding.np_random(seeds[0])
        results, infos = [], {}
        for i, value, reason in self._exchange(
                [("reset", (seed_i, options)) for seed_i in seeds]):
            obs, info = value
            if reason is not None:
                info = dict(info, fiber_restarted=True, fiber_error=reason)
            results.append(obs)
            infos = self._add_info(infos, info, i)
        self._obs = concatenate(self.single_observation_space, results,
                                self._obs)
        if self._codec is not None:   # (concatenate fills self._obs in place)
            self._obs_bytes = memoryview(self._obs).cast("B")
        return (self._copy(self._obs), infos)

    def step(self, actions):
        self._check()
        n = self.num_envs
        codec = self._codec
        if codec is not None:   # the unpickled step (see the module's doc)
            acts = np.asarray(actions, dtype=codec.act_dtype)
            if acts.ndim and acts.shape[0] != n:
                raise ValueError("step() wants %d actions, got %d"
                                 % (n, acts.shape[0]))
            if acts.shape != (n,) + codec.act_shape:
                raise ValueError("step() wants %d actions of shape %s, got "
                                 "an array of shape %s" % (
                                     n, codec.act_shape, acts.shape))
            flat = np.ascontiguousarray(acts).tobytes()
            size = len(flat) // n
            msgs = [_STEP + flat[i * size:(i + 1) * size] for i in range(n)]
        else:
            actions = list(gym.vector.utils.iterate(self.action_space,
                                                    actions))
            if len(actions) != n:
                raise ValueError("step() wants %d actions, got %d"
                                 % (n, len(actions)))
            msgs = [sub.codec.request(action) if sub.codec is not None
                    else ("step", action)
                    for sub, action in zip(self._subs, actions)]
        rewards = np.zeros(n, dtype=np.float64)
        terms = np.zeros(n, dtype=np.bool_)
        truncs = np.zeros(n, dtype=np.bool_)
        infos = {}
        obs_list = [] if codec is None else None
        for i, value, reason in self._exchange(msgs, raw=codec is not None):
            if reason is not None:
                obs, info = value
                info = dict(info, fiber_restarted=True, fiber_error=reason)
                truncs[i] = True
            elif codec is not None and type(value) is bytes:
                # An unpickled answer: its observation's bytes go straight
                # into the batch.
                rewards[i], terms[i], truncs[i] = _HEAD.unpack_from(value, 1)
                start = 1 + _HEAD.size
                end = start + codec.obs_bytes
                self._obs_bytes[i * codec.obs_bytes:
                                (i + 1) * codec.obs_bytes] = value[start:end]
                if len(value) > end:
                    infos = self._add_info(
                        infos, pickle.loads(memoryview(value)[end:]), i)
                continue
            else:
                obs, rewards[i], terms[i], truncs[i], info = value
            if obs_list is None:
                self._obs[i] = obs
            else:
                obs_list.append(obs)
            infos = self._add_info(infos, info, i)
        if obs_list is not None:
            self._obs = concatenate(self.single_observation_space, obs_list,
                                    self._obs)
        return (self._copy(self._obs), rewards, terms, truncs, infos)

    def _copy(self, obs):
        if not self.copy:
            return obs
        if isinstance(obs, np.ndarray):
            return obs.copy()
        import copy
        return copy.deepcopy(obs)

    def _each(self, cmd, args):
        self._check()
        for sub, arg in zip(self._subs, args):
            sub.conn.send((cmd, arg))
        return tuple(self._answer(sub) for sub in self._subs)

    def call(self, name, *args, **kwargs):
        """env.<name>(*args, **kwargs) in each sub-environment (or the
        attribute's value if it is not callable); a tuple."""
        return self._each("call", [(name, args, kwargs)] * self.num_envs)

    def get_attr(self, name):
        return self._each("get_attr", [name] * self.num_envs)

    def set_attr(self, name, values):
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError("set_attr wants %d values, got %d"
                             % (self.num_envs, len(values)))
        self._each("set_attr", [(name, v) for v in values])

    def _close_subs(self, kill=False):
        for sub in self._subs:
            if not kill:
                try:
                    sub.conn.send(("close", None))
                    sub.conn.recv()
                except _DEAD:
                    pass
            sub.stop(kill=kill)
        self._subs = []

    def close_extras(self, **kwargs):
        self._close_subs()

    def close(self, **kwargs):
        if getattr(self, "closed", True):
            return
        self.close_extras(**kwargs)
        self.closed = True
