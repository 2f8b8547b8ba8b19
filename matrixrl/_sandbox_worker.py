"""Worker side of :mod:`matrixrl.sandbox`: one started interpreter that forks a child per program.

Started by the sandbox as ``python -I -S -B -u _sandbox_worker.py`` under its launcher
(namespaces, uid drop), and never imported. It loads the harness
(``_sandbox_child.py``) and the modules programs import most, tells the parent it is
ready, then serves one job at a time: a job arrives on stdin, the worker forks, the
child sets up its descriptors, directory and title and calls the harness (limits,
audit hook, program, tests, verdict), and the worker answers on stdout with what
the child left: its verdict bytes, exit status, whether the deadline passed, and the
tail of its output. Frames both ways are a 4-byte length and a marshalled tuple.

What one program cannot leave to the next: every program runs in its own forked
child, so whatever it changes in memory (builtins, modules, ``sys``, globals, the
harness itself) ends with that child; the worker never runs untrusted code. After
each child the worker kills every process the child could have left: in a PID
namespace, where the worker is process 1, everything else in the namespace
(``kill(-1)``); elsewhere the child's process group (the kernel's RLIMIT_NPROC keeps
an unprivileged child from making any other). The parent gives each program its
own sandbox directory and removes it afterwards.

The worker ends when its stdin reaches end-of-file (the parent closed it, or died),
killing the child it runs. As process 1 of a PID namespace it cannot be killed from
inside it; its children cannot write to its stdin or stdout, which they never hold.
"""

import _signal
import gc
import marshal
import os
import select
import sys
import time

# Loaded once here, so children find them imported: the harness, and the standard
# library modules that HumanEval/MBPP programs import most (typing alone costs a
# fresh interpreter about 20 ms).
# Loaded once here, shared by every child: a child cannot unmarshal a cached .pyc (the
# harness refuses marshal), so anything else it imports compiles from source (2-40 ms
# each). Not random: loaded here, every child would draw the same numbers.
PRELOAD = (
    "typing", "collections", "re", "math", "heapq", "itertools", "functools", "string",
    "bisect", "copy", "operator", "hashlib", "fractions", "datetime", "decimal",
    "json",  # the harness's own: an answer's values cross to the tests' process as JSON
)
HERE = os.path.dirname(os.path.abspath(__file__))
# Spelled as the parent spells it (matrixrl.sandbox.CHILD_SCRIPT): beside this
# script's path as the parent passed it.
CHILD_SCRIPT = os.path.join(os.path.dirname(sys.argv[0]), "_sandbox_child.py")
REPORT_LIMIT = 1 << 16  # bytes of verdict read, as the parent reads from a fresh interpreter
TAIL_BYTES = 2000  # of the program's output, for the verdict of a crash
FD_CEILING = 256  # above every descriptor the worker opens


def load_harness():
    """The harness module, kept out of sys.modules so programs do not find it by name."""
    sys.path.insert(0, HERE)  # -I leaves the script's directory off the path
    try:
        import _sandbox_child
    finally:
        del sys.path[0]
    del sys.modules["_sandbox_child"]
    return _sandbox_child


def command_line():
    """Where this process's command line lies in its memory, the one its children
    show (the harness script's, so ``pgrep -f _sandbox_child.py`` finds running
    programs and not the worker) and its own, with a descriptor of its memory to
    write them through; None where /proc does not tell.

    The descriptor is opened now, while the worker is still dumpable (``undumpable``
    then makes /proc/self/mem root's), and no child keeps it: each closes every
    descriptor but its own before the program runs.
    """
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (proc(5))
        mem = os.open("/proc/self/mem", os.O_RDWR)
        current = os.pread(mem, end - start, start)
    except (OSError, ValueError, IndexError):
        return None
    worker, child = os.fsencode(sys.argv[0]), os.fsencode(CHILD_SCRIPT)
    parts = [child if part == worker else part for part in current.rstrip(b"\0").split(b"\0")]
    title = b"\0".join(parts) + b"\0"
    if len(title) > len(current):
        os.close(mem)
        return None
    return mem, start, title.ljust(len(current), b"\0"), current


def show_title(titles, shown):
    """Write the children's title (``shown`` 2) or the worker's own (3) over the command line."""
    if titles is None:
        return
    try:
        os.pwrite(titles[0], titles[shown], titles[1])
    except OSError:
        pass  # only ps and pgrep see the difference


def receive(fd, read_exactly):
    """One frame from ``fd``, or None at end-of-file."""
    header = read_exactly(fd, 4)
    if header is None:
        return None
    body = read_exactly(fd, int.from_bytes(header, "big"))
    return None if body is None else marshal.loads(body)


def send(fd, value):
    data = marshal.dumps(value)
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data):]


def start_program(job, harness, devnull, output, verdict_fd, title):
    """In the forked child: become the program's process, then run the harness (never returns)."""
    pass_token, report_token, program, tests, sandbox_dir, memory_mb, cpu_s, guard, entry_point, _seconds = job
    # Its own process group, killed as one afterwards. Not a session of its own: the
    # worker's has no terminal already, and setsid() costs milliseconds where the
    # kernel makes a scheduler autogroup per session.
    os.setpgid(0, 0)
    os.dup2(devnull, 0)  # replaces the job channel: the child never holds it
    os.dup2(output, 1)  # replaces the reply channel
    os.dup2(output, 2)
    # Everything else the worker holds (its /dev/null, the output file, the verdict
    # pipe's read end: a handful, all low; a range to 2**16 would cost a millisecond).
    os.closerange(3, verdict_fd)
    os.closerange(verdict_fd + 1, FD_CEILING)  # the worker's memory descriptor too (command_line)
    os.chdir(sandbox_dir)
    os.environ["HOME"] = os.environ["TMPDIR"] = sandbox_dir
    sys.argv[:] = [CHILD_SCRIPT]
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)  # as in a fresh interpreter
    harness.run_program(
        pass_token, report_token, program, tests, sandbox_dir, memory_mb, cpu_s, guard, verdict_fd,
        entry_point,
    )


def run_one(job, harness, devnull, title, init):
    """Fork a child for ``job``, wait for it until its deadline, clean up after it;
    the reply for the parent, or None when the parent is gone."""
    deadline = time.monotonic() + job[-1]
    output = os.memfd_create("sandbox-output")
    verdict_read, verdict_write = os.pipe()
    show_title(title, 2)  # the child starts with a copy of this memory: the harness's title
    pid = os.fork()
    if pid == 0:
        try:
            start_program(job, harness, devnull, output, verdict_write, title)
        except BaseException as error:  # a setup step failed; the harness never returns
            os.write(2, ("sandbox child: " + harness.describe(error) + "\n").encode())
        os._exit(70)
    show_title(title, 3)
    os.close(verdict_write)
    try:
        timed_out, parent_gone = wait(pid, deadline)
    finally:
        # Kill before reaping, so the group id cannot be reused meanwhile.
        # As process 1: everything in this PID namespace but the worker itself.
        targets = ((os.kill, -1),) if init else ((os.killpg, pid), (os.kill, pid))
        for kill, target in targets:
            try:
                kill(target, _signal.SIGKILL)
            except OSError:
                pass  # nothing left to kill
        returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        reap_orphans(init)
    report = read_available(verdict_read)
    size = os.fstat(output).st_size
    tail = os.pread(output, TAIL_BYTES, max(0, size - TAIL_BYTES))
    for fd in (verdict_read, output):
        os.close(fd)
    if parent_gone:
        return None
    return report, returncode, timed_out, tail


def wait(pid, deadline):
    """Until the child ends (False, False), the deadline passes (True, False) or the
    parent closes the job channel (False, True)."""
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(0, select.POLLIN)  # nothing arrives during a job but end-of-file
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return True, False
            ready = {fd for fd, _event in poller.poll(left * 1000)}
            if 0 in ready:
                return False, True
            if pidfd in ready:
                return False, False
    finally:
        os.close(pidfd)


def reap_orphans(init):
    """Collect every other child left: as process 1 the worker inherits the orphans of its namespace."""
    while True:
        try:
            pid, _status = os.waitpid(-1, 0 if init else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def read_available(fd):
    """What the child wrote for its verdict, without waiting on a writer (it is dead)."""
    os.set_blocking(fd, False)
    chunks, size = [], 0
    while size < REPORT_LIMIT:
        try:
            chunk = os.read(fd, REPORT_LIMIT)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def undumpable():
    """Out of its programs' reach through ptrace and /proc/PID/mem.

    Programs run as the worker's uid, so the kernel's one check left on a program
    that escaped the audit hook and opened the worker's memory (to forge the verdicts
    of the programs after it) is the worker's dumpable flag. Cleared here, it is
    inherited by every forked child (they need no debugger either); a kernel that
    refuses fails the start, and the parent runs each program in a fresh interpreter.
    """
    import ctypes

    pr_set_dumpable = 4
    failed = ctypes.CDLL(None, use_errno=True).prctl(pr_set_dumpable, 0, 0, 0, 0) != 0
    errno = ctypes.get_errno()
    # Forgotten again: a program's `import ctypes` must be a fresh import, which the audit hook blocks.
    for name in [name for name in sys.modules if name.split(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]
    if failed:
        raise OSError(errno, "prctl(PR_SET_DUMPABLE, 0) failed")


def main():
    title = command_line()  # first: it opens /proc/self/mem, which undumpable closes to the worker's uid
    undumpable()
    harness = load_harness()
    for name in PRELOAD:
        __import__(name)
    # Out of the collector's sight: a child's collections then leave the worker's
    # objects alone, and with them the memory pages it shares with the worker.
    gc.freeze()
    # Only signals with a handler reach process 1 from inside its namespace; Python's
    # SIGINT handler is the one such handler, and the worker needs none.
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDWR)
    init = os.getpid() == 1
    # Checked now, so a kernel without them fails the start and the parent falls
    # back to a fresh interpreter per program.
    os.close(os.memfd_create("probe"))
    os.close(os.pidfd_open(os.getpid()))
    send(1, ("ready",))
    while True:
        job = receive(0, harness.read_exactly)
        if job is None:
            return
        reply = run_one(job, harness, devnull, title, init)
        if reply is None:
            return
        send(1, reply)


if __name__ == "__main__":
    main()
