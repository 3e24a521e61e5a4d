#!/bin/sh
# pytest.sh VENV [PYTEST ARGS...] -- runs the Python package's suite
# (python/tests) with the interpreter of VENV and the package built in
# place by `make python`.  The slurm rerun calls it through
# tests/slurm/run.sh, which sets FIBER_BACKEND=slurm: the cases marked
# local_only are then left out (python/tests/conftest.py).
set -eu
venv=$1
shift
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top/python"
PYTHONPATH="$top/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
