"""Functions the tests send to workers: a module the jobs import by name."""
import os
import signal
import sys
import time

STATE = {}


def job_parents():
    """The pids a local job of this master has as its parent: the master,
    and its fork server (jobs of a Python program are forked from it
    unless fork_server is off)."""
    parents = {os.getpid()}
    for d in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % d) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != os.getpid():
                continue
            with open("/proc/%s/cmdline" % d, "rb") as f:
                if b"fiber._forkserver" in f.read():
                    parents.add(int(d))
        except (OSError, ValueError, IndexError):
            continue
    return parents


def square(x):
    return x * x


def add(a, b):
    return a + b


def kw(a, b=0, *, c=0):
    return (a, b, c)


def boom(msg):
    raise ValueError(msg)


class CustomError(Exception):
    def __init__(self, code, text):
        super().__init__(code, text)
        self.code = code
        self.text = text


def custom_boom(code):
    raise CustomError(code, "custom %d" % code)


def getpid(_=None):
    return os.getpid()


def sleep_then(x, seconds):
    time.sleep(seconds)
    return x


def exit_hard(x):
    os._exit(7)


def segfault(x):
    import ctypes
    ctypes.string_at(0)


def crash_on(x, bad):
    if x == bad:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def set_state(key, value):
    STATE[key] = value


def get_state(key):
    return STATE.get(key)


def init_fails():
    raise RuntimeError("no GPU here")


def unpicklable_result(_):
    return lambda: 1


def noop(x=None):
    return x


# Process targets
def exit_with(code):
    sys.exit(code)


def raise_in_child():
    raise KeyError("from the child")


def sleep_forever():
    while True:
        time.sleep(1)


def report_self_view(q):
    """How the job's own Process object looks from inside it."""
    import fiber
    me = fiber.current_process()
    q.put((repr(me), me.is_alive()))


def send_then_close(conn, n, delay):
    """Sends n (i, name) messages after delay seconds, then closes its end
    (the multiprocessing docs' example for connection.wait)."""
    import fiber
    time.sleep(delay)
    for i in range(n):
        conn.send((i, fiber.current_process().name))
    conn.close()


def say_up_then_sleep_forever(q):
    """Tells q it runs (a pod or container may take seconds to start),
    then sleeps until it is stopped."""
    q.put("up")
    sleep_forever()


def put_to(q, value):
    q.put(value)


def report_identity(q):
    import fiber
    q.put((os.getpid(), fiber.current_process().name))


def echo_pipe(conn):
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        conn.send(("echo", msg))
    conn.close()


def bump(d, key, n, lock):
    for _ in range(n):
        with lock:
            d[key] = d.get(key, 0) + 1


def append_many(lst, start, n):
    for i in range(start, start + n):
        lst.append(i)


def wait_event(ev, q):
    q.put(ev.wait(10))


def barrier_party(b, q):
    q.put(b.wait(10))


def slow_on_zero(x):
    """x, after 3 s for 0 and 0.2 s for anything else."""
    time.sleep(3 if x == 0 else 0.2)
    return x


def square_wanting_2_cpus(x):
    """square, marked as @fiber.meta(cpu=2) does (set below, so that this
    module does not import fiber)."""
    return x * x


square_wanting_2_cpus.__fiber_meta__ = {"cpu": 2}


class MetaObject:
    """An object whose class asks for a GPU: its bound methods do too."""
    __fiber_meta__ = {"gpu": 1}

    def square(self, x):
        return x * x


def numpy_sum(a):
    return float(a.sum())


def numpy_double(a):
    return a * 2


def array_and_bytes_digest(a, b):
    """A digest of an array's and a bytes-like object's contents."""
    import hashlib
    return hashlib.sha256(a.tobytes() + bytes(b)).hexdigest(), a.dtype.str


class Counter:
    def __init__(self, start=0):
        self.n = start

    def incr(self, by=1):
        self.n += by
        return self.n

    def value(self):
        return self.n

    def fail(self):
        raise ValueError("counter says no")


def spin_square(x):
    """x * x after about 30 us of work."""
    end = time.perf_counter() + 3e-5
    while time.perf_counter() < end:
        pass
    return x * x


_MARKED = False


def spin_square_marking(mark_dir, x):
    """spin_square(x), and on its first call in a process, an empty file
    named after the process's pid in mark_dir: the workers that have taken
    a task."""
    global _MARKED
    if not _MARKED:
        open(os.path.join(mark_dir, str(os.getpid())), "w").close()
        _MARKED = True
    return spin_square(x)


_TOKEN = os.urandom(8).hex()


def process_token(_=None):
    """A value unique to the process that runs it (pids repeat across
    containers, each with its own pid namespace)."""
    return _TOKEN


def array_info(a, i):
    """What a task saw of an array argument: its sum plus i, whether it
    is writeable (an array that came through the object store is not) and
    this process's pid."""
    return float(a.sum()) + i, bool(a.flags.writeable), os.getpid()


def sphere_in_worker(x):
    """A loss for an optimizer (0 at 0.5 in every coordinate), and the
    process_token() of the process that computed it."""
    import numpy as np
    return float(np.sum((np.asarray(x) - 0.5) ** 2)), process_token()


def make_cartpole():
    import gymnasium
    return gymnasium.make("CartPole-v1")


def make_pendulum():
    """Box observations and Box actions (float32)."""
    import gymnasium
    return gymnasium.make("Pendulum-v1")


def make_scalar_pendulum():
    """Pendulum whose action space is a Box of shape () (a float32 scalar):
    a Box action, not a Discrete one, although it has no dimensions."""
    import gymnasium
    import numpy as np

    class Scalar(gymnasium.ActionWrapper):
        def __init__(self, env):
            super().__init__(env)
            self.action_space = gymnasium.spaces.Box(-2.0, 2.0, shape=(),
                                                     dtype=np.float32)

        def action(self, action):
            action = np.asarray(action)
            assert action.shape == () and action.dtype == np.float32, \
                (type(action), action)
            return action.reshape(1)

    return Scalar(gymnasium.make("Pendulum-v1"))


def make_odd_cartpole(numpy_obs=False):
    """CartPole whose steps carry an info dict and whose observations are
    float64 (its space says float32), or, with numpy_obs, exact float32:
    the answers a vector must take apart without mixing them up."""
    import gymnasium
    import numpy as np

    class Odd(gymnasium.Wrapper):
        n = 0

        def step(self, action):
            obs, r, term, trunc, info = self.env.step(action)
            self.n += 1
            info = dict(info, count=self.n, action=int(action))
            return (obs if numpy_obs else obs.astype(np.float64)), r, \
                term, trunc, info

    return Odd(gymnasium.make("CartPole-v1"))


def make_pid_cartpole():
    """CartPole whose env answers pid() (the job it runs in) and raises in
    step while its `explode` attribute is set."""
    import gymnasium

    class PidEnv(gymnasium.Wrapper):
        explode = False

        def pid(self):
            return os.getpid()

        def step(self, action):
            if self.explode:
                raise RuntimeError("boom in step")
            return self.env.step(action)

    return PidEnv(gymnasium.make("CartPole-v1"))


# ---- test_queue_batching.py ------------------------------------------------

def put_numbered(q, ident, n, then_sleep=0.0):
    """Puts (ident, 0) .. (ident, n - 1) as fast as it can, then sleeps
    then_sleep seconds (the process stays alive, nothing is flushed by
    an exit) and returns."""
    put = q.put
    for i in range(n):
        put((ident, i))
    time.sleep(then_sleep)


def get_all_until_none(q, out):
    """Gets until None; sends everything it got, in its order, on out."""
    got = []
    while True:
        item = q.get(timeout=60)
        if item is None:
            break
        got.append(item)
    out.put(got, timeout=60)


def take_some_then_hang(q, k, out):
    """Gets k items, reports them (a synchronous put: they are in out
    when it returns), then waits to be killed, holding whatever its
    handle prefetched."""
    got = [q.get(timeout=60) for _ in range(k)]
    out.put(got, timeout=60)
    time.sleep(600)


def put_each_then_report(q, items, out):
    """Puts items one by one (on a bounded queue put blocks while it is
    full), then says so on out."""
    for item in items:
        q.put(item)
    out.put("all put", timeout=60)


def echo_bytes(conn):
    """Answers each byte message with b"re:" and the message, until its
    pipe ends; b"die" ends the process at once (no close)."""
    while True:
        try:
            msg = conn.recv_bytes()
        except EOFError:
            break
        if msg == b"die":
            os._exit(3)
        conn.send_bytes(b"re:" + msg)


def boom_at(args):
    """args = (i, at, msg): raises ValueError(msg) at item at, else i."""
    i, at, msg = args
    if i == at:
        raise ValueError(msg)
    return i


# ---- fiber.shared_memory (test_shared_memory.py) --------------------------

def shm_write(name, index, value):
    """Opens the block `name`, sets byte `index` to value, closes it."""
    from fiber import shared_memory
    shm = shared_memory.SharedMemory(name=name)
    shm.buf[index] = value
    shm.close()
    return index


def shm_open_error(name):
    """The FileNotFoundError of opening a block that is not there."""
    from fiber import shared_memory
    try:
        shared_memory.SharedMemory(name=name)
    except FileNotFoundError as e:
        return str(e)
    return None


def shm_create_and_send(q, payload):
    """Creates a block holding payload, puts its name on q and ends
    without unlinking it (the master does)."""
    from fiber import shared_memory
    shm = shared_memory.SharedMemory(create=True, size=len(payload))
    shm.buf[:len(payload)] = payload
    q.put(shm.name)
    shm.close()


def shareable_list_bump(name):
    """Adds 1 to every int of the ShareableList `name`."""
    from fiber import shared_memory
    sl = shared_memory.ShareableList(name=name)
    for i in range(len(sl)):
        sl[i] += 1
    sl.shm.close()


# ---- a Process's own view and its threads (test_process.py) --------------

def put_own_pid(q):
    """Puts (current_process().pid, os.getpid()) on q."""
    import fiber
    q.put((fiber.current_process().pid, os.getpid()))


def _late_put(q):
    import time
    time.sleep(0.5)
    q.put("thread done")


def start_thread_and_return(q):
    """Starts a non-daemon thread that puts on q after 0.5 s, and returns
    at once: the job must wait for it, as a multiprocessing child does."""
    import threading
    threading.Thread(target=_late_put, args=(q,)).start()


class HeldTarget:
    """A callable whose collection a weakref can watch."""

    def __call__(self, q):
        q.put(5)


def executor_left_open(q):
    """Uses a ThreadPoolExecutor (non-daemon workers) without shutting it
    down; threading's exit hook ends its workers, so the job ends."""
    from concurrent.futures import ThreadPoolExecutor
    ex = ThreadPoolExecutor(2)
    q.put(ex.submit(pow, 2, 10).result())


def send_numbers(conn, tag, n):
    """Sends (tag, i) for i in range(n) on conn."""
    for i in range(n):
        conn.send((tag, i))


def multiprocessing_view(q=None):
    """What multiprocessing's own functions say here (a job), and the
    processName a logging record gets."""
    import logging
    import multiprocessing
    parent = multiprocessing.parent_process()
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)
    view = (multiprocessing.current_process().name, record.processName,
            parent.pid if parent is not None else None,
            bytes(multiprocessing.current_process().authkey))
    if q is not None:
        q.put(view)
    return view


def process_running(pid):
    """pid is a live process, not a zombie (PID 1 may reap late)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
