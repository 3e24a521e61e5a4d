"""@fiber.meta(cpu=, memory=, gpu=): the resources of the jobs that run a
function (Fiber's API).  A Process whose target carries it runs in a job
with those resources; a Pool's workers take them from the first function
the pool runs (a later function asking for others is refused)."""

_KEYS = ("cpu", "memory", "gpu")


def meta(**kwargs):
    """cpu: CPUs to reserve; memory: MiB; gpu: GPUs (each a positive int)."""
    for key, value in kwargs.items():
        if key not in _KEYS:
            raise ValueError("fiber.meta: unknown key %r; keys: %s"
                             % (key, ", ".join(_KEYS)))
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError("fiber.meta: %s must be a non-negative int, not "
                             "%r" % (key, value))

    def decorate(func):
        func.__fiber_meta__ = dict(kwargs)
        return func

    return decorate
