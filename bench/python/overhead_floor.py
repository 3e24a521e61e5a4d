"""The floor of the Fiber paper's overhead test on this machine: the same
rounds as bench_python.py's overhead figures, with no framework.

    build/venv/bin/python bench/python/overhead_floor.py [--quick]

A fresh interpreter forks 5 Python processes, each joined to it by a
socket pair.  A round sends each of them one pickled call of
bench_tasks.sleep(t) (length-prefixed, as a pool's task travels) and reads
the 5 pickled answers; each process waits for its call in a blocking
read, as a pool worker that does not spin.  The overhead per round is
(elapsed - floor) / rounds, the floor being the sum of each round's
longest measured sleep, exactly as bench_python.py computes it for a
pool.  No pool can do less than this per round: it must also wake its
workers, move the call and the answer and unpickle both; what is left
is the framework's own cost.  On a machine where waking a sleeping
process is slow, this floor is high, and so is every pool's figure.

Last line: one JSON object, {"overhead_1ms_us": ..., "overhead_10ms_us":
...}, the same keys as bench_python.py's.
"""
import argparse
import json
import os
import pickle
import socket
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_tasks as T  # noqa: E402

_LEN = struct.Struct("<I")
WORKERS = 5


def _send(sock, obj):
    data = pickle.dumps(obj)
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            return None
        buf += part
    return bytes(buf)


def _recv(sock):
    head = _recv_exact(sock, _LEN.size)
    if head is None:
        return None
    return pickle.loads(_recv_exact(sock, _LEN.unpack(head)[0]))


def _worker(sock):
    while True:
        call = _recv(sock)
        if call is None:
            return
        fn, args = call
        _send(sock, getattr(T, fn)(*args))


def start():
    socks = []
    for _ in range(WORKERS):
        mine, theirs = socket.socketpair()
        if os.fork() == 0:
            mine.close()
            for s in socks:
                s.close()
            try:
                _worker(theirs)
            finally:
                os._exit(0)
        theirs.close()
        socks.append(mine)
    return socks


def overhead(socks, t, rounds):
    def one_round():
        for s in socks:
            _send(s, ("sleep", (t,)))
        return max(_recv(s) for s in socks)

    for _ in range(5):  # every process has run a call
        one_round()
    floor = 0.0
    begin = time.perf_counter()
    for _ in range(rounds):
        floor += one_round()
    total = time.perf_counter() - begin
    return (total - floor) / rounds * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    s = 0.25 if args.quick else 1.0
    socks = start()
    try:
        out = {"overhead_1ms_us": overhead(socks, 0.001, int(200 * s)),
               "overhead_10ms_us": overhead(socks, 0.010, int(50 * s))}
    finally:
        for sock in socks:
            sock.close()
        for _ in socks:
            os.wait()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
