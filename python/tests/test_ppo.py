"""examples/python/ppo.py: PPO over fiber.gym.VectorEnv.  A short run
stopped and resumed from its checkpoint ends with the same networks, Adam
moments and generator, bit for bit, as one that never stopped."""
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


def test_a_resumed_run_continues_identically(ppo, tmp_path):
    args = ["--envs", "2", "--steps", "64", "--minibatch", "64",
            "--updates", "4"]
    whole = str(tmp_path / "whole.npz")
    ppo.main(args + ["--checkpoint", whole])
    parts = str(tmp_path / "parts.npz")
    ppo.main(args + ["--checkpoint", parts, "--stop-after", "2"])
    assert int(_arrays(parts)["update"]) == 2
    ppo.main(args + ["--checkpoint", parts, "--resume"])
    a, b = _arrays(whole), _arrays(parts)
    assert int(a["update"]) == int(b["update"]) == 4
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    # It learned something: not the initial networks.
    first = str(tmp_path / "first.npz")
    ppo.main(args + ["--checkpoint", first, "--stop-after", "1"])
    assert not np.array_equal(_arrays(first)["pi_p0"], a["pi_p0"])


def test_bad_arguments_are_refused(ppo):
    with pytest.raises(SystemExit):
        ppo.main(["--resume"])
    with pytest.raises(SystemExit, match="continuous"):
        ppo.main(["--env", "Pendulum-v1", "--envs", "1", "--updates", "1"])
