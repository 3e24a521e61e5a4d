#!/bin/sh
# layers_test.sh -- scripts/check-layers.py fails, naming the file and the
# include, on a tree that reaches up or names a backend where it should
# not, and passes a tree that does neither.  ctest scripts.layers_check.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
mkdir -p "$tmp/src/net" "$tmp/src/runtime" "$tmp/src/backend/slurm" \
         "$tmp/src/pool"
printf '#include "base/common.h"\n' >"$tmp/src/net/ok.c"
printf '/* slurm in a comment is fine */\nint x;\n' >"$tmp/src/pool/ok.c"
printf '#include "runtime/config.h"\n' >"$tmp/src/backend/slurm/ok.c"
# the clean tree passes but for the allow-list entries it no longer needs
out=$(python3 "$top/scripts/check-layers.py" "$tmp")
echo "$out" | grep -v '^ALLOWED entry' | grep -q '^src/' &&
    { echo "FAIL a clean tree has problems:"; echo "$out"; failed=1; }
printf '#include "runtime/runtime.h"\n' >"$tmp/src/net/up.c"
printf 'const char *b = "slurm";\n' >"$tmp/src/runtime/name.c"
printf '#include "backend/slurm/slurm.h"\n' >"$tmp/src/pool/reach.c"
printf '#include "runtime/runtime.h"\n' >"$tmp/src/backend/slurm/rt.c"
printf '#include "net/conn_int.h"\n' >"$tmp/src/net/own.c"
printf '#include "net/conn_int.h"\n' >"$tmp/src/pool/peek.c"
mkdir -p "$tmp/tests/unit"
printf '#include "net/conn_int.h"\n' >"$tmp/tests/unit/peek.c"
out=$(python3 "$top/scripts/check-layers.py" "$tmp")
rc=$?
[ $rc -eq 1 ] || { echo "FAIL exit status $rc, not 1"; failed=1; }
for want in 'src/net/up.c:1: #include "runtime/runtime.h": net/ (layer 2)' \
            'src/runtime/name.c:1: a backend'"'"'s name outside backend/: "slurm"' \
            'src/pool/reach.c:1: #include "backend/slurm/slurm.h": names backend slurm' \
            'src/backend/slurm/rt.c:1: #include "runtime/runtime.h": a backend takes' \
            'src/pool/peek.c:1: #include "net/conn_int.h": private to src/net/' \
            'tests/unit/peek.c:1: #include "net/conn_int.h": private to src/net/'; do
    if echo "$out" | grep -qF "$want"; then echo "ok   $want"
    else echo "FAIL not reported: $want"; failed=1; fi
done
if echo "$out" | grep -q '^src/net/own.c'; then
    echo "FAIL net/'s own file reported for its private header"; failed=1
fi
[ $failed -eq 0 ] || { echo "$out"; exit 1; }
