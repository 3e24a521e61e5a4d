"""Placeholder for Uber Fiber's fiber.backend (its registry of backend
objects, which its tests replace to inject faults)."""
import importlib.util as _u
import os as _os

_spec = _u.spec_from_file_location(
    "_fiber_suite_na", _os.path.join(_os.path.dirname(__file__), "_na.py"))
_na = _u.module_from_spec(_spec)
_spec.loader.exec_module(_na)


class _Registry(dict):
    def __getitem__(self, key):
        _na.not_applicable("fiber.backend._backends (Fiber's backend registry)")

    def __setitem__(self, key, value):
        _na.not_applicable("fiber.backend._backends (Fiber's backend registry)")


_backends = _Registry()


def get_backend(name=None, **kwargs):
    _na.not_applicable("fiber.backend.get_backend (Fiber's backend registry)")
