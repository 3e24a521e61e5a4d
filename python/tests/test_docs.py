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
