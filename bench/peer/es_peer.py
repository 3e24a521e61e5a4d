#!/usr/bin/env python3
"""es_peer.py -- the peer of bench-es (b): Python's multiprocessing.Pool.

The master loop of one evolution-strategies iteration with a population of
--pop mirrored pairs, at 1, 2, 4, ... --max-workers pool workers: pack one
record per pair (the same 40-byte header and float arrays as the C
example's struct es_task: 97 policy parameters and the observation
mean/std of the cart-pole policy), pool.map a trivial function over them
that returns two "returns" derived from the record's seed, then rank the
2*pop returns (centered ranks) and form the pair weights.  No environment
runs, so the whole iteration is overhead.  The C side also computes the
gradient and an Adam step; this peer does not (no numpy here, and a
pure-Python gradient would measure the interpreter, not the pool), so the
comparison, if anything, favours the peer.

Workers start with the default start method ('fork' on Linux).  The first
--warmup iterations of each pool are not timed; the median and the fastest
of the others are reported.

Progress goes to stderr; stdout holds exactly one line, a JSON object
{"overhead_ms_per_iter_w1": .., "overhead_min_ms_per_iter_w1": .., ...},
which bench-es reads as the last line.
"""
import array
import multiprocessing
import os
import random
import statistics
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (found through the line above)

# struct es_task: magic, env_id, kind, nparams, obs_dim, hidden,
# noise_offset, sigma, episodes, seed -- 40 bytes, as in rollout.h.
HEADER = struct.Struct("<IHHIIIIfIQ")
MAGIC = 0x31545345
OBS_DIM, HIDDEN, ACT_DIM = 4, 16, 1
NPARAMS = HIDDEN * OBS_DIM + HIDDEN + ACT_DIM * HIDDEN + ACT_DIM  # 97
NOISE_N = 1 << 18


def trivial(rec):
    """The task: read the seed, answer two pseudo-returns."""
    seed = HEADER.unpack_from(rec)[9]
    return (float(seed & 0xFFFF), float((seed >> 16) & 0xFFFF))


def centered_ranks(x):
    order = sorted(range(len(x)), key=x.__getitem__)
    ranks = [0.0] * len(x)
    scale = 1.0 / (len(x) - 1)
    for r, i in enumerate(order):
        ranks[i] = r * scale - 0.5
    return ranks


def one_iteration(pool, rng, theta, pop):
    """Returns the iteration's wall time in seconds."""
    t0 = time.perf_counter()
    body = array.array("f", theta).tobytes() + array.array(
        "f", [0.0] * OBS_DIM + [1.0] * OBS_DIM).tobytes()
    recs = [HEADER.pack(MAGIC, 0, 1, NPARAMS, OBS_DIM, HIDDEN,
                        rng.randrange(NOISE_N - NPARAMS + 1), 0.1, 1,
                        rng.getrandbits(64)) + body for _ in range(pop)]
    results = pool.map(trivial, recs)
    returns = [r for pair in results for r in pair]
    ranks = centered_ranks(returns)
    weights = [ranks[2 * i] - ranks[2 * i + 1] for i in range(pop)]
    assert len(weights) == pop
    return time.perf_counter() - t0


def measure(workers, pop, iters, warmup):
    rng = random.Random(2)
    theta = [rng.gauss(0.0, 1.0) for _ in range(NPARAMS)]
    t0 = time.perf_counter()
    with multiprocessing.Pool(workers) as pool:
        times = [one_iteration(pool, rng, theta, pop)
                 for _ in range(warmup + iters)][warmup:]
    ms, fastest = statistics.median(times) * 1e3, min(times) * 1e3
    peer_common.say(f"  {workers:4d} workers: {ms:8.2f} ms/iteration, "
                    f"fastest {fastest:.2f} ({iters} iterations, run "
                    f"{time.perf_counter() - t0:.1f} s with start-up)")
    return ms, fastest


def main():
    ap = peer_common.parser(__doc__)
    ap.add_argument("--max-workers", type=peer_common.positive_int,
                    default=512)
    ap.add_argument("--pop", type=peer_common.positive_int, default=2048,
                    help="pairs per iteration (default 2048)")
    ap.add_argument("--iters", type=peer_common.positive_int, default=20,
                    help="timed iterations per worker count (default 20)")
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    out = {}
    w = 1
    while w <= args.max_workers:
        ms, fastest = measure(w, args.pop, args.iters, args.warmup)
        out[f"overhead_ms_per_iter_w{w}"] = round(ms, 4)
        out[f"overhead_min_ms_per_iter_w{w}"] = round(fastest, 4)
        w *= 2
    peer_common.emit(out)


if __name__ == "__main__":
    main()
