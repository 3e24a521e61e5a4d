"""fiber.experimental: Fiber 0.2.1's experimental names.

``Ring`` and ``RingNode`` (fiber.experimental.ring): N processes in a ring,
each running the same function, with allreduce and broadcast of numpy
arrays (any writable buffer) over the C core's rings.
"""
from .ring import Ring, RingNode

__all__ = ["Ring", "RingNode"]
