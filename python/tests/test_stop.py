"""fiber.on_stop_requested, fiber.stop_requested and fiber.resumed: a
second master (a script) signalled as a cluster would signal it."""
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import HERE, PKG

pytestmark = pytest.mark.local_only  # signals the master's own process

ARMED = r'''
import os, signal, sys, threading, time
import fiber
import helpers

calls = []

def on_stop(sig):
    with fiber.Pool(1) as pool:          # fiber works from the callback
        squared = pool.apply(helpers.square, (7,))
    calls.append(sig)
    print("cb sig=%d main=%s pool=%d" % (
        sig, threading.current_thread() is threading.main_thread(), squared),
        flush=True)
    if os.environ.get("BLOCK"):
        while True:
            time.sleep(1)

if __name__ == "__main__":
    assert fiber.on_stop_requested(on_stop) is on_stop
    print("ready flag=%d" % fiber.stop_requested(), flush=True)
    while not fiber.stop_requested():
        time.sleep(0.01)
    print("flag=%d" % fiber.stop_requested(), flush=True)
    while not calls:
        time.sleep(0.01)
    time.sleep(0.3)   # room for a second call that must not come
    print("done calls=%d" % len(calls), flush=True)
'''


def start(tmp_path, source, env=None):
    path = tmp_path / "prog.py"
    path.write_text(source)
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(
        [PKG, HERE] + [p for p in [e.get("PYTHONPATH")] if p])
    e.update(env or {})
    return subprocess.Popen([sys.executable, str(path)], cwd=str(tmp_path),
                            env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def expect(proc, needle, timeout=30):
    """Reads proc's lines until one contains needle; returns what it read."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return "".join(seen)
    proc.kill()
    pytest.fail("no %r; the program said: %s" % (needle, "".join(seen)))


def test_sigterm_calls_the_callback_once_on_another_thread(tmp_path):
    proc = start(tmp_path, ARMED)
    expect(proc, "ready flag=0")
    proc.send_signal(signal.SIGTERM)
    out = expect(proc, "cb sig=15 main=False pool=49")
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out + rest
    assert "flag=15" in out + rest
    assert "done calls=1" in rest


def test_usr1_asks_once_and_later_usr1s_are_ignored(tmp_path):
    proc = start(tmp_path, ARMED)
    expect(proc, "ready flag=0")
    for _ in range(3):
        proc.send_signal(signal.SIGUSR1)
    out = expect(proc, "cb sig=10 main=False pool=49")
    proc.send_signal(signal.SIGUSR1)
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out + rest
    assert (out + rest).count("cb sig=") == 1
    assert "done calls=1" in rest


def test_a_second_sigterm_ends_the_program(tmp_path):
    proc = start(tmp_path, ARMED, env={"BLOCK": "1"})
    expect(proc, "ready flag=0")
    proc.send_signal(signal.SIGTERM)
    expect(proc, "cb sig=15")           # the callback now blocks for good
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM


def test_unarmed_sigterm_ends_the_program_as_before(tmp_path):
    proc = start(tmp_path, "import fiber, time\n"
                 "print('ready', fiber.stop_requested(), flush=True)\n"
                 "time.sleep(60)\n")
    expect(proc, "ready 0")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM


def test_an_exception_in_the_callback_is_reported_not_fatal(tmp_path):
    proc = start(tmp_path, r'''
import time, fiber
def bad(sig):
    raise ValueError("no room for the checkpoint")
fiber.on_stop_requested(bad)
fiber.on_stop_requested()           # arming again without a callback: fine
print("ready", flush=True)
while not fiber.stop_requested():
    time.sleep(0.01)
time.sleep(0.5)
print("survived", flush=True)
''')
    expect(proc, "ready")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "no room for the checkpoint" in out
    assert "survived" in out


def test_bad_arguments_and_jobs_are_refused(script):
    r = script(r'''
import fiber
def arm_in_job(_):
    try:
        fiber.on_stop_requested(print)
    except RuntimeError as e:
        return "RuntimeError: " + str(e)[:40]
if __name__ == "__main__":
    try:
        fiber.on_stop_requested(42)
    except TypeError as e:
        print("TypeError:", e)
    with fiber.Pool(1) as p:
        print(p.apply(arm_in_job, (0,)))
''')
    assert r.returncode == 0, r.stdout + r.stderr
    assert "TypeError: on_stop_requested: the callback must be callable" \
        in r.stdout
    assert "RuntimeError: fiber.on_stop_requested(): only the" in r.stdout


@pytest.mark.parametrize("env,want", [
    ({}, "resumed=0"),
    ({"FIBER_RESUMED": "2"}, "resumed=2"),
    ({"SLURM_RESTART_COUNT": "5"}, "resumed=5"),
])
def test_resumed_counts_restarts(script, env, want):
    e = {k: v for k, v in env.items()}
    clean = {"FIBER_RESUMED": "", "SLURM_RESTART_COUNT": ""}
    clean.update(e)
    src = ("import os\n"
           "for k in %r:\n"
           "    if not os.environ.get(k): os.environ.pop(k, None)\n"
           "import fiber\n"
           "print('resumed=%%d' %% fiber.resumed())\n" % list(clean))
    r = script(src, env=clean)
    assert r.returncode == 0, r.stdout + r.stderr
    assert want in r.stdout
