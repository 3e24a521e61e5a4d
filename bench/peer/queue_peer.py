#!/usr/bin/env python3
"""queue_peer.py -- the peer of bench-queue: multiprocessing.Queue.

The same shapes as bench_queue.c: messages per second between 1 producer
and 1 consumer process and between 4 producers and 4 consumers (64-byte
bytes objects, a queue of maxsize --capacity, timed from the first put of
any producer to the last get of any consumer, with process start-up
excluded by a ready/go handshake), each the median of --runs runs; and the
put-to-get latency with one message in flight (the producer stamps the
message with time.monotonic_ns(), i.e. CLOCK_MONOTONIC, and waits for an
acknowledgement on a second queue before sending the next).

Progress goes to stderr; stdout holds exactly one line, a JSON object:
{"msgs_per_s_1x1": .., "msgs_per_s_4x4": .., "latency_median_us": ..,
 "latency_p99_us": ..}, which bench-queue reads as the last line.
"""
import multiprocessing as mp
import os
import statistics
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (found through the line above)

MSG_BYTES = 64
LAT_WARMUP = 100  # as in bench_queue.c
PAD = b"\0" * (MSG_BYTES - 16)
END = None  # the end marker


def msg(seq, stamp):
    """A 64-byte message: sequence number, stamp, padding."""
    return struct.pack("<QQ", seq, stamp) + PAD


def producer(data, ctl, go, count):
    ctl.put(("ready",))
    go.get()
    first = time.monotonic_ns()
    m = msg(0, 0)
    for i in range(count):
        data.put(m)
    data.put(END)
    ctl.put(("result", "producer", count, first, 0))


def consumer(data, ctl):
    ctl.put(("ready",))
    n = 0
    last = 0
    while True:
        m = data.get()
        if m is END:
            break
        n += 1
        last = time.monotonic_ns()
    ctl.put(("result", "consumer", n, 0, last))


def lat_producer(data, ctl, go, ack, count):
    ctl.put(("ready",))
    go.get()
    for i in range(count + LAT_WARMUP):
        data.put(msg(i, time.monotonic_ns()))
        ack.get()
    data.put(END)
    ctl.put(("result", "producer", count, 0, 0))


def lat_consumer(data, ctl, ack):
    ctl.put(("ready",))
    lat = []
    i = 0
    while True:
        m = data.get()
        now = time.monotonic_ns()
        if m is END:
            break
        _, stamp = struct.unpack_from("<QQ", m)
        if i >= LAT_WARMUP:
            lat.append((now - stamp) / 1e3)
        i += 1
        ack.put(b"a")
    ctl.put(("result", "consumer", len(lat), 0, 0, lat))


def run_once(np, nc, messages, capacity, latency=False):
    data = mp.Queue(maxsize=capacity)
    ctl, go, ack = mp.Queue(), mp.Queue(), mp.Queue()
    procs = []
    for _ in range(nc):
        if latency:
            procs.append(mp.Process(target=lat_consumer,
                                    args=(data, ctl, ack)))
        else:
            procs.append(mp.Process(target=consumer, args=(data, ctl)))
    for i in range(np):
        count = messages // np + (1 if i < messages % np else 0)
        if latency:
            procs.append(mp.Process(target=lat_producer,
                                    args=(data, ctl, go, ack, messages)))
        else:
            procs.append(mp.Process(target=producer,
                                    args=(data, ctl, go, count)))
    for p in procs:
        p.start()
    for _ in procs:
        ctl.get(timeout=120)
    for _ in range(np):
        go.put(1)
    results = [ctl.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join()
    peer_common.check_exits(procs, "queue_peer")
    if latency:
        lat = sorted(next(r[5] for r in results if r[1] == "consumer"))
        return statistics.median(lat), peer_common.nearest_rank(lat, 99)
    put = sum(r[2] for r in results if r[1] == "producer")
    got = sum(r[2] for r in results if r[1] == "consumer")
    if put != messages or got != messages:
        sys.exit(f"queue_peer: {put} put, {got} got, want {messages}")
    first = min(r[3] for r in results if r[1] == "producer")
    last = max(r[4] for r in results if r[1] == "consumer")
    return messages / ((last - first) / 1e9)


def main():
    ap = peer_common.parser(__doc__)
    ap.add_argument("--messages", type=peer_common.positive_int,
                    default=1000000)
    ap.add_argument("--runs", type=peer_common.positive_int, default=3)
    ap.add_argument("--samples", type=peer_common.positive_int, default=2000)
    ap.add_argument("--capacity", type=peer_common.positive_int, default=1024)
    args = ap.parse_args()
    out = {}
    for shape in (1, 4):
        rates = []
        for r in range(args.runs):
            rates.append(run_once(shape, shape, args.messages, args.capacity))
            peer_common.say(f"mp.Queue {shape}x{shape} run {r + 1}: "
                            f"{rates[-1]:10.0f} msgs/s")
        out[f"msgs_per_s_{shape}x{shape}"] = round(statistics.median(rates), 1)
    med, p99 = run_once(1, 1, args.samples, args.capacity, latency=True)
    peer_common.say(f"mp.Queue latency: median {med:.1f} us, p99 {p99:.1f} "
                    f"us ({args.samples} samples)")
    out["latency_median_us"] = round(med, 2)
    out["latency_p99_us"] = round(p99, 2)
    peer_common.emit(out)


if __name__ == "__main__":
    mp.set_start_method("fork")
    main()
