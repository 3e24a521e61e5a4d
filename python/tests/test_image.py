import os
import sys

import pytest

import fiber
from fiber import _fiber, image

from conftest import skip_engine

SOCK = os.environ.get("FIBER_DOCKER_SOCKET", "/var/run/docker.sock")


@pytest.fixture(autouse=True)
def docker_engine():
    if not os.path.exists(SOCK):
        skip_engine("no Docker engine at %s" % SOCK)


def test_bad_trees_are_refused_by_name():
    with pytest.raises(fiber.FiberError, match="absolute"):
        _fiber.image_build(sys.executable, ["relative/dir"], [],
                           "fiber-test/bad:1")
    with pytest.raises(fiber.FiberError, match="/no/such/tree"):
        _fiber.image_build(sys.executable, ["/no/such/tree"], [],
                           "fiber-test/bad:1")
    with pytest.raises(fiber.FiberError, match="tag|name"):
        _fiber.image_build(sys.executable, [], [], "Not A Tag!")


def test_the_image_holds_what_a_job_needs():
    trees = image._trees(__file__)
    assert os.path.dirname(os.path.abspath(fiber.__file__)) in [
        os.path.join(t, "fiber") for t in trees] or any(
        os.path.abspath(fiber.__file__).startswith(t + os.sep) for t in trees)
    assert os.path.dirname(os.path.abspath(__file__)) in trees
    excl = image._excludes()
    assert any(e.endswith(os.sep + "test") for e in excl)
    assert image.default_tag(__file__).startswith("fiber/python-test-image:")
