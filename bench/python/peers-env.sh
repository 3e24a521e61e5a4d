#!/bin/sh
# Creates build/venv-peers: the peers bench_python.py measures beside
# fiber and multiprocessing, for benchmarking only (never for tests):
# Ray, Dask (distributed) and Uber's Fiber 0.2.1.  Fiber 0.2.1 does not
# install from PyPI as it is (its nnpy-bundle dependency clones nanomsg
# with git), so: Debian's libnanomsg-dev, then nnpy, then fiber==0.2.1
# without dependencies plus the ones it imports.  Each peer that fails to
# install is reported and left out; the others still install.
set -u
venv=${1:-build/venv-peers}
py=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip="$venv/bin/python -m pip install -q --disable-pip-version-check"
$pip numpy cloudpickle || exit 1
$pip ray || echo "peers-env: ray did not install; it is left out" >&2
$pip "dask[distributed]" || echo "peers-env: dask did not install; it is left out" >&2
if ! dpkg-query -W -f='${Status}' libnanomsg-dev 2>/dev/null | grep -q "ok installed"; then
    apt-get update -qq && apt-get install -y -qq -o DPkg::Lock::Timeout=600 libnanomsg-dev ||
        echo "peers-env: libnanomsg-dev did not install" >&2
fi
{ $pip nnpy && $pip --no-deps fiber==0.2.1 && $pip docker kubernetes psutil; } ||
    echo "peers-env: Fiber 0.2.1 did not install; it is left out" >&2
exit 0
