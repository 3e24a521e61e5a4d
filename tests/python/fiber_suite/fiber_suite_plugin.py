"""pytest plugin of the Fiber-suite harness (loaded with -p in the master):
imports the placeholders so that `fiber.backend`, `fiber.socket` and
`fiber.docker_backend` are attributes of the fiber package, as they are
in Uber's (its tests use `fiber.backend.get_backend` without importing
it).  See sitecustomize.py.

A test decorated with `mock.patch.object(<a placeholder's class>, ...)`
replaces a method of Uber's internals and then asserts how Fiber called
it (test_misc's test_init_image: `Backend.create_job`); fiber never calls
a placeholder, so such a test is skipped as not applicable before it
runs, like a test that calls a placeholder."""
import fiber
import fiber.backend  # noqa: F401  (placeholders: sitecustomize.py)
import fiber.docker_backend  # noqa: F401
import fiber.socket  # noqa: F401
import pytest

_PLACEHOLDERS = ("fiber.socket", "fiber.docker_backend", "fiber.backend")


def _patched_placeholder(func):
    """'module.Class.attr' of the first placeholder a mock.patch decorator
    of func replaces, or None."""
    for patching in getattr(func, "patchings", ()) or ():
        try:
            target = patching.getter()
        except Exception:
            continue
        module = getattr(target, "__module__", None) or \
            getattr(target, "__name__", "")
        if module in _PLACEHOLDERS:
            return "%s.%s.%s" % (module, getattr(target, "__qualname__",
                                                 target), patching.attribute)
    return None


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        what = _patched_placeholder(getattr(item, "function", None))
        if what:
            item.add_marker(pytest.mark.skip(
                reason="not applicable: the test patches %s, an internal "
                "of Uber's Fiber that fiber does not have, and asserts "
                "how Fiber called it" % what))
