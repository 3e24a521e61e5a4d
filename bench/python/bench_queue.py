"""fiber.Queue and fiber.SimpleQueue against multiprocessing's (spawn
context), measured in the same run: messages per second with 64-byte
messages between 1 producer and 1 consumer process and between 4 and 4,
and the put-to-get latency with one message in flight.

    build/venv/bin/python bench/python/bench_queue.py [--messages 200000]
        [--repeat 1] [--samples 5000] [--maxsize 0] [--quick]

The shapes are bench-queue's (bench/bench_queue.c) and its peer's
(bench/peer/queue_peer.py), from Python: every producer and consumer is a
Process of the library measured (fiber.Process, or multiprocessing's);
each says it is ready on a control queue, and the producers wait for a
"go", so process start-up is not timed.  The producers put --messages
64-byte bytes objects between them, then wait until their puts are in
the queue (close and join_thread, where the queue has them) and say so;
once every producer has, the master puts one end marker (None) per
consumer, behind all the messages, and a consumer takes messages until
it sees an end marker.  (Had each producer put its own marker, a fast
producer's marker could stop a consumer while a slower producer's
messages were still coming, and with 4 consumers the last messages could
be left in the queue.)  The rate is
messages / (last get of any consumer - first put of any producer), both
read from time.monotonic_ns() (CLOCK_MONOTONIC, shared by the processes
of one machine); with --repeat N each figure is the median of N runs.
The queue is unbounded unless --maxsize is given (multiprocessing's
default, and the case the batching is for: a bounded fiber Queue puts
one message per round trip so that put blocks while it is full).

--payload bytearray puts the same 64 bytes as a bytearray: fiber's
queues write a bytes object (as any None, bool, int, float, str, and a
tuple of them) in their own compact encoding (python/src/codec.c) and
pickle everything else, a bytearray among them; this measures the
pickled path.  multiprocessing pickles both.

Latency: one producer and one consumer; the producer stamps a message
with time.monotonic_ns() and puts it, the consumer gets it, records now -
stamp and answers on a second queue of the same library, and only then
does the producer send the next (100 samples first, not counted; then
--samples).  Median and p99.

Output: one line per figure, then as the LAST line one JSON object with
fiber's figures under their names (`queue_1x1_msgs_per_s`,
`simplequeue_4x4_msgs_per_s`, `latency_median_us`, ...), multiprocessing's
under "peer": {"multiprocessing": {...}} and "ratio_vs_multiprocessing"
(fiber rate / peer rate, peer time / fiber time: above 1 is fiber ahead),
as bench_python.py prints them.
"""
import argparse
import json
import os
import statistics
import struct
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))  # the package, in place

MSG_BYTES = 64
LAT_WARMUP = 100
_HEAD = struct.Struct("<QQ")     # producer id | sequence or stamp
_PAD = b"\0" * (MSG_BYTES - _HEAD.size)
END = None


def producer(data, ctl, go, ident, count, payload="bytes"):
    ctl.put(("ready",))
    go.get()
    put = data.put
    head = _HEAD.pack
    first = time.monotonic_ns()
    if payload == "bytearray":
        for i in range(count):
            put(bytearray(head(ident, i) + _PAD))
    else:
        for i in range(count):
            put(head(ident, i) + _PAD)
    if hasattr(data, "join_thread"):   # not multiprocessing's SimpleQueue,
        data.close()                   # whose put is already in the pipe
        data.join_thread()
    ctl.put(("producer", count, first))


def consumer(data, ctl):
    ctl.put(("ready",))
    get = data.get
    n = 0
    while get() is not END:
        n += 1
    ctl.put(("consumer", n, time.monotonic_ns()))


def lat_producer(data, ctl, go, ack, count):
    ctl.put(("ready",))
    go.get()
    for i in range(count + LAT_WARMUP):
        data.put(_HEAD.pack(i, time.monotonic_ns()) + _PAD)
        ack.get()
    data.put(END)
    ctl.put(("producer", count, 0))


def lat_consumer(data, ctl, ack):
    ctl.put(("ready",))
    lat = []
    while True:
        m = data.get()
        now = time.monotonic_ns()
        if m is END:
            break
        i, stamp = _HEAD.unpack_from(m)
        if i >= LAT_WARMUP:
            lat.append((now - stamp) / 1e3)
        ack.put(b"a")
    ctl.put(("consumer", len(lat), lat))


def make_queue(mod, kind, maxsize):
    if kind == "simplequeue":
        return mod.SimpleQueue()
    return mod.Queue(maxsize) if maxsize else mod.Queue()


def run_once(mod, kind, shape, messages, maxsize, latency=False,
             payload="bytes"):
    """One run of a shape; returns msgs/s, or (median, p99) in us with
    latency."""
    data = make_queue(mod, kind, maxsize)
    ctl, go, ack = mod.Queue(), mod.Queue(), mod.Queue()
    procs = []
    for _ in range(shape):
        procs.append(mod.Process(target=lat_consumer if latency else consumer,
                                 args=(data, ctl, ack) if latency
                                 else (data, ctl)))
    for i in range(shape):
        if latency:
            procs.append(mod.Process(target=lat_producer,
                                     args=(data, ctl, go, ack, messages)))
        else:
            count = messages // shape + (1 if i < messages % shape else 0)
            procs.append(mod.Process(target=producer,
                                     args=(data, ctl, go, i, count, payload)))
    for p in procs:
        p.start()
    for _ in procs:
        ctl.get(timeout=120)
    for _ in range(shape):
        go.put(1)
    results, producers_done = [], 0
    for _ in procs:
        results.append(ctl.get(timeout=1800))
        if not latency and results[-1][0] == "producer":
            producers_done += 1
            if producers_done == shape:   # all messages are in the queue
                for _ in range(shape):
                    data.put(END)
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            sys.exit("bench_queue: a %s process ended with %r"
                     % (mod.__name__, p.exitcode))
    if latency:
        lat = sorted(next(r[2] for r in results if r[0] == "consumer"))
        return statistics.median(lat), lat[max(0, -(-99 * len(lat) // 100) - 1)]
    put = sum(r[1] for r in results if r[0] == "producer")
    got = sum(r[1] for r in results if r[0] == "consumer")
    if put != messages or got != messages:
        sys.exit("bench_queue: %s %s: %d put, %d got, want %d"
                 % (mod.__name__, kind, put, got, messages))
    first = min(r[2] for r in results if r[0] == "producer")
    last = max(r[2] for r in results if r[0] == "consumer")
    return messages / ((last - first) / 1e9)


def measure(mod, args):
    out = {}
    for kind in ("queue", "simplequeue"):
        for shape in (1, 4):
            rates = [run_once(mod, kind, shape, args.messages, args.maxsize,
                              payload=args.payload)
                     for _ in range(args.repeat)]
            out["%s_%dx%d_msgs_per_s" % (kind, shape, shape)] = \
                round(statistics.median(rates), 1)
    # As the rates: the median over --repeat runs of each figure.
    lats = [run_once(mod, "queue", 1, args.samples, args.maxsize,
                     latency=True) for _ in range(args.repeat)]
    out["latency_median_us"] = round(statistics.median(m for m, _ in lats), 2)
    out["latency_p99_us"] = round(statistics.median(p for _, p in lats), 2)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--samples", type=int, default=5000)
    ap.add_argument("--maxsize", type=int, default=0)
    ap.add_argument("--payload", choices=("bytes", "bytearray"),
                    default="bytes",
                    help="what the rate shapes put: bytes (the default; "
                    "fiber encodes it with its codec) or bytearray (the "
                    "same 64 bytes, which fiber pickles)")
    ap.add_argument("--quick", action="store_true",
                    help="a tenth of the messages and samples")
    args = ap.parse_args()
    for name in ("messages", "repeat", "samples"):
        if getattr(args, name) < 1:
            ap.error("--%s must be at least 1" % name)
    if args.maxsize < 0:
        ap.error("--maxsize must be 0 (unbounded) or more")
    if args.quick:
        args.messages = max(1000, args.messages // 10)
        args.samples = max(100, args.samples // 10)
    import multiprocessing
    import fiber
    print("fiber %s, Python %s, %d CPUs, %d messages of %d bytes (%s), "
          "maxsize %d" % (fiber.__version__, sys.version.split()[0],
                          os.cpu_count(), args.messages, MSG_BYTES,
                          args.payload, args.maxsize))
    fib = measure(fiber, args)
    for k, v in fib.items():
        print("fiber            %-32s %12.1f" % (k, v))
    mp = measure(multiprocessing.get_context("spawn"), args)
    for k, v in mp.items():
        print("multiprocessing  %-32s %12.1f" % (k, v))
    ratios = {}
    for k, v in fib.items():
        if mp.get(k) and v:
            ratios[k] = round(mp[k] / v if k.endswith("_us") else v / mp[k], 2)
            print("ratio vs multiprocessing %-32s %8.2fx" % (k, ratios[k]))
    out = dict(fib)
    out["peer"] = {"multiprocessing": mp}
    out["ratio_vs_multiprocessing"] = ratios
    print(json.dumps(out))


if __name__ == "__main__":
    main()
