"""fiber.config: Uber Fiber's configuration module, over fiber's live
configuration.

Reading an attribute returns the value in force; assigning one sets it
(``fiber.config.log_level = "debug"``), as in Fiber.  Two sets of names:

* fiber's own keys (docs/configuration.md: ``backend``, ``log_level``,
  ``log_dir``, ``image``, ``k8s_namespace``, ...): read as fiber_config_get
  returns them (text), set through fiber_config_set.
* Fiber 0.2.1's keys, mapped onto fiber's (see ``FIBER_KEYS`` and
  docs/python.md, "Moving over from Uber's Fiber"): ``default_backend``
  and ``backend`` -> ``backend``; ``default_image`` and ``image`` ->
  ``image``; ``log_level`` (also Fiber's ``warning``, ``critical`` and
  ``logging`` integers; read back as a ``logging`` integer, as Fiber has
  it) -> ``log_level``; ``debug`` -> ``log_level = debug``; ``log_file``
  (a path prefix: each process logs to ``<log_file>.<its name>``, the
  master to ``<log_file>.MainProcess``; None for ``log_dir``'s layout)
  -> ``log_file``; ``kubernetes_namespace`` ->
  ``k8s_namespace``; ``cpu_per_job`` and ``mem_per_job`` (MiB) -> the
  CPUs and memory every job started from Python reserves unless its
  function's ``@fiber.meta`` says otherwise.  Fiber's internal keys that
  fiber has no counterpart for are accepted only at the value that
  describes fiber (``ipc_active = True``, ``ipc_admin_master_port = 0``,
  ``use_push_queue = True``); any other value raises NotImplementedError
  saying why.

An unknown name raises AttributeError naming the known ones; a bad value
raises fiber.ConfigError (a ValueError) naming the key.
"""
import logging as _logging
import os as _os
import sys as _sys
import types as _types

from . import _fiber

# Fiber's log levels (names and logging integers) -> fiber's.
_LEVEL_IN = {"debug": "debug", "info": "info", "warning": "warn",
             "warn": "warn", "error": "error", "critical": "error"}
_LEVEL_OUT = {"debug": _logging.DEBUG, "info": _logging.INFO,
              "warn": _logging.WARNING, "error": _logging.ERROR}

# Keys that only the Python package holds (fiber's C core sets a job's
# resources per job): the defaults for Process and Pool jobs.
_job_defaults = {"cpu_per_job": None, "mem_per_job": None}

# The value each fiber key had before this module first changed it (from
# the defaults, .fiberconfig and FIBER_* variables): what reset() restores.
_original = {}


def _get(key):
    return _fiber.config_get(key)


def _set(key, text):
    if key not in _original:
        _original[key] = _fiber.config_get(key)
    _fiber.config_set(key, text)


def _refuse(key, value, why):
    raise NotImplementedError("fiber.config.%s = %r: %s" % (key, value, why))


# ---- Fiber's keys ----------------------------------------------------------

def _get_backend():
    return _get("backend")


def _set_backend(value, key="backend"):
    if value is None:
        return  # Fiber's "no backend set": the default one stays
    _set("backend", str(value))


def _get_image():
    return _get("image") or None


def _set_image(value, key="image"):
    _set("image", "" if value is None else str(value))


def _level_text(value):
    if isinstance(value, bool):
        raise _fiber.ConfigError("log_level: expected a level name or a "
                                 "logging level, not %r" % value)
    if isinstance(value, int):
        if value <= _logging.DEBUG:
            return "debug"
        if value <= _logging.INFO:
            return "info"
        if value <= _logging.WARNING:
            return "warn"
        return "error"
    text = str(value).strip().lower()
    if text.isdigit():
        return _level_text(int(text))
    if text not in _LEVEL_IN:
        raise _fiber.ConfigError(
            "bad value %r for key 'log_level': expected one of debug, info, "
            "warning (warn), error, critical, or a logging level" % value)
    return _LEVEL_IN[text]


def _get_log_level():
    return _LEVEL_OUT[_get("log_level")]


def _set_log_level(value, key="log_level"):
    _set("log_level", _level_text(value))


def _get_debug():
    return _get("log_level") == "debug"


def _set_debug(value, key="debug"):
    if value in (True, "true", "True", "1", "yes", 1):
        _set("log_level", "debug")
    elif value in (False, "false", "False", "0", "no", 0, None):
        if _get("log_level") == "debug":
            _set("log_level", _original.get("log_level", "warn")
                 if _original.get("log_level", "warn") != "debug" else "warn")
    else:
        raise _fiber.ConfigError("debug: expected True or False, not %r"
                                 % (value,))


def _get_log_file():
    return _get("log_file") or None


def _set_log_file(value, key="log_file"):
    # Fiber's layout: each process logs to <value>.<its name>, the master
    # to <value>.MainProcess; None goes back to log_dir's layout.
    _set("log_file", "" if value is None else _os.fspath(value))


def _get_namespace():
    return _get("k8s_namespace") or None


def _set_namespace(value, key="kubernetes_namespace"):
    _set("k8s_namespace", "" if value is None else str(value))


def _job_getter(key):
    return lambda: _job_defaults[key]


def _job_setter(key):
    def setter(value, key=key):
        if value is not None:
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value)
            if not isinstance(value, int) or isinstance(value, bool) or \
                    value < 0:
                raise _fiber.ConfigError("%s: expected a non-negative int "
                                         "or None, not %r" % (key, value))
        _job_defaults[key] = value or None
    return setter


def _fixed(key, value, why):
    """A Fiber key whose only possible value in fiber is `value`."""
    def getter():
        return value

    def setter(new, key=key):
        if isinstance(value, bool) and isinstance(new, str):
            new = new.strip().lower() in ("true", "yes", "1")
        if new != value:
            _refuse(key, new, why)
    return getter, setter


_IPC = ("fiber's jobs always dial their master (and queues', pipes' and "
        "managers' servers); the master never connects to its jobs")

FIBER_KEYS = {
    "backend": (_get_backend, _set_backend),
    "default_backend": (_get_backend, _set_backend),
    "image": (_get_image, _set_image),
    "default_image": (_get_image, _set_image),
    "log_level": (_get_log_level, _set_log_level),
    "debug": (_get_debug, _set_debug),
    "log_file": (_get_log_file, _set_log_file),
    "kubernetes_namespace": (_get_namespace, _set_namespace),
    "cpu_per_job": (_job_getter("cpu_per_job"), _job_setter("cpu_per_job")),
    "mem_per_job": (_job_getter("mem_per_job"), _job_setter("mem_per_job")),
    "ipc_active": _fixed("ipc_active", True, _IPC),
    "ipc_admin_master_port": _fixed(
        "ipc_admin_master_port", 0,
        "the master listens on a port the kernel picks (or on its unix "
        "socket); fiber has no fixed port"),
    "ipc_admin_worker_port": _fixed("ipc_admin_worker_port", None, _IPC),
    "use_push_queue": _fixed(
        "use_push_queue", True,
        "fiber's queues live on the master's object server and are what "
        "Fiber called push queues; Fiber 0.2.1 no longer had pull queues "
        "either"),
    "merge_output": _fixed(
        "merge_output", False,
        "an undocumented switch of Fiber's process launcher; a fiber job's "
        "output goes to its log (docs/configuration.md, log_dir)"),
    "use_bash": _fixed(
        "use_bash", False,
        "an unused switch of Fiber's process launcher; fiber starts the "
        "interpreter directly"),
}


def _fiber_keys():
    """fiber's own configuration keys (from the C core's error message)."""
    try:
        _fiber.config_get("\x01")
    except _fiber.ConfigError as e:
        text = str(e)
        if "known keys:" in text:
            return [k.strip() for k in text.split("known keys:", 1)[1]
                    .split(",") if k.strip()]
    return []


def get(key):
    """The value of a Fiber or fiber key (as the attribute reads)."""
    if key in FIBER_KEYS:
        return FIBER_KEYS[key][0]()
    if key in _fiber_keys():
        return _get(key)
    raise AttributeError(
        "fiber.config has no key %r; Fiber's keys: %s; fiber's: %s"
        % (key, ", ".join(sorted(FIBER_KEYS)), ", ".join(_fiber_keys())))


def set(key, value):  # noqa: A001  (the module's verb, as Fiber's config)
    """Sets a Fiber or fiber key (as assigning the attribute does)."""
    if key in FIBER_KEYS:
        FIBER_KEYS[key][1](value)
        return
    if key in _fiber_keys():
        if isinstance(value, bool):
            value = "true" if value else "false"
        _set(key, str(value))
        return
    raise _fiber.ConfigError(
        "unknown configuration key %r; Fiber's keys: %s; fiber's: %s"
        % (key, ", ".join(sorted(FIBER_KEYS)), ", ".join(_fiber_keys())))


def init(**kwargs):
    """Sets several keys (Fiber's config.init); returns the names of those
    whose value changed."""
    updated = []
    for key, value in kwargs.items():
        before = get(key)
        set(key, value)
        if get(key) != before:
            updated.append(key)
    return updated


def get_dict():
    """Fiber's keys and their values in force, as a dict."""
    return {key: FIBER_KEYS[key][0]() for key in FIBER_KEYS}


def reset():
    """Forgets what code set through this module and fiber.init(): every
    key goes back to its value from .fiberconfig, FIBER_* variables and
    the defaults (Fiber's fiber.reset())."""
    for key, value in list(_original.items()):
        try:
            _fiber.config_set(key, value)
        except _fiber.ConfigError:
            pass  # an empty default (log_dir) cannot be set back
    _original.clear()
    for key in _job_defaults:
        _job_defaults[key] = None


def job_defaults():
    """The cpu and memory (MiB) a job started from Python reserves when its
    function asks for none (cpu_per_job, mem_per_job; 0: none)."""
    return {"cpu": _job_defaults["cpu_per_job"] or 0,
            "memory": _job_defaults["mem_per_job"] or 0}


class _ConfigModule(_types.ModuleType):
    """Makes the module's attributes the live configuration."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return get(name)

    def __setattr__(self, name, value):
        if name.startswith("_") or name in globals():
            _types.ModuleType.__setattr__(self, name, value)
            return
        set(name, value)

    def __dir__(self):
        return sorted(_types.ModuleType.__dir__(self) + list(FIBER_KEYS) +
                      _fiber_keys())


_sys.modules[__name__].__class__ = _ConfigModule
