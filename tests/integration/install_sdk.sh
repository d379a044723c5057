#!/usr/bin/env bash
# The installed tree, as an engine and an operator find it: `cmake --install` of the build into
# a staging root (DESTDIR), then the C API's test program (tests/unit/client_c_api_test.c) is
# built twice against the installed SDK only — with `pkg-config --cflags --libs expertd-client`,
# and by a separate CMake project with find_package(expertd CONFIG) (tests/install) — and each
# runs a full session against the installed expertd --demo, every granted byte compared with the
# model file. Also: every file the install rules promise is there, and the installed programs
# and library resolve all their libraries.
#   install_sdk.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

root=$work/root
DESTDIR=$root cmake --install "$build" --prefix /usr > "$work/install.log" \
  || { cat "$work/install.log"; fail "cmake --install"; }
usr=$root/usr
echo "installed $(grep -c Installing "$work/install.log") files under DESTDIR/usr"
for f in bin/expertd bin/expertctl include/expertd/expertd_client.h lib/systemd/system/expertd.service \
         lib/sysusers.d/expertd.conf share/doc/expertd/operations.md; do
  [ -e "$usr/$f" ] || fail "not installed: /usr/$f"
done
lib=$(dirname "$(find "$usr" -name 'libexpertd_client.so' | head -1)")
[ -n "$lib" ] && [ -e "$lib/libexpertd_client.so" ] || fail "libexpertd_client.so not installed"
pc=$(find "$usr" -name expertd-client.pc | head -1)
[ -n "$pc" ] || fail "expertd-client.pc not installed"
[ -n "$(find "$root" -path '*/expertd/expertd.toml')" ] || fail "the default config not installed"
for f in "$usr/bin/expertd" "$usr/bin/expertctl" "$lib/libexpertd_client.so"; do
  if ldd "$f" | grep -q 'not found'; then ldd "$f"; fail "$f does not resolve its libraries"; fi
done
# The shared library exports the C API and nothing else.
others=$(nm -D --defined-only "$lib/libexpertd_client.so" | awk '$2 ~ /^[TDB]$/ {print $3}' |
  grep -v '^EXPERTD_' || true)
[ -z "$others" ] || { echo "$others" | head; fail "the library exports more than EXPERTD_*"; }

echo "== pkg-config"
export PKG_CONFIG_PATH=$(dirname "$pc")
flags=$(pkg-config --cflags --libs expertd-client) || fail "pkg-config expertd-client"
echo "pkg-config --cflags --libs expertd-client: $flags" | sed "s|$root||g"
cc -std=c99 -Wall -Wextra -DEXPERTD_SOURCE_DIR="\"$src\"" "$src/tests/unit/client_c_api_test.c" \
  $flags -Wl,-rpath,"$lib" -o "$work/c_test_pkgconfig" || fail "building against the installed SDK"
"$work/c_test_pkgconfig" --daemon "$usr/bin/expertd" > "$work/pkgconfig.log" 2>&1 \
  || { tail -20 "$work/pkgconfig.log"; fail "the program built with pkg-config"; }
tail -1 "$work/pkgconfig.log"

echo "== find_package(expertd)"
cmake -S "$src/tests/install" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$usr" \
  -DEXPERTD_C_TEST_SOURCE="$src/tests/unit/client_c_api_test.c" -DEXPERTD_SOURCE_DIR="$src" \
  -DCMAKE_BUILD_RPATH="$lib" > "$work/consumer.log" 2>&1 \
  || { cat "$work/consumer.log"; fail "find_package(expertd) in a project of its own"; }
cmake --build "$work/consumer" >> "$work/consumer.log" 2>&1 \
  || { tail -20 "$work/consumer.log"; fail "building the consumer project"; }
"$work/consumer/sdk_c_test" --daemon "$usr/bin/expertd" > "$work/cmake.log" 2>&1 \
  || { tail -20 "$work/cmake.log"; fail "the program built with find_package"; }
tail -1 "$work/cmake.log"
echo "PASS"
