#!/bin/sh
# What `pip install ./python` gives a Python user: the package and the
# `fiber` command in the environment's bin/, built with it.  Then, as a
# user would: a Python pool runs, and that environment's `fiber ps`,
# `fiber top` (in a tmux pane, as on a terminal, and --plain), `fiber
# kill`, `fiber logs` and `fiber clean` show and end it as they do a C
# run; `fiber image build SCRIPT.py` builds the Python program's image
# with the environment's interpreter (needs the Docker Engine).
# Usage: python_pip.sh SOURCE_DIR BUILD_DIR
set -eu
src=$1
build=$2
. "$src/tests/skip.sh"
venv=$build/pip-check
tmp=$(mktemp -d /tmp/fiber-pip-XXXXXX)
sock=fiber-pip-$$
cleanup() {
    tmux -L "$sock" kill-server 2>/dev/null || true
    [ -n "${prog_pid:-}" ] && kill -9 "$prog_pid" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

rm -rf "$venv"
python3 -m venv "$venv"
if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check \
        "$src/python" >"$tmp/pip.log" 2>&1; then
    cat "$tmp/pip.log"
    if grep -qi -e "connection" -e "resolve" -e "network" "$tmp/pip.log"; then
        skip_engine "pip cannot reach PyPI for the build's setuptools"
    fi
    fail "pip install $src/python"
fi
fiber=$venv/bin/fiber
[ -x "$fiber" ] || fail "pip install put no fiber command in $venv/bin"
out=$("$fiber" version) || fail "fiber version"
want=$("$venv/bin/python" -c 'import fiber; print(fiber.__version__)')
[ "$out" = "fiber $want" ] || fail "fiber version says '$out', the package is $want"
echo "ok: $fiber: $out"

# A Python pool that runs until told to stop, on the local backend.
cat >"$tmp/prog.py" <<'EOF'
import os, sys, time
import fiber

def task(x):
    time.sleep(0.02)
    print("task", x, flush=True)
    return x

if __name__ == "__main__":
    stop = sys.argv[1]
    with fiber.Pool(2) as pool:
        pool.map(task, range(4))
        with open(sys.argv[2] + ".tmp", "w") as f:
            f.write(fiber.run_id())
        os.rename(sys.argv[2] + ".tmp", sys.argv[2])
        while not os.path.exists(stop):
            pool.map(task, range(20))
EOF
cd "$tmp"
FIBER_BACKEND=local FIBER_LOG_LEVEL=debug "$venv/bin/python" prog.py "$tmp/stop" "$tmp/run" \
    >"$tmp/prog.out" 2>&1 &
prog_pid=$!
i=0
while [ ! -s "$tmp/run" ]; do
    i=$((i + 1))
    [ $i -le 600 ] || { cat "$tmp/prog.out"; fail "the Python pool did not start in 60 s"; }
    kill -0 $prog_pid 2>/dev/null || { cat "$tmp/prog.out"; fail "the Python program ended early"; }
    sleep 0.1
done
run=$(cat "$tmp/run")
echo "ok: a Python run $run is up"

ps_out=$("$fiber" ps "$run") || fail "fiber ps $run"
echo "$ps_out"
for job in master Pool1-Worker-1 Pool1-Worker-2; do
    echo "$ps_out" | grep -q "^ *$job .*running" ||
        fail "fiber ps $run does not show $job running"
done

top_out=$("$fiber" top --plain -n 3 -d 300 "$run") || fail "fiber top --plain $run"
echo "$top_out"
echo "$top_out" | grep -q "Pool1" || fail "fiber top --plain shows no Pool1 line"

if command -v tmux >/dev/null 2>&1; then
    tmux -L "$sock" -f /dev/null new-session -d -s top -x 150 -y 40 \
        "$fiber top $run; sleep 600"
    i=0
    screen=
    while :; do
        screen=$(tmux -L "$sock" capture-pane -p -t top)
        echo "$screen" | grep -q "^Pool1" && break
        i=$((i + 1))
        [ $i -le 100 ] || { echo "$screen"; fail "fiber top in tmux never showed Pool1's row"; }
        sleep 0.1
    done
    echo "$screen" | sed -n '1,12p'
    tmux -L "$sock" send-keys -t top q
    echo "ok: fiber top on a terminal shows the Python pool"
elif under_ci; then
    fail "tmux is not installed (scripts/deps.sh installs it)"
else
    echo "note: no tmux; fiber top checked with --plain only"
fi

# What the workers logged (log_level debug): fiber's log lines, one file
# per job; their print()s go to the master's output.
"$fiber" logs "$run" >"$tmp/logs" 2>&1 || { cat "$tmp/logs"; fail "fiber logs $run"; }
grep -q "^==> Pool1-Worker-1 <==" "$tmp/logs" && grep -q "Pool1-Worker-1\[" "$tmp/logs" ||
    { cat "$tmp/logs"; fail "fiber logs $run shows nothing Pool1-Worker-1 logged"; }
grep -q "^task " "$tmp/prog.out" || { head "$tmp/prog.out"; fail "the workers' output is not in the master's"; }
echo "ok: fiber logs shows what the Python workers logged"

"$fiber" kill "$run" || fail "fiber kill $run"
i=0
while kill -0 $prog_pid 2>/dev/null; do
    i=$((i + 1))
    [ $i -le 300 ] || fail "fiber kill did not end the Python master in 30 s"
    sleep 0.1
done
wait $prog_pid && fail "the killed Python master exited 0" || true
prog_pid=
"$fiber" ps "$run" | grep -q dead || fail "fiber ps does not show $run dead after fiber kill"
"$fiber" clean "$run" || fail "fiber clean $run"
"$fiber" ps "$run" >/dev/null 2>&1 && fail "fiber ps still finds $run after fiber clean"
echo "ok: fiber kill and clean end and remove the Python run"

# The image of a Python program, with this environment's interpreter.
if ! "$fiber" doctor 2>&1 | grep -q "^docker *ok"; then
    skip_engine "the Docker Engine is not reachable: fiber image build SCRIPT.py not checked"
fi
tag=fiber-test/pip-prog:ci
"$fiber" image build "$tmp/prog.py" --tag "$tag" >"$tmp/image.out" 2>&1 ||
    { cat "$tmp/image.out"; fail "fiber image build prog.py"; }
grep -q "$tag" "$tmp/image.out" || { cat "$tmp/image.out"; fail "fiber image build did not name $tag"; }
docker image inspect "$tag" >/dev/null || fail "no image $tag after fiber image build"
docker run --rm --entrypoint "$venv/bin/python" "$tag" -c \
    'import fiber, sys; print("in-image", fiber.__version__, sys.prefix)' >"$tmp/run.out" 2>&1 ||
    { cat "$tmp/run.out"; fail "the image cannot import fiber with the environment's interpreter"; }
docker image rm -f "$tag" >/dev/null
grep -q "in-image $want $venv" "$tmp/run.out" || { cat "$tmp/run.out"; fail "the image's interpreter is not $venv's"; }
echo "ok: fiber image build prog.py made an image with $venv's interpreter and fiber"
