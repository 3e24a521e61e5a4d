"""examples/python/ppo.py: PPO over fiber.gym.VectorEnv.  A short run
stopped and resumed from its checkpoint ends with the same networks, Adam
moments, generator (and for a Box action space normalisers), bit for bit,
as one that never stopped; the Gaussian policy's hand-written gradients
agree with finite differences."""
import os
import sys

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("gymnasium")

from conftest import PKG  # noqa: E402

# The example's script is on this host only; the vector itself is tested
# on every backend (test_gym).
pytestmark = pytest.mark.local_only

EXAMPLES = os.path.join(os.path.dirname(PKG), "examples", "python")


@pytest.fixture(scope="module")
def ppo():
    sys.path.insert(0, EXAMPLES)
    try:
        import ppo
        yield ppo
    finally:
        sys.path.remove(EXAMPLES)


def _arrays(path):
    with np.load(path) as z:
        return {k: z[k].copy() for k in z.files}


def _whole_equals_stopped_and_resumed(ppo, tmp_path, args, stop_after):
    """Runs args (4 updates) whole, then stopped after stop_after updates
    and resumed from its checkpoint; asserts both checkpoints are equal,
    array for array, and returns the whole run's."""
    whole = str(tmp_path / "whole.npz")
    ppo.main(args + ["--checkpoint", whole])
    parts = str(tmp_path / "parts.npz")
    ppo.main(args + ["--checkpoint", parts, "--stop-after", str(stop_after)])
    assert int(_arrays(parts)["update"]) == stop_after
    ppo.main(args + ["--checkpoint", parts, "--resume"])
    a, b = _arrays(whole), _arrays(parts)
    assert int(a["update"]) == int(b["update"]) == 4
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    return a


def test_a_resumed_run_continues_identically(ppo, tmp_path):
    args = ["--envs", "2", "--steps", "64", "--minibatch", "64",
            "--updates", "4"]
    a = _whole_equals_stopped_and_resumed(ppo, tmp_path, args, 2)
    # It learned something: not the initial networks.
    first = str(tmp_path / "first.npz")
    ppo.main(args + ["--checkpoint", first, "--stop-after", "1"])
    assert not np.array_equal(_arrays(first)["pi_p0"], a["pi_p0"])


def test_bad_arguments_are_refused(ppo):
    with pytest.raises(SystemExit):
        ppo.main(["--resume"])
    # Blackjack's observations are a Tuple: no MLP input.
    with pytest.raises(SystemExit, match="observation space is Tuple"):
        ppo.main(["--env", "Blackjack-v1", "--envs", "1", "--updates", "1"])


def test_a_gaussian_run_resumes_identically(ppo, tmp_path):
    """Pendulum-v1 (a Box action space): the Gaussian policy's log_std and
    both normalisers' statistics are in the checkpoint, and a stopped and
    resumed run ends bit for bit where the whole one does."""
    args = ["--env", "Pendulum-v1", "--envs", "2", "--steps", "64",
            "--minibatch", "64", "--epochs", "2", "--updates", "4"]
    a = _whole_equals_stopped_and_resumed(ppo, tmp_path, args, 3)
    # pi_p6 is log_std (after the MLP's three weights and biases): trained
    # from -0.5, one per action dimension.
    assert a["pi_p6"].shape == (1,) and a["pi_p6"][0] != -0.5
    # Every observation of 4 updates x 64 steps x 2 environments counted
    # (plus the statistics' initial 1e-4); no episode of Pendulum ends
    # within 64 steps, so every discounted return too.
    assert a["obs_count"] == pytest.approx(512 + 1e-4)
    assert a["ret_count"] == pytest.approx(512 + 1e-4)
    assert a["obs_mean"].shape == (3,) and np.all(a["obs_var"] > 0)


def test_gaussian_loss_gradients_match_finite_differences(ppo):
    rng = np.random.default_rng(3)
    n, d, clip, ent_coef = 40, 3, 0.2, 0.05
    mu = rng.standard_normal((n, d))
    log_std = rng.normal(-0.5, 0.3, d)
    act = mu + np.exp(log_std) * rng.standard_normal((n, d))
    adv = rng.standard_normal(n)
    # Old log-probabilities off by up to +-0.5: some ratios outside
    # [0.8, 1.2] (those rows have no gradient when their sign says so).
    old = ppo.gaussian_logp(mu, log_std, act) + rng.uniform(-0.5, 0.5, n)
    # A row on the clip boundary has no derivative: keep them off it.
    ratio = np.exp(ppo.gaussian_logp(mu, log_std, act) - old)
    keep = np.abs(np.abs(ratio - 1) - clip) > 1e-3
    mu, act, adv, old = mu[keep], act[keep], adv[keep], old[keep]
    _, dmu, dls, ratio, _ = ppo.gaussian_loss(mu, log_std, act, old, adv,
                                              clip, ent_coef)
    assert np.any(np.abs(ratio - 1) > clip) and np.any(dmu == 0)
    assert np.any(dmu != 0)

    def f(m, s):
        return ppo.gaussian_loss(m, s, act, old, adv, clip, ent_coef)[0]

    h = 1e-6
    num_mu = np.zeros_like(mu)
    for idx in np.ndindex(*mu.shape):
        e = np.zeros_like(mu)
        e[idx] = h
        num_mu[idx] = (f(mu + e, log_std) - f(mu - e, log_std)) / (2 * h)
    num_ls = np.zeros(d)
    for j in range(d):
        e = np.zeros(d)
        e[j] = h
        num_ls[j] = (f(mu, log_std + e) - f(mu, log_std - e)) / (2 * h)
    assert np.allclose(dmu, num_mu, rtol=1e-5, atol=1e-8)
    assert np.allclose(dls, num_ls, rtol=1e-5, atol=1e-8)


def test_gaussian_logp_and_entropy_are_the_normal_ones(ppo):
    rng = np.random.default_rng(4)
    mu = rng.standard_normal((5, 2))
    log_std = np.array([-0.5, 0.7])
    act = rng.standard_normal((5, 2))
    std = np.exp(log_std)
    dens = np.prod(np.exp(-0.5 * ((act - mu) / std) ** 2)
                   / (std * np.sqrt(2 * np.pi)), axis=1)
    assert np.allclose(ppo.gaussian_logp(mu, log_std, act), np.log(dens))
    # The entropy is -E[log p]: a Monte-Carlo mean over 200,000 samples.
    m = np.zeros((200_000, 2))
    x = m + std * rng.standard_normal(m.shape)
    assert abs(-ppo.gaussian_logp(m, log_std, x).mean()
               - ppo.gaussian_entropy(log_std)) < 0.01
