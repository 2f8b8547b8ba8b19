"""Worker side of :mod:`matrixrl.sandbox`: one started interpreter that forks a child per program.

Started as ``python -I -S -B -u _sandbox_worker.py SPEC`` under the sandbox's launcher, never
imported. It serves one job at a time (on stdin: a 4-byte length and a marshalled tuple; the
answer on stdout) until end-of-file. How it walls each program in, and why: docs/sandbox.md.
"""

import _signal
import gc
import marshal
import os
import select
import sys
import time

# The standard library modules HumanEval/MBPP programs import most (typing alone costs
# about 20 ms), loaded once here, shared by every child: a child cannot unmarshal a cached .pyc (the
# harness refuses marshal), so anything else it imports compiles from source (2-40 ms
# each). Not random: loaded here, every child would draw the same numbers.
PRELOAD = (
    "typing", "collections", "re", "math", "heapq", "itertools", "functools", "string",
    "bisect", "copy", "operator", "hashlib", "fractions", "datetime", "decimal",
    "json",  # the harness's own: an answer's values cross to the tests' process as JSON
)
HERE = os.path.dirname(os.path.abspath(__file__))
# Beside this script, as its command line names it (the view's /sandbox there): the title
# its children show.
CHILD_SCRIPT = os.path.join(os.path.dirname(sys.argv[0]), "_sandbox_child.py")
REPORT_LIMIT = 1 << 16  # bytes of verdict read
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
    """Where this process's command line lies in its memory, the one its children show (the
    harness script's) and its own, with a descriptor of its memory to write them through,
    opened while the worker is still dumpable; None where /proc does not tell.
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


# The view's layout: nothing in it names where the host keeps anything.
VIEW_PYTHON = "/usr/bin/python3"
VIEW_HARNESS = "/sandbox"
VIEW_LIBS = "/lib"  # the interpreter's shared libraries and its modules', by file name
SCRATCH = "/tmp"
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}


def libc_call(name, *args):
    """A libc function through ctypes (only the worker's set-up calls them); OSError on failure."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    encoded = [arg.encode() if isinstance(arg, str) else arg for arg in args]
    if getattr(libc, name)(*encoded) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{name}{args!r}: {os.strerror(error)}")


def mount(source, target, fstype, flags, data=None):
    import ctypes

    libc_call("mount", source, target, fstype, ctypes.c_ulong(flags), data)


def build_view(spec):
    """As root of fresh namespaces: a tmpfs root holding the standard library (read-only, no
    site-packages), the interpreter and its shared libraries, four devices, the harness, and
    the scratch tmpfs (``spec``'s size and file count, owned by the programs' uid, no exec);
    then the host's filesystem leaves the namespace (``pivot_root``) and the worker runs
    itself again inside. Mounted on /proc, which every Linux has and the view replaces."""
    new = "/proc"
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("view", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=0755")

    def place(source, target, flags=MS_RDONLY | MS_NOSUID | MS_NODEV):
        path = new + target
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.isdir(source):
            os.makedirs(path, exist_ok=True)
        else:
            open(path, "a").close()
        mount(source, path, None, MS_BIND)
        mount(None, path, None, MS_BIND | MS_REMOUNT | flags)

    stdlib = f"/usr/{spec['platlibdir']}/python{sys.version_info[0]}.{sys.version_info[1]}"
    place(spec["stdlib"], stdlib)
    for name in os.listdir(spec["stdlib"]):
        if name in ("site-packages", "dist-packages"):  # installed packages: none inside
            mount("none", f"{new}{stdlib}/{name}", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
    if spec["dynload"] != os.path.join(spec["stdlib"], "lib-dynload"):
        place(spec["dynload"], stdlib + "/lib-dynload")
    place(spec["python"], VIEW_PYTHON)
    for library in spec["libraries"]:  # the dynamic loader where the binaries name it
        place(library, library if library == spec["loader"] else f"{VIEW_LIBS}/{os.path.basename(library)}")
    for device in ("null", "zero", "random", "urandom"):
        place("/dev/" + device, "/dev/" + device, MS_NOSUID | MS_NOEXEC)
    os.makedirs(new + VIEW_HARNESS)
    for script in ("_sandbox_worker.py", "_sandbox_child.py"):
        with open(os.path.join(HERE, script), "rb") as source, open(f"{new}{VIEW_HARNESS}/{script}", "wb") as copy:
            copy.write(source.read())
    os.makedirs(new + SCRATCH)
    owner = spec["uid"] or 0
    mount("scratch", new + SCRATCH, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
          f"size={spec['scratch_mb']}m,nr_inodes={spec['scratch_files'] + 1},mode=0700,uid={owner},gid={owner}")
    os.makedirs(new + "/proc")
    mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # for the title; gone before programs
    os.chdir(new)
    libc_call("syscall", SYS_PIVOT_ROOT[os.uname().machine], ".", ".")  # KeyError: no view on this machine
    libc_call("umount2", ".", 2)  # MNT_DETACH: the host's tree leaves the namespace
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    inside = {**spec, "in_view": True}
    environment = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "LD_LIBRARY_PATH": VIEW_LIBS}
    import json

    os.execve(VIEW_PYTHON, [VIEW_PYTHON, "-I", "-S", "-B", "-u", f"{VIEW_HARNESS}/_sandbox_worker.py",
                            json.dumps(inside)], environment)


def drop_privileges(spec):
    """Inside the view: no /proc, no capability now or after any exec, no new privileges, the
    programs' uid (as root; in a user namespace the uid stays 0 with no capability), and not
    dumpable, so a program that got past the audit hook cannot reach the worker's memory
    through ptrace or /proc (inherited by every forked child)."""
    if spec.get("in_view"):
        libc_call("umount2", "/proc", 2)
        os.environ.pop("LD_LIBRARY_PATH", None)  # read by the loader already
        cap = 0
        while True:  # the bounding set: what an exec could give back
            try:
                libc_call("prctl", 24, cap, 0, 0, 0)  # PR_CAPBSET_DROP
            except OSError:
                break
            cap += 1
        libc_call("prctl", 38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        if spec["uid"] is not None:
            os.setgroups([])
            os.setresgid(spec["uid"], spec["uid"], spec["uid"])
            os.setresuid(spec["uid"], spec["uid"], spec["uid"])
            libc_call("prctl", 1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, which the uid change cleared: SIGKILL
        import ctypes

        header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
        libc_call("capset", header, data)  # none effective, permitted or inheritable
    libc_call("prctl", 4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    # Forgotten again: a program's `import ctypes` must be a fresh import, which the audit hook blocks.
    for name in [name for name in sys.modules if name.split(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]


def empty_scratch(folder=SCRATCH):
    """Remove whatever the program left in the scratch, even where it took permissions away
    (at most the scratch's file count deep)."""
    os.chmod(folder, 0o700)
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            os.chmod(entry.path, 0o700)
            empty_scratch(entry.path)
            os.rmdir(entry.path)
        else:
            os.unlink(entry.path)


def main():
    import json

    spec = json.loads(sys.argv[1])
    if spec.get("view") and not spec.get("in_view"):
        build_view(spec)  # never returns: runs this script again inside the view
    title = command_line()  # first: it opens /proc/self/mem, which drop_privileges closes
    drop_privileges(spec)
    if spec.get("probe"):  # the sandbox's probe of this isolation: which interpreter, as whom
        print(sys.version, sys.executable, os.getuid(), flush=True)
        return
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
    # Checked now, so a kernel without them fails the start, which the parent reports.
    os.close(os.memfd_create("probe"))
    os.close(os.pidfd_open(os.getpid()))
    send(1, ("ready",))
    while True:
        job = receive(0, harness.read_exactly)
        if job is None:
            return
        reply = run_one(job, harness, devnull, title, init)
        if spec.get("in_view"):
            empty_scratch()
        if reply is None:
            return
        send(1, reply)


if __name__ == "__main__":
    main()
