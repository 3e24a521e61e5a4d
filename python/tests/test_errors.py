"""fiber's error codes and the Python exceptions they raise: one mapping
(the extension's, generated from fiber.h's FIBER_ERRNO_MAP), used by the
C calls and by fiber.pool alike."""
import os
import re

import pytest

from conftest import PKG

import fiber
from fiber import _fiber, pool

FIBER_H = os.path.join(os.path.dirname(PKG), "include", "fiber", "fiber.h")

# The codes that raise a subclass of FiberError (or MemoryError) rather
# than FiberError itself, as docs/python.md lists them.
OWN_CLASS = {
    "ECONFIG": fiber.ConfigError,
    "ETIMEDOUT": fiber.FiberTimeoutError,
    "ECRASHED": fiber.TaskCrashedError,
    "ECLOSED": fiber.ClosedError,
    "ENOTASK": fiber.NoTaskError,
    "ESPAWN": fiber.SpawnError,
    "ENOMEM": MemoryError,
}


def header_codes():
    """[(NAME, value)] of every X(NAME, value, text) in FIBER_ERRNO_MAP."""
    with open(FIBER_H) as f:
        text = f.read()
    start = text.index("#define FIBER_ERRNO_MAP(X)")
    block = text[start:text.index("\n\n", start)]
    codes = [(n, int(v)) for n, v in
             re.findall(r"X\((E[A-Z]+),\s*(-\d+),", block)]
    assert len(codes) > 10, "FIBER_ERRNO_MAP not found in fiber.h"
    return codes


CODES = header_codes()


@pytest.mark.parametrize("name,value", CODES, ids=[n for n, _ in CODES])
def test_every_code_in_fiber_h_maps_to_an_exception(name, value):
    assert getattr(_fiber, name) == value
    errname, cls = _fiber.ERRORS[value]
    assert errname == "FIBER_" + name
    assert cls is OWN_CLASS.get(name, fiber.FiberError)
    e = _fiber.error(value, "why")
    assert type(e) is cls and str(e) == "why"
    if cls is not MemoryError:
        assert e.code == value and e.errname == "FIBER_" + name
    # fiber.pool raises a failed task's code by the same mapping.
    with pytest.raises(cls) as raised:
        pool._raise_failure(value, "why")
    assert type(raised.value) is cls


def test_the_table_has_no_code_fiber_h_lacks():
    assert sorted(_fiber.ERRORS) == sorted(v for _, v in CODES)


def test_a_job_that_cannot_start_is_multiprocessing_process_error_too():
    """Uber Fiber raised multiprocessing.ProcessError when a job could not
    start, and its programs catch that."""
    import multiprocessing
    assert issubclass(fiber.SpawnError, fiber.FiberError)
    assert issubclass(fiber.SpawnError, multiprocessing.ProcessError)
    assert fiber.ProcessError is multiprocessing.ProcessError


def test_an_unknown_code_is_a_fiber_error():
    e = _fiber.error(-9999, None)
    assert type(e) is fiber.FiberError and e.errname == "FIBER_E?"
