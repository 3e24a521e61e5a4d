"""The tasks bench_python.py sends to workers (importable by name)."""
import time


def noop(x):
    return x


def sleep(t):
    """Sleeps t seconds and returns how long it slept."""
    start = time.perf_counter()
    time.sleep(t)
    return time.perf_counter() - start


def asum(a):
    return float(a[0])


def produce(q, n):
    payload = b"x" * 64
    q.put(b"ready")
    for _ in range(n):
        q.put(payload)
