#!/bin/sh
# Installs the Debian packages fiber needs that are missing, and nothing
# else.  Usage: scripts/deps.sh [build|fuzz|valgrind|python|engines]
#   (default: build)
#
#   build    the compiler, CMake and the libraries fiber links, and what
#            the tests need besides (tmux, for test_top)
#
#   python   what the Python package's build and virtual environment need
#            when the interpreter lacks Python.h or venv (python3-dev,
#            python3-venv)
#
#   engines  the packages of the test clusters: Slurm (slurm-local.sh),
#            the Kubernetes control plane and node (k8s-local.sh: etcd,
#            conntrack for the kubelet, and Go plus the tools that build
#            kube-apiserver, kubelet, kube-scheduler and
#            kube-controller-manager), then builds those binaries into
#            /var/cache/fiber-k8s when they are not there yet (5.5 to 15
#            minutes of 2 cores, once per machine).  `make test` runs it
#            before ctest, so no two fixtures of the parallel run ever
#            install packages at the same time.  Where this cannot be
#            done (not root, no archive) it says so and exits 0: the
#            engine cases are then skipped; under CI (CI=true) it fails.
#
# Progress: an install prints a line every 30 s while apt-get works
# (FIBER_PROGRESS_INTERVAL), and engines a line per stage with the time
# so far; the Kubernetes build prints its own (scripts/progress.sh).
#
# Every apt-get waits up to 10 minutes for the dpkg lock
# (-o DPkg::Lock::Timeout=600) and the project's scripts take
# /var/lock/fiber-apt.lock around theirs, so two never collide.
set -eu

build_pkgs="cmake make gcc pkg-config libinih-dev libsodium-dev libjansson-dev libcurl4-openssl-dev python3"
# What the tests need beyond the build: tmux, the terminal in which
# test_top drives `fiber top` and reads its screen.  Part of the build set,
# which `make build` and so `make test` install.
test_pkgs="tmux"
fuzz_pkgs="clang libclang-rt-14-dev"
valgrind_pkgs="valgrind"
python_pkgs="python3-dev python3-venv"
engine_pkgs="slurmctld slurmd slurm-client munge etcd-server curl openssl conntrack golang-go rsync jq dpkg-dev golang-github-modern-go-reflect2-dev"

case "${1:-build}" in
  build) want="$build_pkgs $test_pkgs" ;;
  fuzz)  want="$build_pkgs $fuzz_pkgs" ;;
  valgrind) want="$build_pkgs $valgrind_pkgs" ;;
  python) want="$build_pkgs $python_pkgs" ;;
  engines) want="$engine_pkgs" ;;
  *) echo "usage: $0 [build|fuzz|valgrind|python|engines]" >&2; exit 2 ;;
esac
set_name=${1:-build}
top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/progress.sh
. "$top/scripts/progress.sh"
if [ "$set_name" = engines ]; then
  progress_start fiber 2
else
  progress_start fiber 1
fi

under_ci() {
  case ${CI:-} in '' | 0 | false) return 1 ;; esac
  return 0
}

# cannot WHAT: the engine set could not be had; a failure only under CI.
cannot() {
  if [ "$set_name" = engines ] && ! under_ci; then
    echo "fiber: $*; the engine cases that need it will be skipped" >&2
    exit 0
  fi
  echo "fiber: $*" >&2
  exit 1
}

[ "$set_name" != engines ] ||
  progress_stage 1 "engines: the test clusters' packages (Slurm, munge, etcd, Go...)"
missing=""
for p in $want; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    # python3 may come from elsewhere (pyenv); a working interpreter will do.
    if [ "$p" = python3 ] && command -v python3 >/dev/null 2>&1; then
      continue
    fi
    missing="$missing $p"
  fi
done

if [ -n "$missing" ]; then
  echo "fiber: installing missing packages:$missing" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
      cannot "need root (or sudo) to install:$missing"
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt="$SUDO flock /var/lock/fiber-apt.lock apt-get -o DPkg::Lock::Timeout=600"
  progress_run "apt-get update" $apt update -qq || cannot "apt-get update failed"
  # shellcheck disable=SC2086
  progress_run "apt-get install$missing" $apt install -y -qq --no-install-recommends $missing ||
    cannot "apt-get install failed:$missing"
fi

if [ "$set_name" = engines ]; then
  progress_stage 2 "engines: the Kubernetes binaries (built once, 5.5 to 15 minutes; then cached)"
  if [ "$(id -u)" = 0 ] || [ -x "${K8S_LOCAL_CACHE:-/var/cache/fiber-k8s}/bin/kubelet" ]; then
    "$top/scripts/k8s-local.sh" build || cannot "the Kubernetes binaries could not be built"
  else
    cannot "building the Kubernetes binaries needs root"
  fi
fi
exit 0
