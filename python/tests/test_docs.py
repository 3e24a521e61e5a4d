import os
import re

from conftest import PKG

ROOT = os.path.dirname(PKG)


def _python_blocks(path):
    with open(path) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def test_readme_python_example_runs(script):
    blocks = _python_blocks(os.path.join(ROOT, "README.md"))
    assert blocks, "README.md has no Python example"
    r = script(blocks[0])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("best ")


def test_docs_python_example_runs(script):
    blocks = _python_blocks(os.path.join(ROOT, "docs", "python.md"))
    r = script(blocks[0])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str([x * x for x in range(10)])


def test_every_docs_python_example_runs(script):
    """Every ```python block of docs/python.md is a complete program that
    runs and exits 0 (one fails only by being incomplete or wrong)."""
    blocks = _python_blocks(os.path.join(ROOT, "docs", "python.md"))
    assert len(blocks) >= 2
    for i, block in enumerate(blocks):
        r = script(block, timeout=180, name="example%d.py" % i)
        assert r.returncode == 0, "docs/python.md example %d:\n%s\n%s" % (
            i, block, r.stderr)


def _stop_example():
    for block in _python_blocks(os.path.join(ROOT, "docs", "python.md")):
        if "on_stop_requested" in block:
            return block
    raise AssertionError("docs/python.md has no stop-request example")


def test_docs_stop_request_example_runs_and_resumes(script, tmp_path):
    block = _stop_example()
    r = script(block, timeout=180)
    assert r.returncode == 0, r.stderr
    want = sum(sum(x * x for x in range(i, i + 10)) for i in range(20))
    assert r.stdout.split() == ["20", str(want)]
    # A restarted run (FIBER_RESUMED) goes on from the checkpoint it finds.
    (tmp_path / "run.ckpt").write_text('{"iteration": 18, "total": 5}')
    r = script(block, timeout=180, env={"FIBER_RESUMED": "1"})
    assert r.returncode == 0, r.stderr
    tail = sum(sum(x * x for x in range(i, i + 10)) for i in (18, 19))
    assert r.stdout.split() == ["20", str(5 + tail)]
