"""Loaded at interpreter start (site) by every process of a Fiber-suite run
(tests/python/fiber_suite.py puts this folder on PYTHONPATH): the pytest
master and the fiber jobs it starts.

It lets Uber Fiber 0.2.1's test files import three modules that are
internals of Uber's Fiber, not part of fiber (its nanomsg `fiber.socket`,
its `fiber.docker_backend` class, its `fiber.backend` registry): they load
from placeholders/ in this folder.  Every placeholder's use skips the test
as "not applicable", so a test that needs one is never counted as passed.
Nothing here is part of the fiber package.
"""
import importlib.abc
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_PLACEHOLDERS = {"fiber.socket", "fiber.docker_backend", "fiber.backend"}


class _PlaceholderFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _PLACEHOLDERS:
            return None
        leaf = fullname.rsplit(".", 1)[1]
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(_HERE, "placeholders", leaf + ".py"))


sys.meta_path.insert(0, _PlaceholderFinder())
