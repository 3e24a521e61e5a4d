#!/usr/bin/env python3
"""es_paper_peer.py -- the peer of bench-es (c): multiprocessing.Pool at
the Fiber paper's scale, the policy pickled into every task.

For each W of --workers: Pool(W), then --iters + 1 iterations (the first
untimed) of pool.map over 2,048 records, each a 40-byte header and a
100,000-float policy (400,040 bytes of bytes), with a function that reads
one float of every 1,024 and returns.  Reported per W: the median ms per
iteration and the bytes the parent pickled per iteration.

stdout: one JSON line, {"paper_ms_per_iter_w<W>": .., "paper_master_bytes_
per_iter_w<W>": .., ...}.
"""
import os
import pickle
import statistics
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (found through the line above)

POP, PARAMS, HEAD = 2048, 100000, 40


def task(rec):
    theta = memoryview(rec)[HEAD:].cast("f")
    return sum(theta[::1024]), len(rec)


def main():
    import multiprocessing
    ap = peer_common.parser(__doc__)
    ap.add_argument("--workers", default="1,2,4,16,64")
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args()
    out = {}
    theta = bytearray(PARAMS * 4)
    for w in [int(x) for x in args.workers.split(",")]:
        with multiprocessing.Pool(w) as pool:
            pool.map(task, [bytes(HEAD + 4 * PARAMS)] * w, chunksize=1)
            times, sent = [], 0
            for it in range(args.iters + 1):
                t0 = time.perf_counter()
                struct.pack_into("<f", theta, 4 * (it % PARAMS), float(it))
                recs = [struct.pack("<Q", it) + bytes(HEAD - 8) + theta
                        for _ in range(POP)]
                pool.map(task, recs)
                dt = time.perf_counter() - t0
                if it:
                    times.append(dt * 1e3)
                sent = sum(len(pickle.dumps(r, pickle.HIGHEST_PROTOCOL))
                           for r in recs[:1]) * POP
            out[f"paper_ms_per_iter_w{w}"] = round(statistics.median(times), 2)
            out[f"paper_master_bytes_per_iter_w{w}"] = sent
            peer_common.say(f"peer (c): {w} workers: "
                            f"{statistics.median(times):.1f} ms/iteration")
    peer_common.emit(out)


if __name__ == "__main__":
    main()
