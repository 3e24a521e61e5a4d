"""fiber.gym.VectorEnv: gymnasium's VectorEnv over fiber jobs, that
survives its sub-environments' deaths and exceptions."""
import functools
import os
import random
import signal

import pytest

import helpers

gym = pytest.importorskip("gymnasium")
np = pytest.importorskip("numpy")
from fiber.gym import VectorEnv  # noqa: E402


def test_steps_exactly_as_gymnasiums_sync_vector_env():
    """Same seeds, same actions: the same observations, rewards and ends,
    through episode ends (NEXT_STEP autoreset) included."""
    n = 3
    ours = VectorEnv([helpers.make_cartpole] * n)
    ref = gym.vector.SyncVectorEnv([helpers.make_cartpole] * n)
    try:
        assert ours.observation_space == ref.observation_space
        assert ours.action_space == ref.action_space
        assert ours.single_observation_space == ref.single_observation_space
        assert ours.metadata["autoreset_mode"] == \
            gym.vector.AutoresetMode.NEXT_STEP
        o1, _ = ours.reset(seed=11)
        o2, _ = ref.reset(seed=11)
        assert np.array_equal(o1, o2)
        rng = np.random.default_rng(0)
        ends = 0
        for _ in range(600):
            a = rng.integers(0, 2, size=n)
            got = ours.step(a)
            want = ref.step(a)
            for g, w in zip(got[:4], want[:4]):
                assert np.array_equal(g, w)
            ends += int(got[2].sum() + got[3].sum())
        assert ends > 0   # episodes ended and were reset
    finally:
        ours.close()
        ref.close()


@pytest.mark.parametrize("make", [
    helpers.make_pendulum,                                # Box actions
    helpers.make_scalar_pendulum,                         # Box of shape ()
    helpers.make_odd_cartpole,                            # obs not the space's dtype
    functools.partial(helpers.make_odd_cartpole, numpy_obs=True),  # info
], ids=["box_actions", "box_scalar_actions", "obs_of_another_dtype", "info_dicts"])
def test_every_space_and_answer_steps_as_the_sync_vector_env(make):
    """The unpickled step (Box observations, Discrete or Box actions) and
    its fall-backs give what SyncVectorEnv gives: observations, rewards,
    ends and infos."""
    n = 2
    ours = VectorEnv([make] * n)
    ref = gym.vector.SyncVectorEnv([make] * n)
    try:
        o1, _ = ours.reset(seed=5)
        o2, _ = ref.reset(seed=5)
        assert np.array_equal(o1, o2)
        ours.action_space.seed(3)
        for _ in range(250):
            a = ours.action_space.sample()
            got, want = ours.step(a), ref.step(a)
            for g, w in zip(got[:4], want[:4]):
                assert np.array_equal(g, w)
            assert got[0].dtype == want[0].dtype
            assert sorted(got[4]) == sorted(want[4])
            for key in want[4]:
                assert np.array_equal(got[4][key], want[4][key]), key
    finally:
        ours.close()
        ref.close()


@pytest.mark.local_only  # compares the jobs' pids with this host's
def test_call_get_attr_set_attr_and_close():
    envs = VectorEnv([helpers.make_pid_cartpole] * 2)
    try:
        pids = envs.call("pid")
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert envs.get_attr("explode") == (False, False)
        envs.set_attr("explode", [False, True])
        assert envs.get_attr("explode") == (False, True)
        with pytest.raises(ValueError):
            envs.set_attr("explode", [True])
        with pytest.raises(ValueError, match="wants 2 actions, got 3"):
            envs.step(np.zeros(3, dtype=np.int64))
        with pytest.raises(ValueError, match="wants 2 seeds, got 3"):
            envs.reset(seed=[1, 2, 3])
    finally:
        envs.close()
    with pytest.raises(gym.error.ClosedEnvironmentError):
        envs.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(ValueError):
        VectorEnv([])
    with pytest.raises(TypeError):
        VectorEnv([3])


@pytest.mark.local_only  # signals jobs by their pids on this host
def test_a_killed_sub_environment_is_restarted_and_reported_once():
    envs = VectorEnv([helpers.make_pid_cartpole] * 3)
    try:
        envs.reset(seed=0)
        victim = envs.call("pid")[1]
        os.kill(victim, signal.SIGKILL)
        obs, rew, term, trunc, info = envs.step(np.zeros(3, dtype=np.int64))
        assert obs.shape == (3, 4)
        assert trunc[1] and not term[1] and rew[1] == 0
        assert info["fiber_restarted"][1] and not info["fiber_restarted"][0]
        assert "exit code" in info["fiber_error"][1]
        assert envs.restarts == 1
        assert envs.call("pid")[1] != victim
        obs, rew, term, trunc, info = envs.step(np.zeros(3, dtype=np.int64))
        assert "fiber_restarted" not in info   # reported once
    finally:
        envs.close()


def test_an_exception_in_step_truncates_that_episode_and_goes_on():
    envs = VectorEnv([helpers.make_pid_cartpole] * 2)
    try:
        envs.reset(seed=0)
        pid = envs.call("pid")[0]
        envs.set_attr("explode", [True, False])
        obs, rew, term, trunc, info = envs.step(np.zeros(2, dtype=np.int64))
        assert trunc[0] and not trunc[1]
        assert "RuntimeError: boom in step" in info["fiber_error"][0]
        # Rebuilt from its env_fn in the same job: explode is False again.
        assert envs.get_attr("explode") == (False, False)
        assert envs.call("pid")[0] == pid
        envs.step(np.zeros(2, dtype=np.int64))
    finally:
        envs.close()


@pytest.mark.local_only  # signals jobs by their pids on this host
def test_random_kills_during_100000_steps_lose_no_step():
    """25,000 steps of 4 sub-environments (100,000 env steps); a random
    sub-environment's job is SIGKILLed about every 2,500 steps.  Every step
    returns results of the right shape, and each kill is reported once."""
    n, steps = 4, 25_000
    envs = VectorEnv([helpers.make_pid_cartpole] * n)
    rng = random.Random(3)
    kills = reported = 0
    try:
        envs.reset(seed=1)
        pids = list(envs.call("pid"))
        for t in range(steps):
            if t % 2500 == 1250:
                i = rng.randrange(n)
                os.kill(pids[i], signal.SIGKILL)
                kills += 1
            obs, rew, term, trunc, info = envs.step(
                np.array([rng.randrange(2) for _ in range(n)]))
            assert obs.shape == (n, 4) and rew.shape == (n,)
            assert term.shape == (n,) and trunc.shape == (n,)
            if "fiber_restarted" in info:
                hit = np.flatnonzero(info["fiber_restarted"])
                reported += len(hit)
                assert all(trunc[hit])
                pids = list(envs.call("pid"))
        assert kills == 10 and reported == kills and envs.restarts == kills
    finally:
        envs.close()


def test_pipe_exchange_sends_a_round_and_reads_each_answer():
    """The C call fiber.gym's step rides on: every message sent before any
    answer is read, answers in the pipes' order, None for a pipe whose
    process went away (and the others still answered), and bad input
    refused with what is wrong."""
    from fiber import _fiber
    import fiber
    ends, procs = [], []
    for _ in range(3):
        mine, theirs = fiber.Pipe()
        p = fiber.Process(target=helpers.echo_bytes, args=(theirs,))
        p.start()
        ends.append(mine)
        procs.append(p)
    try:
        handles = [c._p for c in ends]
        assert _fiber.Pipe.exchange(handles, [b"a", bytearray(b"bb"),
                                              memoryview(b"ccc")]) == \
            [b"re:a", b"re:bb", b"re:ccc"]
        assert _fiber.Pipe.exchange([], []) == []
        # Process 1 ends without answering: its item is None, the others
        # are answered in the same call.
        got = _fiber.Pipe.exchange(handles, [b"x", b"die", b"z"])
        assert got == [b"re:x", None, b"re:z"]
        procs[1].join(30)
        assert procs[1].exitcode == 3
        # Its pipe stays failed; the other two go on.
        assert _fiber.Pipe.exchange(handles, [b"1", b"2", b"3"]) == \
            [b"re:1", None, b"re:3"]
        with pytest.raises(ValueError, match="3 pipes but 2 messages"):
            _fiber.Pipe.exchange(handles, [b"1", b"2"])
        with pytest.raises(TypeError, match=r"pipes\[1\] is not an open Pipe"):
            _fiber.Pipe.exchange([handles[0], "pipe"], [b"1", b"2"])
        with pytest.raises(TypeError):
            _fiber.Pipe.exchange(handles[:1], ["text, not bytes"])
        with pytest.raises(TypeError):
            _fiber.Pipe.exchange(handles, None)
        # None of the refused calls sent anything: the next round's
        # answers are its own.
        assert _fiber.Pipe.exchange([handles[0]], [b"again"]) == \
            [b"re:again"]
    finally:
        for c in ends:
            c.close()
        for p in procs:
            p.join(30)
