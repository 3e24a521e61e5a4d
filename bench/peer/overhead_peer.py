#!/usr/bin/env python3
"""overhead_peer.py -- the peer of bench-overhead: multiprocessing.Pool(5).

For each task duration D (ms): 1000 / D rounds of 5 apply_async calls,
waiting for all 5 each round (seq), and one pool.map of 5000 / D tasks with
chunksize=1 (map); the ideal total is 1.0 s.  Each task measures its own
sleep (time.perf_counter around time.sleep) and returns it, so the floor is
measured: for seq the sum over rounds of each round's longest task, for map
the total measured sleep / 5.  Overhead per round = (seq - floor) / rounds.
Each case is repeated; medians are kept.

Progress goes to stderr; stdout holds exactly one line, a JSON object with
seq_<D>ms_s, map_<D>ms_s, floor_<D>ms_s, map_floor_<D>ms_s and
overhead_us_per_round_<D>ms, which bench-overhead reads as the last line.
"""
import multiprocessing
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (found through the line above)

WORKERS = 5


def sleep_task(seconds):
    """Sleeps and returns the sleep as measured inside the worker."""
    t0 = time.perf_counter()
    time.sleep(seconds)
    return time.perf_counter() - t0


def pid_probe(_):
    time.sleep(0.02)
    return os.getpid()


def rounds_for(d_ms):
    return max(1, (1000 + d_ms // 2) // d_ms)


def run_seq(pool, d_ms):
    rounds = rounds_for(d_ms)
    d = d_ms / 1000
    floor = 0.0
    t0 = time.perf_counter()
    for _ in range(rounds):
        rs = [pool.apply_async(sleep_task, (d,)) for _ in range(WORKERS)]
        floor += max(r.get() for r in rs)
    return time.perf_counter() - t0, floor


def run_map(pool, d_ms):
    n = rounds_for(d_ms) * WORKERS
    d = d_ms / 1000
    t0 = time.perf_counter()
    slept = pool.map(sleep_task, [d] * n, chunksize=1)
    return time.perf_counter() - t0, sum(slept) / WORKERS


def main():
    ap = peer_common.parser(__doc__)
    ap.add_argument("--durations", default="1000,100,10,1",
                    help="task durations in ms (default 1000,100,10,1)")
    ap.add_argument("--repeat", type=int, default=5,
                    help="runs per duration and mode (default 5)")
    args = ap.parse_args()
    durations = [int(x) for x in args.durations.split(",") if x]
    out = {}
    with multiprocessing.Pool(WORKERS) as pool:
        # Untimed: every worker answers once before anything is measured.
        seen = set()
        while len(seen) < WORKERS:
            seen.update(pool.map(pid_probe, range(WORKERS), chunksize=1))
        for d_ms in durations:
            seq, floor, ovh, mp, mfloor = [], [], [], [], []
            for _ in range(args.repeat):
                t, f = run_seq(pool, d_ms)
                seq.append(t)
                floor.append(f)
                ovh.append((t - f) / rounds_for(d_ms) * 1e6)
                t, f = run_map(pool, d_ms)
                mp.append(t)
                mfloor.append(f)
            med = statistics.median
            out[f"seq_{d_ms}ms_s"] = round(med(seq), 6)
            out[f"map_{d_ms}ms_s"] = round(med(mp), 6)
            out[f"floor_{d_ms}ms_s"] = round(med(floor), 6)
            out[f"map_floor_{d_ms}ms_s"] = round(med(mfloor), 6)
            out[f"overhead_us_per_round_{d_ms}ms"] = round(med(ovh), 2)
            peer_common.say(
                f"mp     {d_ms:5d} ms x {rounds_for(d_ms) * WORKERS:<5d}  "
                f"seq {med(seq):.4f} s (floor {med(floor):.4f}, "
                f"{med(ovh):.1f} us/round, {min(seq):.4f}..{max(seq):.4f})"
                f"  map {med(mp):.4f} s (floor {med(mfloor):.4f}, "
                f"{min(mp):.4f}..{max(mp):.4f})")
    peer_common.emit(out)


if __name__ == "__main__":
    main()
