#!/bin/sh
# Installs the Debian packages fiber needs that are missing, and nothing
# else.  Usage: scripts/deps.sh [build|fuzz|valgrind|python]   (default: build)
set -eu

build_pkgs="cmake make gcc pkg-config libinih-dev libsodium-dev libjansson-dev libcurl4-openssl-dev python3"
fuzz_pkgs="clang libclang-rt-14-dev"
valgrind_pkgs="valgrind"
python_pkgs="python3-dev python3-venv"

case "${1:-build}" in
  build) want="$build_pkgs" ;;
  fuzz)  want="$build_pkgs $fuzz_pkgs" ;;
  valgrind) want="$build_pkgs $valgrind_pkgs" ;;
  python) want="$build_pkgs $python_pkgs" ;;
  *) echo "usage: $0 [build|fuzz|valgrind|python]" >&2; exit 2 ;;
esac

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

[ -z "$missing" ] && exit 0

echo "fiber: installing missing packages:$missing" >&2
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "fiber: need root (or sudo) to install:$missing" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
