#!/usr/bin/env python3
"""broadcast_peer.py -- the peer of bench-broadcast: multiprocessing.Pool(N)
with the object in each task's argument.

For each N of --workers and each size (1 MiB, 64 MiB): a Pool(N) that has
run one trivial task per worker, then one pool.map(digest, [blob] * N,
chunksize=1): every task unpickles the blob and reads a word of each 4 KiB
page (the checksum bench-broadcast's tasks compute).  time_s is that
map; master_bytes is what the parent had to send, N pickles of the blob
(N * size plus pickle framing, counted from the pickles themselves).
A case whose N copies would not fit in half of MemAvailable is skipped
(null), as bench-broadcast does.

Progress goes to stderr; stdout holds one JSON line with the keys
time_s_<size>_w<N> and master_bytes_<size>_w<N>.
"""
import multiprocessing
import os
import pickle
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (found through the line above)

SIZES = [("1mib", 1 << 20), ("64mib", 64 << 20)]


def noop(_):
    return os.getpid()


def page_sum(blob):
    """One 8-byte word of every 4 KiB page, as bench-broadcast's tasks read
    them (the same checksum: sum = sum * 31 + word, mod 2**64)."""
    words = memoryview(blob).cast("Q")[::512]
    s = 0
    for w in words:
        s = (s * 31 + w) & 0xFFFFFFFFFFFFFFFF
    return s


def digest(blob):
    return page_sum(blob), os.getpid()


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    ap = peer_common.parser(__doc__)
    ap.add_argument("--workers", default="8,64,512")
    args = ap.parse_args()
    out = {}
    for n in [int(w) for w in args.workers.split(",")]:
        with multiprocessing.Pool(n) as pool:
            pool.map(noop, range(n), chunksize=1)
            for name, size in SIZES:
                key = f"{name}_w{n}"
                if n * size > mem_available() // 2:
                    peer_common.say(f"peer: {key}: skipped, {n} copies of "
                                    f"{size} bytes exceed half of MemAvailable")
                    out[f"time_s_{key}"] = None
                    out[f"master_bytes_{key}"] = None
                    continue
                blob = os.urandom(size)
                want = page_sum(blob)
                t0 = time.perf_counter()
                got = pool.map(digest, [blob] * n, chunksize=1)
                dt = time.perf_counter() - t0
                if any(h != want for h, _ in got):
                    sys.exit("peer: a worker got different bytes")
                out[f"time_s_{key}"] = round(dt, 4)
                out[f"master_bytes_{key}"] = n * len(
                    pickle.dumps(blob, protocol=pickle.HIGHEST_PROTOCOL))
                peer_common.say(f"peer: {key}: {dt:.3f} s")
    peer_common.emit(out)


if __name__ == "__main__":
    main()
