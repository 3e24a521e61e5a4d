#!/usr/bin/env python3
"""pipe_peer.py -- the peer of bench-pipe: multiprocessing.Pipe.

The same shapes as bench_pipe.c, with a duplex multiprocessing.Pipe() and
one forked child: one-way messages per second (the master sends "go", the
child sends --messages 64-byte messages with send_bytes and a 1-byte end
marker; timed from go to the end marker, median of --runs runs) and the
round trip of one 64-byte message (--samples after a warm-up).

Progress goes to stderr; stdout holds exactly one line, a JSON object:
{"msgs_per_s_pipe": .., "pipe_rtt_median_us": .., "pipe_rtt_p99_us": ..}.
"""
import multiprocessing as mp
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (found through the line above)

MSG = b"\0" * 64
WARMUP = 200  # as in bench_pipe.c


def child(conn, messages, samples):
    while True:
        cmd = conn.recv_bytes()
        if cmd == b"s":
            return
        if cmd == b"g":
            for _ in range(messages):
                conn.send_bytes(MSG)
            conn.send_bytes(b"e")
            continue
        for _ in range(samples + WARMUP):
            conn.send_bytes(conn.recv_bytes())


def main():
    ap = peer_common.parser(__doc__)
    ap.add_argument("--messages", type=peer_common.positive_int,
                    default=1000000)
    ap.add_argument("--runs", type=peer_common.positive_int, default=3)
    ap.add_argument("--samples", type=peer_common.positive_int, default=5000)
    a = ap.parse_args()
    ctx = mp.get_context("fork")
    mine, theirs = ctx.Pipe(duplex=True)
    p = ctx.Process(target=child, args=(theirs, a.messages, a.samples))
    p.start()
    rates = []
    for r in range(a.runs):
        t0 = time.monotonic_ns()
        mine.send_bytes(b"g")
        got = 0
        while len(mine.recv_bytes()) != 1:
            got += 1
        t1 = time.monotonic_ns()
        assert got == a.messages, (got, a.messages)
        rates.append(a.messages / ((t1 - t0) / 1e9))
        peer_common.say("mp.Pipe run %d: %12.0f msgs/s" % (r + 1, rates[-1]))
    mine.send_bytes(b"r")
    rtt = []
    for i in range(a.samples + WARMUP):
        t0 = time.monotonic_ns()
        mine.send_bytes(MSG)
        mine.recv_bytes()
        if i >= WARMUP:
            rtt.append((time.monotonic_ns() - t0) / 1e3)
    mine.send_bytes(b"s")
    p.join()
    rtt.sort()
    peer_common.say("mp.Pipe round trip: median %.1f us, p99 %.1f us"
                    % (statistics.median(rtt),
                       peer_common.nearest_rank(rtt, 99)))
    peer_common.emit({"msgs_per_s_pipe": statistics.median(rates),
                      "pipe_rtt_median_us": statistics.median(rtt),
                      "pipe_rtt_p99_us": peer_common.nearest_rank(rtt, 99)})


if __name__ == "__main__":
    main()
