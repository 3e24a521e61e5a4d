import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)


def run_script(tmp_path, source, timeout=60, env=None, name="prog.py",
               args=(), from_stdin=False):
    """Runs source as a Python program (its own master), with command-line
    arguments args; from_stdin: read by `python -` from its standard
    input, with no file.  Returns the CompletedProcess."""
    path = tmp_path / name
    if not from_stdin:
        path.write_text(source)
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([PKG, HERE] + [p for p in [e.get("PYTHONPATH")] if p])
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-" if from_stdin else str(path)]
                          + list(args), capture_output=True,
                          input=source if from_stdin else None,
                          text=True, timeout=timeout, cwd=str(tmp_path), env=e)


@pytest.fixture
def script(tmp_path):
    return lambda source, **kw: run_script(tmp_path, source, **kw)


BACKEND = os.environ.get("FIBER_BACKEND", "local")


def under_ci():
    return os.environ.get("CI", "") not in ("", "0", "false")


def skip_engine(reason):
    """A case that needs an engine (Docker, Slurm, Kubernetes) and cannot
    have it: skipped, or failed under CI, which must exercise every
    backend (the C suites' TH_SKIP_ENGINE and tests/skip.sh)."""
    if under_ci():
        pytest.fail("%s: an engine case cannot run under CI" % reason)
    pytest.skip(reason)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "local_only: needs the local backend (it inspects the "
        "jobs' processes, their output or the master's unix socket); left "
        "out of the reruns on other backends")
    config.addinivalue_line(
        "markers", "host_files: runs a program written to a temporary "
        "folder, which jobs must see at the same path (local, or slurm on "
        "a shared file system); left out of the docker rerun, whose image "
        "holds the test folder only")


def pytest_collection_modifyitems(config, items):
    """On another backend (the slurm rerun), the local-only cases are not
    collected at all: they are not part of that suite, so they are neither
    passed nor skipped."""
    if BACKEND == "local":
        return
    keep, drop = [], []
    for item in items:
        out = item.get_closest_marker("local_only") or (
            BACKEND in ("docker", "kubernetes") and
            (item.get_closest_marker("host_files") or
             "script" in getattr(item, "fixturenames", ())))
        (drop if out else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
