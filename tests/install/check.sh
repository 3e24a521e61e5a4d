#!/bin/sh
# Installs fiber with `make install PREFIX=... DESTDIR=...` into a scratch
# directory, then builds and runs a small program against the installed
# copy: with pkg-config (shared and static) and with CMake's find_package.
# Usage: check.sh SOURCE_DIR BUILD_DIR
set -eu
src=$1
build=$2
tmp=$(mktemp -d /tmp/fiber-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=/opt/fiber-check

make -s -C "$src" install BUILD="$build" PREFIX="$prefix" DESTDIR="$tmp/root" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; echo "FAIL: make install"; exit 1; }

root="$tmp/root$prefix"
for f in include/fiber/fiber.h lib/libfiber.so lib/libfiber.a \
         lib/pkgconfig/fiber.pc lib/cmake/fiber/fiberConfig.cmake; do
  [ -e "$root/$f" ] || { echo "FAIL: $f was not installed"; ls -R "$tmp/root"; exit 1; }
done

export PKG_CONFIG_PATH="$root/lib/pkgconfig"
cc -o "$tmp/consumer" "$src/tests/install/consumer.c" $(pkg-config --cflags --libs fiber)
LD_LIBRARY_PATH="$root/lib" "$tmp/consumer"

cc -o "$tmp/consumer_static" "$src/tests/install/consumer.c" \
   $(pkg-config --cflags fiber) "$root/lib/libfiber.a" $(pkg-config --static --libs libsodium inih) \
   $(pkg-config --libs jansson) -ldl -lpthread
"$tmp/consumer_static"

cmake -S "$src/tests/install" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$root" >"$tmp/cmake.log" 2>&1 ||
  { cat "$tmp/cmake.log"; echo "FAIL: find_package(fiber)"; exit 1; }
cmake --build "$tmp/cmake-build" >"$tmp/cmake-build.log" 2>&1 ||
  { cat "$tmp/cmake-build.log"; echo "FAIL: building against fiber::fiber"; exit 1; }
LD_LIBRARY_PATH="$root/lib" "$tmp/cmake-build/consumer_cmake"
echo "install check passed"
