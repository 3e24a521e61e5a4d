"""Placeholder for Uber Fiber's fiber.socket (its nanomsg sockets)."""
import importlib.util as _u
import os as _os

_spec = _u.spec_from_file_location(
    "_fiber_suite_na", _os.path.join(_os.path.dirname(__file__), "_na.py"))
_na = _u.module_from_spec(_spec)
_spec.loader.exec_module(_na)


class Socket:
    def __init__(self, *args, **kwargs):
        _na.not_applicable("fiber.socket.Socket (Fiber's nanomsg socket)")
