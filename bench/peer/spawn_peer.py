#!/usr/bin/env python3
"""spawn_peer.py -- the peer of bench-spawn: Python's multiprocessing.

For the 'spawn' and 'fork' start methods, and N = 1, 16 and 128: start N
Process objects with a no-op target, join them all, and divide the wall
time by N.  Each N is repeated for several rounds; the median is kept.

Progress goes to stderr; stdout holds exactly one line, a JSON object:
{"spawn": {"ms_per_proc_1": .., "ms_per_proc_16": .., "ms_per_proc_128": ..},
 "fork": {...}}, which bench-spawn reads as the last line.
"""
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (found through the line above)

SIZES = (1, 16, 128)
# The same defaults as bench_spawn.c, so both sides do the same work.
DEFAULT_ROUNDS = {1: 7, 16: 7, 128: 5}
METHODS = ("spawn", "fork")


def noop():
    """The task: a module-level function, so 'spawn' children can find it."""


def one_round(ctx, n):
    """Returns ms per process for starting and joining n processes."""
    t0 = time.perf_counter()
    procs = [ctx.Process(target=noop) for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - t0
    # As bench-spawn does: a process that did not exit 0 spoils the figure.
    peer_common.check_exits(procs, "spawn_peer")
    for p in procs:
        p.close()  # release the sentinel descriptors now, untimed
    return elapsed * 1e3 / n


def measure(method, rounds):
    ctx = multiprocessing.get_context(method)
    # Untimed: the first 'spawn' start also launches the resource tracker.
    one_round(ctx, 1)
    result = {}
    for n in SIZES:
        r = rounds or DEFAULT_ROUNDS[n]
        med, lo, hi = peer_common.summarize(
            [one_round(ctx, n) for _ in range(r)])
        result[f"ms_per_proc_{n}"] = round(med, 4)
        peer_common.say(f"mp {method:<5} N={n:<4} {med:8.3f} ms/proc  (min "
                        f"{lo:.3f}, max {hi:.3f}, {r} rounds)")
    return result


def main():
    ap = peer_common.parser(__doc__)
    ap.add_argument("--rounds", type=peer_common.positive_int, default=0,
                    help="rounds per N (default 7, 7 and 5)")
    args = ap.parse_args()
    out = {m: measure(m, args.rounds) for m in METHODS}
    peer_common.emit(out)


if __name__ == "__main__":
    main()
