#!/bin/sh
# Creates build/venv-examples (or VENV_DIR): the test venv's packages plus
# what the Python examples and their benchmark use -- gymnasium's MuJoCo
# (Hopper, Humanoid) and Box2D (BipedalWalker) environments, matplotlib
# for --plot, and Ray for --pool ray.  Nothing is installed outside it.
#   scripts/examples-env.sh [VENV_DIR]
# Run the examples with it (after `make python`):
#   PYTHONPATH=python build/venv-examples/bin/python examples/python/es.py
set -eu
cd "$(dirname "$0")/.."
exec scripts/python-env.sh "${1:-build/venv-examples}" \
  'gymnasium[mujoco,box2d]' matplotlib ray
