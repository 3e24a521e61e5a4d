"""The fork server of a Python program's local jobs:
``python -m fiber._forkserver``.

The local backend starts it once per run, with the first job, when the
configuration's ``fork_server`` is on (the default).  It does the
bootstrap's step 1 once (the master's sys.path, its main module imported
as ``__mp_main__``), then forks every job from this prepared interpreter
instead of starting a new one: a job is ready in milliseconds, not after
the interpreter's start and the program's imports.

It speaks to the master's local backend over the SOCK_SEQPACKET socket
whose descriptor FIBER_FORKSERVER_FD names; src/backend/local/forkserver.c
describes the messages.  It stays single-threaded (it refuses to serve,
and the master spawns every job, when importing the main module started
Python threads), forks only between messages, and reports each job's exit
status, since the jobs are its children, not the master's.  It exits when
the master's end of the socket closes or the master ends.
"""
import os
import select
import signal
import socket
import sys
import threading

MSG_MAX = 256 * 1024
ROOM_VAR = b"FIBER_FORKSERVER_ROOM="
ARG_ROOM = b"--fiber-job=forkserver"


class _Server:
    def __init__(self, sock):
        self.sock = sock
        self.children = {}      # pid -> job id (bytes)
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.master_fd = -1
        self.room = None        # (address, size) of the environment's room
        self.arg_room = None    # and of the command line's

    def send(self, *fields, fds=()):
        data = b"".join(f + b"\0" for f in fields)
        if fds:
            socket.send_fds(self.sock, [data], list(fds))
        else:
            self.sock.send(data)

    # ---- serving ------------------------------------------------------

    def serve(self):
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        if self.master_fd >= 0:
            poller.register(self.master_fd, select.POLLIN)
        self.send(b"ready")
        while True:
            for fd, _ in poller.poll():
                if fd == self.master_fd:
                    return          # the master has ended
                if fd == self.wake_r:
                    self.reap()
                elif not self.handle():
                    return          # the master closed its end

    def reap(self):
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = self.children.pop(pid, None)
            if job is not None:
                code = os.waitstatus_to_exitcode(status)
                self.send(b"exited", job, str(code).encode())

    def handle(self):
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, MSG_MAX, 8)
        except ConnectionResetError:
            return False
        if not data:
            return False
        fields = data.split(b"\0")
        try:
            if fields[0] != b"start" or len(fds) != 4:
                raise ValueError("unexpected message %r" % fields[0][:20])
            job, name, workdir, count = fields[1:5]
            env = fields[5:5 + int(count)]
        except (ValueError, IndexError) as e:
            for fd in fds:
                os.close(fd)
            sys.stderr.write("fiber fork server: %s\n" % e)
            return False
        try:
            self.start(job, name, workdir, env, fds)
        finally:
            for fd in fds:
                os.close(fd)
        return True

    def start(self, job, name, workdir, env, fds):
        sys.stdout.flush()      # nothing buffered here is printed twice
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as e:
            self.send(b"failed", job, ("fork: %s" % e.strerror).encode())
            return
        if pid == 0:
            self.become_job(os.fsdecode(name), workdir, env, fds)
        self.children[pid] = job
        pidfd = os.pidfd_open(pid)  # before any reaping: names this child
        try:
            self.send(b"started", job, str(pid).encode(), fds=[pidfd])
        finally:
            os.close(pidfd)

    # ---- in a forked job ------------------------------------------------

    def become_job(self, name, workdir, env, fds):
        """Turns this fork into the job the master asked for.  Never
        returns: the job ends the process."""
        code = 1
        try:
            self.leave_server(fds)
            if workdir:
                os.chdir(workdir)
            os.environ.clear()
            for entry in env:
                key, _, value = entry.partition(b"=")
                os.environb[key] = value
            for key in ("FIBER_PY_SYSPATH", "FIBER_PY_ARGV",
                        "FIBER_PY_MAIN_MODULE", "FIBER_PY_MAIN_PATH"):
                os.environ.pop(key, None)   # step 1 is done
            self.show_identity(name, env)
            _reseed()
            from . import _bootstrap
            _bootstrap.run_job(name)
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                sys.stderr.write("%s\n" % e.code)
        except BaseException:
            import traceback
            sys.stderr.write("fiber job %s: cannot start:\n%s"
                             % (name, traceback.format_exc()))
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def leave_server(self, fds):
        """Drops what belongs to the server and takes the job's standard
        descriptors and secret (3), as the spawn path gives them."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.close(self.sock.detach())
        os.close(self.wake_r)
        os.close(self.wake_w)
        if self.master_fd >= 0:
            os.close(self.master_fd)
        secret, fin, fout, ferr = fds
        os.dup2(fin, 0)
        os.dup2(fout, 1)
        os.dup2(ferr, 2)
        if secret != 3:
            os.dup2(secret, 3)
        for fd in fds:
            if fd > 3:
                os.close(fd)
        fds[:] = []

    def find_rooms(self):
        """Where the rooms in our initial argument and environment blocks
        are, which a job overwrites with its identity: `fiber ps` reads
        /proc/<pid>/environ (that block, not os.environ), and ps shows
        "--fiber-job=<name>" in a job's command line."""
        try:
            with open("/proc/self/stat", "rb") as f:
                stat = f.read()
            rest = stat[stat.rindex(b")") + 2:].split()
            arg_start = int(rest[45])       # fields 48 and 50 of proc(5)
            env_start = int(rest[47])
            self.arg_room = _room(arg_start, "/proc/self/cmdline",
                                  ARG_ROOM)
            self.room = _room(env_start, "/proc/self/environ", ROOM_VAR)
        except (OSError, ValueError, IndexError):
            self.room = self.arg_room = None

    def show_identity(self, name, env):
        ident = b"".join(e + b"\0" for e in env
                         if e.startswith(b"FIBER_BOOT_")
                         and not e.startswith(b"FIBER_BOOT_SECRET"))
        flag = b"--fiber-job=" + os.fsencode(name) + b"\0"
        try:
            with open("/proc/self/mem", "r+b", buffering=0) as mem:
                for room, text in ((self.room, ident),
                                   (self.arg_room, flag)):
                    if room and len(text) <= room[1]:
                        mem.seek(room[0])
                        mem.write(text.ljust(room[1], b"\0"))
        except OSError:
            pass


def _room(start, path, prefix):
    """(address, size) of the entry of the block at start (shown in path)
    that begins with prefix."""
    with open(path, "rb") as f:
        block = f.read()
    at = block.index(b"\0" + prefix) + 1
    return start + at, block.index(b"\0", at) - at


def _reseed():
    """A forked job must not share its random state with its siblings.
    Python's random reseeds itself after fork(); numpy's global
    RandomState does not, so it is reseeded here from the OS, as a job
    that imported numpy afresh would be."""
    nprandom = sys.modules.get("numpy.random")
    if nprandom is not None:
        nprandom.seed()


def _prepare():
    """Step 1 of fiber._bootstrap.  Returns None, or why this interpreter
    cannot fork jobs."""
    from . import _bootstrap, _runtime
    _runtime.child_mode = True
    _runtime.master_pid = os.environ.get("FIBER_PY_MASTER_PID")
    from .shared_memory import untrack_in_job
    untrack_in_job()    # once, for every job forked from here
    try:
        _bootstrap._import_main()
    except BaseException as e:
        # Each spawned job will say it again, with the traceback.
        return "cannot import the program's main module: %s: %s" % (
            type(e).__name__, e)
    others = [t.name for t in threading.enumerate()
              if t is not threading.main_thread()]
    if others:
        return ("importing the program's main module started threads (%s); "
                "forking would copy their state half-done"
                % ", ".join(others[:5]))
    return None


def main():
    fd = os.environ.pop("FIBER_FORKSERVER_FD", None)
    if fd is None or os.environ.get("FIBER_BOOT_RUN") is None:
        sys.exit("fiber._forkserver serves a fiber master's local backend; "
                 "it is not a program of its own")
    # Ctrl-C in a terminal is for the master, which ends us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=os.dup(int(fd)))
    os.close(int(fd))
    server = _Server(sock)
    for key in ("FIBER_BOOT_RUN", "FIBER_BOOT_ADDR", "FIBER_BOOT_NAME",
                "FIBER_FORKSERVER_ROOM"):
        os.environ.pop(key, None)
    server.find_rooms()
    try:
        server.master_fd = os.pidfd_open(os.getppid())
    except OSError:
        server.master_fd = -1
    why = _prepare()
    if why:
        server.send(b"unusable", why.encode(errors="replace")[:900])
        return
    server.serve()


if __name__ == "__main__":
    main()
