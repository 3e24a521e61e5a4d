"""fiber's compact encoding of small queue messages (python/src/codec.c):
what a get returns is what pickle would have returned, a value the codec
does not take is pickled, and a malformed message is refused by name."""
import enum
import math
import pickle
import queue
import random

import pytest

import fiber
from fiber import _fiber

I64_MAX = 2 ** 63 - 1


class Color(enum.IntEnum):
    RED = 1


class Name(str):
    pass


def _nested(depth):
    v = 0
    for _ in range(depth):
        v = (v,)
    return v


# Values the codec writes, and values it leaves to pickle.
def _shared():
    inner = [1]
    return (inner, inner)


def _self_containing():
    v = [1]
    v.append(v)
    return v


CODEC = [None, True, False, 0, -1, I64_MAX, -I64_MAX - 1, 1.5, -0.0,
         math.inf, b"", b"\0" * 64, "", "ascii", "h\u00e9llo \u6f22\U0001f600",
         (), (1, "x", (2.0, None, b"b")), [1, (2, 3), "z"],
         {"a": 1, (1, 2): b"x", None: (True,)}, _nested(32), [[1], [2]],
         ({"a": [1, {"b": ()}]},), ((1,), {"k": 2}), [[]] * 1,
         [[i] for i in range(63)]]   # 64 lists: as many as it checks
PICKLED = [I64_MAX + 1, -I64_MAX - 2, 10 ** 30, "lone \ud800 surrogate",
           Color.RED, Name("sub"), _nested(33), bytearray(b"ba"), {1, 2},
           1j, (1, [Color.RED]), _shared(), _self_containing(),
           [[i] for i in range(64)]]     # 65


def _same(a, b):
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        if any(x is a for x in a):   # holds itself: compare the rest
            return len(a) == len(b) and all(
                (x is a and y is b) or _same(x, y) for x, y in zip(a, b))
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return math.copysign(1, a) == math.copysign(1, b) and a == b
    return a == b


def test_which_values_the_codec_writes():
    for v in CODEC:
        data = _fiber.codec_dumps(v)
        assert data is not None and data[0] == 0xFB, v
        assert _same(_fiber.codec_loads(data), v), v
    assert _same(_fiber.codec_loads(_fiber.codec_dumps(math.nan)), math.nan)
    for v in PICKLED:
        assert _fiber.codec_dumps(v) is None, v


def test_the_codec_is_as_compact_as_pickle():
    # Small ints take 2 bytes and short strings 2 more than their text,
    # as in a pickle; a message is at most a little larger than pickle's.
    for v in (list(range(-100, 100)) * 5, [i * 1000 for i in range(1000)],
              ["w%d" % i for i in range(500)], [2 ** 40] * 100,
              {"reward": 1.5, "steps": 200, "id": "worker-7"},
              (1, 2.0, "three", b"four", None)):
        assert len(_fiber.codec_dumps(v)) <= 1.15 * len(pickle.dumps(v, 5)) + 8
    for i in (-129, -128, 127, 128, -2 ** 31 - 1, -2 ** 31, 2 ** 31 - 1,
              2 ** 31, I64_MAX):
        assert _fiber.codec_loads(_fiber.codec_dumps(i)) == i
    for n in (255, 256, 70000):
        for v in ("x" * n, b"y" * n):
            assert _fiber.codec_loads(_fiber.codec_dumps(v)) == v


def test_a_queue_returns_what_pickle_would():
    q = fiber.Queue()
    values = CODEC + PICKLED + [math.nan]
    for v in values:
        q.put(v)
    for v in values:
        got = q.get(timeout=10)
        assert _same(got, pickle.loads(pickle.dumps(v, 5))), v
    # A list shared inside a value keeps its identity, and one that holds
    # itself comes back holding itself: such values are pickled, whose
    # memo keeps them.
    q.put(_shared())
    a, b = q.get(timeout=10)
    assert a is b and a == [1]
    q.put(_self_containing())
    v = q.get(timeout=10)
    assert v[0] == 1 and v[1] is v


def _echo(qin, qout):
    while True:
        v = qin.get()
        if v == "stop":
            return
        qout.put(v)


def test_values_cross_processes_both_ways():
    qin, qout = fiber.Queue(), fiber.Queue()
    p = fiber.Process(target=_echo, args=(qin, qout))
    p.start()
    values = CODEC + PICKLED
    for v in values:
        qin.put(v)
    qin.put("stop")
    for v in values:
        assert _same(qout.get(timeout=60), v), v
    p.join(60)
    assert p.exitcode == 0


@pytest.mark.parametrize("data, what", [
    (b"", "no codec header"),
    (b"\x80\x05N.", "no codec header"),
    (b"\xfb", "ends inside a value"),
    (b"\xfbN\x00", "bytes after the value"),
    (b"\xfbi\x01\x02", "truncated int"),
    (b"\xfbh\x01\x02", "truncated int"),
    (b"\xfbc", "truncated int"),
    (b"\xfbS", "truncated length"),
    (b"\xfbS\x05ab", "truncated str"),
    (b"\xfbB\x03a", "truncated bytes"),
    (b"\xfbs\x01\x00", "truncated length"),
    (b"\xfbd\x01", "truncated float"),
    (b"\xfbb\x05\x00\x00\x00ab", "truncated bytes"),
    (b"\xfbs\xff\xff\xff\xffab", "truncated str"),
    (b"\xfbt\xff\xff\xff\xff", "count beyond the message"),
    (b"\xfbD\x02\x00\x00\x00NN", "count beyond the message"),
    (b"\xfbD\x01\x00\x00\x00l\x00\x00\x00\x00N",
     "a dict key that cannot be hashed"),
    (b"\xfbD\x01\x00\x00\x00t\x01\x00\x00\x00D\x00\x00\x00\x00N",
     "a dict key that cannot be hashed"),
    (b"\xfb" + b"t\x01\x00\x00\x00" * 40 + b"N", "nested too deep"),
    (b"\xfb" + b"l\x01\x00\x00\x00" * 40 + b"N", "nested too deep"),
    (b"\xfbZ", "unknown tag 0x5a"),
])
def test_a_malformed_message_is_named(data, what):
    with pytest.raises(ValueError, match=what):
        _fiber.codec_loads(data)


def test_a_str_that_is_no_utf8_is_refused():
    with pytest.raises(UnicodeDecodeError):
        _fiber.codec_loads(b"\xfbs\x02\x00\x00\x00\xff\xfe")


def test_mutated_messages_decode_or_raise_valueerror():
    rng = random.Random(7)
    seeds = [_fiber.codec_dumps(v) for v in CODEC]
    for _ in range(20000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(3)
            if op == 0 and len(data) > 1:
                data[rng.randrange(1, len(data))] = rng.randrange(256)
            elif op == 1 and len(data) > 1:
                del data[rng.randrange(1, len(data)):]
            else:
                data.insert(rng.randrange(1, len(data) + 1),
                            rng.randrange(256))
        try:
            _fiber.codec_loads(bytes(data))
        except ValueError:
            pass


def test_a_hostile_message_in_a_queue_loses_nothing_after_it():
    # A message put raw (not by Queue.put) that claims the codec's header
    # and is malformed: its get raises, naming it; the next message
    # arrives intact.
    q = fiber.Queue()
    q._q.put(b"\xfbt\xff\xff\xff\xff", -1)
    q.put(("after", 1))
    with pytest.raises(ValueError, match="count beyond the message"):
        q.get(timeout=10)
    assert q.get(timeout=10) == ("after", 1)
    with pytest.raises(queue.Empty):
        q.get(timeout=0.05)
