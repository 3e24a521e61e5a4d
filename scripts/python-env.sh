#!/bin/sh
# Creates the virtual environment the Python package is built and tested
# in (build/venv by default), with what its tests need, and nothing
# installed outside it.  Idempotent: a stamp records what was installed.
#   scripts/python-env.sh [VENV_DIR [EXTRA_PACKAGE...]]
# gymnasium is in the test venv for the ES example's CartPole test (pure
# Python), joblib and scikit-learn for the joblib backend's tests,
# nevergrad for the executor's (a library that takes an Executor), deap
# and emcee for test_libraries (libraries that take a pool's map);
# scripts/examples-env.sh passes the examples' heavier extras.
set -eu
venv=${1:-build/venv}
[ $# -gt 0 ] && shift
want="pytest numpy cloudpickle setuptools wheel gymnasium joblib scikit-learn nevergrad deap emcee${*:+ $*}"
stamp="$venv/.fiber-packages"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
py=${PYTHON:-python3}
if ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then
  echo "fiber: $py cannot create virtual environments; installing python3-venv" >&2
  scripts/deps.sh python
fi
if ! "$py" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  echo "fiber: Python.h is missing for $py; installing python3-dev" >&2
  scripts/deps.sh python
fi
echo "fiber: creating $venv with: $want" >&2
"$py" -m venv "$venv"
# shellcheck disable=SC2086
"$venv/bin/python" -m pip install -q --disable-pip-version-check $want
echo "$want" > "$stamp"
