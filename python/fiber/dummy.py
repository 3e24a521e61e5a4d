"""``fiber.dummy``: multiprocessing.dummy, the same API over threads.

Its ``Pool``, ``Process``, ``Queue`` and the rest are multiprocessing's
thread-backed ones: they run in the calling process (the master or a
job), never as jobs of the run, which is what a program that imports
``multiprocessing.dummy`` asks for (I/O-bound work, or a pool whose tasks
share the process's memory).  Provided so that ``from fiber.dummy import
Pool`` works where ``from multiprocessing.dummy import Pool`` did.
"""
from multiprocessing import dummy as _dummy
from multiprocessing.dummy import *          # noqa: F401,F403
from multiprocessing.dummy import connection  # noqa: F401

__all__ = list(_dummy.__all__)
