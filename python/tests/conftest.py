import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)


def run_script(tmp_path, source, timeout=60, env=None, name="prog.py"):
    """Runs source as a Python program (its own master); returns the
    CompletedProcess."""
    path = tmp_path / name
    path.write_text(source)
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([PKG, HERE] + [p for p in [e.get("PYTHONPATH")] if p])
    if env:
        e.update(env)
    return subprocess.run([sys.executable, str(path)], capture_output=True,
                          text=True, timeout=timeout, cwd=str(tmp_path), env=e)


@pytest.fixture
def script(tmp_path):
    return lambda source, **kw: run_script(tmp_path, source, **kw)
