"""Measures one peer's pool figures for bench_python.py, in its own
process and virtual environment (build/venv-peers, made by peers-env.sh):
Uber's Fiber 0.2.1 is also called `fiber`, so it cannot share a process
with this fiber.

    build/venv-peers/bin/python bench/python/peer_measure.py --peer ray

The last line is one JSON object with the figures bench_python.py's
measure_pool gives (the same functions, the same tasks).
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [HERE] + [p for p in [os.environ.get("PYTHONPATH")] if p])


class _DaskResult:
    def __init__(self, fut):
        self._fut = fut

    def get(self, timeout=None):
        return self._fut.result(timeout)


class DaskPool:
    """multiprocessing.Pool's calls the benchmark makes, over a Dask
    LocalCluster of n single-threaded worker processes."""

    def __init__(self, n):
        from dask.distributed import Client, LocalCluster
        self._cluster = LocalCluster(n_workers=n, threads_per_worker=1,
                                     processes=True, dashboard_address=None)
        self._client = Client(self._cluster)

    def apply_async(self, f, args=()):
        return _DaskResult(self._client.submit(f, *args, pure=False))

    def apply(self, f, args=()):
        return self.apply_async(f, args).get()

    def map(self, f, it, chunksize=None):
        return self._client.gather(self._client.map(f, list(it), pure=False))

    def terminate(self):
        self._client.close()
        self._cluster.close()


class _Module:
    def __init__(self, pool):
        self.Pool = pool


def peer_module(name):
    if name == "fiber021":
        import fiber
        if getattr(fiber, "__version__", "") != "0.2.1":
            raise ImportError("the `fiber` here is not Uber's Fiber 0.2.1")
        return fiber
    if name == "ray":
        import ray
        from ray.util.multiprocessing import Pool
        ray.init(num_cpus=max(5, os.cpu_count()),  # the 5-worker test include_dashboard=False,
                 log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": HERE}})
        return _Module(Pool)
    if name == "dask":
        return _Module(DaskPool)
    raise ValueError("unknown peer %r" % name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    import bench_python as B
    mod = peer_module(args.peer)
    print(json.dumps(B.measure_pool(mod, args.quick)))


if __name__ == "__main__":
    main()
