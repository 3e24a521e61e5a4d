#!/bin/sh
# The wheel installs anywhere: scripts/wheel.sh builds it; `auditwheel
# show` must name a manylinux tag; installed into a fresh virtual
# environment, its extension and its `fiber` command load the copies of
# libsodium, libinih and libjansson inside the wheel, not the system's;
# and a FROM-scratch image holding only the interpreter (with its
# standard library and the libraries it loads) and that environment runs
# a Pool.map in a container, with no libsodium, libinih or libjansson
# from the system in the image.
# Usage: python_wheel.sh SOURCE_DIR BUILD_DIR
set -eu
src=$1
build=$2
. "$src/tests/skip.sh"
tmp=$(mktemp -d /tmp/fiber-wheel-XXXXXX)
tag=fiber-test/wheel-prog:ci
trap 'rm -rf "$tmp"; docker image rm -f "$tag" >/dev/null 2>&1 || true' EXIT
fail() { echo "FAIL: $*"; exit 1; }

out=$build/wheelhouse
"$src/scripts/wheel.sh" "$out" >"$tmp/wheel.log" 2>&1 ||
    { cat "$tmp/wheel.log"; fail "scripts/wheel.sh"; }
whl=$(tail -n 1 "$tmp/wheel.log")
[ -f "$src/$whl" ] && whl=$src/$whl
[ -f "$whl" ] || { cat "$tmp/wheel.log"; fail "scripts/wheel.sh made no wheel"; }
show=$(PATH="$build/venv-wheel/bin:$PATH" "$build/venv-wheel/bin/auditwheel" show "$whl" 2>&1 | tr '\n' ' ')
echo "$show" | grep -q 'consistent with the following platform tag: "manylinux_[0-9_]*x86_64"' ||
    { echo "$show"; fail "auditwheel show names no manylinux tag for $whl"; }
echo "ok: $(basename "$whl"): $(echo "$show" | sed 's/.*platform tag: "\([^"]*\)".*/\1/')"

venv=$build/wheel-check
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
    --no-index "$whl" || fail "pip install $whl"
site=$("$venv/bin/python" -c 'import fiber, os; print(os.path.dirname(os.path.dirname(fiber.__file__)))')
for elf in "$site"/fiber/_fiber*.so "$site/fiber/_bin/fiber"; do
    ldd "$elf" >"$tmp/ldd" || fail "ldd $elf"
    for lib in libsodium libinih libjansson; do
        grep "$lib" "$tmp/ldd" | grep -q "=> $site/.*fiber.libs/$lib" ||
            { cat "$tmp/ldd"; fail "$elf does not load the wheel's own $lib"; }
    done
done
"$venv/bin/fiber" version >/dev/null || fail "the wheel's fiber command does not run"
echo "ok: the extension and the fiber command load the wheel's own libraries"

if ! "$venv/bin/fiber" doctor 2>&1 | grep -q "^docker *ok"; then
    skip_engine "the Docker Engine is not reachable: the wheel was not run in a scratch image"
fi
mkdir "$tmp/prog"
cat >"$tmp/prog/prog.py" <<'EOF'
import fiber

def square(x):
    return x * x

if __name__ == "__main__":
    with fiber.Pool(2) as pool:
        print("sum", sum(pool.map(square, range(100))))
EOF
"$venv/bin/python" -m fiber.image build "$tmp/prog/prog.py" --tag "$tag" \
    >"$tmp/image.log" 2>&1 || { cat "$tmp/image.log"; fail "python -m fiber.image build"; }
docker image inspect "$tag" >/dev/null || fail "no image $tag"
cid=$(docker create "$tag" /bin/none)
docker export "$cid" | tar -t >"$tmp/files"
docker rm "$cid" >/dev/null
n=$(wc -l <"$tmp/files")
if grep -E "(^|/)lib(sodium|inih|jansson)[^/]*$" "$tmp/files" | grep -v "fiber.libs/" >"$tmp/system-libs"; then
    cat "$tmp/system-libs"
    fail "the image holds the system's copies of libraries the wheel carries"
fi
grep -q "fiber.libs/libsodium" "$tmp/files" || fail "the image lacks the wheel's libsodium"
echo "ok: the image holds $n files, the wheel's libraries and none of the system's"
docker run --rm --entrypoint "$venv/bin/python" -e FIBER_BACKEND=local \
    "$tag" "$tmp/prog/prog.py" >"$tmp/run.out" 2>&1 ||
    { cat "$tmp/run.out"; fail "the program did not run in the scratch image"; }
grep -qx "sum 328350" "$tmp/run.out" || { cat "$tmp/run.out"; fail "the pool's answer in the image is wrong"; }
echo "ok: Pool.map from the wheel ran in a FROM-scratch image: $(cat "$tmp/run.out")"
