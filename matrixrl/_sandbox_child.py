"""Child side of :mod:`matrixrl.sandbox`: run one untrusted program and its tests.

The worker loads this file once and calls :func:`run_program` in a child it forks per program.
Everything the harness touches after the untrusted code starts is a local bound before.
"""

import _imp
import builtins
import os
import resource
import sys
import types  # noqa: F401  (imported now: at import it reads a traceback's frame)

# Frame introspection is denied with an exception that is also a ValueError: the
# standard library's own callers of sys._getframe (typing, enum, namedtuple,
# logging) already fall back quietly on ValueError.
class SandboxDenied(PermissionError, ValueError):
    """An operation the sandbox does not allow."""


# Any of these fails the run even when the program catches the exception.
DENIED_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
    "os.startfile", "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill",
    "resource.setrlimit", "resource.prlimit", "os.symlink",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "sys.settrace", "sys.setprofile", "sys._current_frames", "sys._current_exceptions",
    "sys.addaudithook", "code.__new__", "cpython.PyInterpreterState_New",
    "sqlite3.enable_load_extension", "sqlite3.load_extension",
    # Code objects from bytes: crafted bytecode reads and writes memory past every
    # check here. Imports of modules the worker did not load compile their source
    # instead (``sys.pycache_prefix`` points where no .pyc is).
    "marshal.loads", "marshal.load",
})
DENIED_PREFIXES = ("socket.", "ctypes.", "syslog.", "_winapi.", "winreg.")
# Modules that reach around the audit hook: native calls, unaudited process
# creation, subinterpreters (which do not inherit the hook), fresh copies of the
# modules whose dangerous functions are removed below.
DENIED_MODULES = frozenset({
    "ctypes", "_ctypes", "_posixsubprocess", "_xxsubinterpreters", "_xxinterpchannels",
    "_interpreters", "_interpchannels", "_interpqueues", "_testcapi", "_testinternalcapi",
    "_testmultiphase", "_signal", "posix", "_dbm", "_gdbm",
    # Named shared memory and semaphores: files in /dev/shm, made without an audit
    # event, that outlive the program (a channel to the programs after it).
    "_posixshmem", "_multiprocessing",
    # C libraries that open files themselves, so the hook never sees the path (Tcl, readline,
    # SQLite's ATTACH, curses, OpenSSL, the shadow password file).
    "_tkinter", "readline", "_sqlite3", "_curses", "_curses_panel", "_ssl", "spwd",
    "faulthandler",  # writes the harness's stack where the program asks
})
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
# Without the view (a weaker isolation) the host's /proc holds this process's memory, and
# with it the token: refused, with the trees that lead there, and '..' and symlinks.
READABLE_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"})
HIDDEN_TREES = ("/proc", "/sys", "/dev")
UNCHECKABLE = "(a path with '..' or not a str)"
# Functions made in namespaces without the program's builtins (compiled once here:
# a worker's children then skip the compiler).
CREATE_BUILTIN = compile(
    "def create_builtin(spec):\n"
    "    holder = []\n"
    "    audit('sandbox.create_builtin', spec, holder)\n"
    "    return holder[0]\n"
    # The frozen importer passes a name only; a second argument would be bytes to
    # unmarshal into a code object, without marshal's audit event.
    "def get_frozen_object(name):\n"
    "    holder = []\n"
    "    audit('sandbox.get_frozen_object', name, holder)\n"
    "    return holder[0]\n",
    "<sandbox>", "exec",
)
REFUSE_SIGNAL = compile(
    "def signal(signalnum, handler):\n"
    "    raise PermissionError('sandbox: signal handlers are not available')\n",
    "<sandbox>", "exec",
)


def install_guard(sandbox_dir, violations):
    """Add the audit hook; denied operations are appended to ``violations``. It never calls an
    object the program could have supplied or rebound: it accepts only exact ``str``/``bytes``/``int``
    arguments and uses names bound here. What it refuses: docs/sandbox.md, "The audit hook".
    """
    type_, str_, bytes_, int_ = type, str, bytes, int
    getcwd, getcwdb, append = os.getcwd, os.getcwdb, violations.append
    denied_events, denied_prefixes, denied_modules = DENIED_EVENTS, DENIED_PREFIXES, DENIED_MODULES
    frame_attributes, readable_devices, hidden_trees = FRAME_ATTRIBUTES, READABLE_DEVICES, HIDDEN_TREES
    denied_error, uncheckable = SandboxDenied, UNCHECKABLE
    # Extension modules load only from the standard library's own directory, not
    # from a shared object the program wrote (the view's scratch cannot map code anyway).
    extension_dir = os.path.dirname(resource.__file__)
    # Builtin modules are made through the hook, once each: a second, fresh copy of
    # _signal or posix would bring back the functions removed from them.
    create_builtin, plain_spec, list_ = _imp.create_builtin, type(sys.implementation), list
    get_frozen_object = _imp.get_frozen_object
    created = set(sys.modules)

    def absolute(path):
        """``path`` made absolute as a str, or None if it is not a plain path or uses '..'
        (with symlinks, /dev/fd -> /proc/self/fd, a textual '..' does not say where it ends)."""
        if type_(path) is bytes_:
            cwd = getcwdb()
            if not (path.isascii() and cwd.isascii()):
                return None  # non-ASCII byte paths are not needed; no codec runs here
            path, cwd = path.decode("ascii"), cwd.decode("ascii")
        elif type_(path) is str_:
            cwd = getcwd()
        else:
            return None  # PathLike objects could answer differently the second time
        if not path.startswith("/"):
            path = cwd + "/" + path
        parts = []
        for part in path.split("/"):
            if part == "..":
                return None
            if part and part != ".":
                parts.append(part)
        return "/" + "/".join(parts)

    def deny(event, what=""):
        entry = event + " " + what if what else event
        if not violations:  # the first one is the verdict's detail; keep memory flat
            append(entry)
        raise denied_error("sandbox: not allowed: " + entry)

    def hook(event, args):
        if event in denied_events or event.startswith(denied_prefixes):
            deny(event)
        elif event == "open":
            if type_(args[0]) is int_:
                return  # wraps a descriptor the process already has
            resolved = absolute(args[0])
            if resolved is None:
                deny("open", uncheckable)
            if resolved not in readable_devices:
                for tree in hidden_trees:
                    if resolved == tree or resolved.startswith(tree + "/"):
                        deny("open", resolved)
        elif event == "import":
            name, path = args[0], args[1]
            if type_(name) is not str_ or name.partition(".")[0] in denied_modules:
                deny(event, name if type_(name) is str_ else "?")
            if path is not None:  # an extension module's shared object
                resolved = absolute(path)
                if resolved is None or resolved.rpartition("/")[0] != extension_dir:
                    deny(event, name + " from " + (resolved or uncheckable))
        elif event == "sandbox.create_builtin":
            name, holder = args[0].name, args[1]
            if type_(name) is not str_ or type_(holder) is not list_ or name in created:
                deny("import", "a second " + name if type_(name) is str_ else uncheckable)
            created.add(name)
            holder.append(create_builtin(plain_spec(name=name)))
        elif event == "sandbox.get_frozen_object":
            name, holder = args[0], args[1]
            if type_(name) is not str_ or type_(holder) is not list_:
                deny("import", uncheckable)
            holder.append(get_frozen_object(name))
        elif event == "sys._getframe" or (
            event == "object.__getattr__" and args[1] in frame_attributes
        ):
            # Not a violation (the standard library asks for frames by itself),
            # just refused: a frame would lead to the harness's locals.
            raise denied_error("sandbox: frame introspection is not available")

    sys.addaudithook(hook)
    namespace = {"__builtins__": {}, "audit": sys.audit}
    exec(CREATE_BUILTIN, namespace)
    _imp.create_builtin = namespace["create_builtin"]  # the originals live on only in the hook
    _imp.get_frozen_object = namespace["get_frozen_object"]


# -- the answer in a process of its own ---------------------------------------------------------
#
# With an entry point, the tests run in this process and the program in a child of it, calling
# its function through a pipe; values cross as JSON with tags, decoded here by json.loads, which
# runs no code (docs/sandbox.md, "The answer in a process of its own").

DEEPEST = 100  # levels of nesting a value may have
MAX_REPLY = 64 << 20  # bytes of one message between the two processes
UNTRUSTED_TYPE = (
    "the answer returned a value of a type the tests cannot trust; return numbers, "
    "strings, bytes, None, or lists, tuples, dicts and sets of them"
)


def to_data(value, depth=0, shared=None):
    """``value`` as JSON data with tags (see above); TypeError for anything else. An instance
    of a class that ``shared`` (a namespace) holds under its name goes as that name and its
    attributes, which the other side puts in its own class of that name (:func:`from_data`)."""
    kind = type(value)
    if kind is type(None) or kind is bool or kind is int or kind is float or kind is str:
        return value
    if depth > DEEPEST:
        raise TypeError(f"the answer is nested deeper than {DEEPEST} levels")
    depth += 1
    # Subclasses as what the base type stores (bool cannot be subclassed).
    if issubclass(kind, int):
        return int.__int__(value)
    if issubclass(kind, float):
        return float.__float__(value)
    if issubclass(kind, str):
        return str.__str__(value)
    if issubclass(kind, bytes):
        return {"bytes": bytes.hex(value)}
    if issubclass(kind, complex):
        return {"complex": [complex.__getattribute__(value, "real"), complex.__getattribute__(value, "imag")]}
    if issubclass(kind, list):
        return {"list": [to_data(item, depth, shared) for item in list.__iter__(value)]}
    if issubclass(kind, tuple):
        return {"tuple": [to_data(item, depth, shared) for item in tuple.__iter__(value)]}
    if issubclass(kind, dict):
        return {"dict": [[to_data(key, depth, shared), to_data(item, depth, shared)] for key, item in dict.items(value)]}
    if issubclass(kind, frozenset):
        return {"frozenset": [to_data(item, depth, shared) for item in frozenset.__iter__(value)]}
    if issubclass(kind, set):
        return {"set": [to_data(item, depth, shared) for item in set.__iter__(value)]}
    name = type.__dict__["__name__"].__get__(kind)
    if shared is not None and shared.get(name) is kind:
        return {"object": [name, to_data(dict(object.__getattribute__(value, "__dict__")), depth, shared)]}
    raise TypeError(UNTRUSTED_TYPE)


def from_data(data, depth=0, shared=None):
    """The value :func:`to_data` encoded; ValueError for anything it could not have made. An
    object is made in the class of its name that ``shared`` defines (``__module__``
    "__sandbox__": the prompt's or the tests' own), without running its ``__init__``."""
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is float or kind is str:
        return data
    if depth > DEEPEST or kind is not dict or len(data) != 1:
        raise ValueError("the answer's process sent a value it could not have made")
    depth += 1
    ((tag, body),) = data.items()
    if tag == "list":
        return [from_data(item, depth, shared) for item in body]
    if tag == "tuple":
        return tuple(from_data(item, depth, shared) for item in body)
    if tag == "dict":
        return {from_data(key, depth, shared): from_data(item, depth, shared) for key, item in body}
    if tag == "set":
        return {from_data(item, depth, shared) for item in body}
    if tag == "frozenset":
        return frozenset(from_data(item, depth, shared) for item in body)
    if tag == "bytes" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "complex" and type(body) is list and len(body) == 2:
        return complex(float(body[0]), float(body[1]))
    if tag == "object" and type(body) is list and len(body) == 2 and shared is not None:
        kind = shared.get(body[0])
        if type(kind) is type and kind.__module__ == "__sandbox__":
            attributes = from_data(body[1], depth, shared)
            try:
                made = object.__new__(kind)
                made.__dict__.update(attributes)
                return made
            except (TypeError, AttributeError):
                pass
    raise ValueError("the answer's process sent a value it could not have made")


def send(fd, message, dumps):
    """One message: its length in 8 bytes, then its JSON."""
    data = dumps(message).encode("utf-8", "surrogatepass")
    data = len(data).to_bytes(8, "big") + data
    while data:
        data = data[os.write(fd, data):]


def receive(fd, loads):
    """The next message, or None at end-of-file (the other process ended)."""
    head = read_exactly(fd, 8)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > MAX_REPLY:
        raise ValueError(f"the answer's process sent a message of {size} bytes, over {MAX_REPLY}")
    body = read_exactly(fd, size)
    return None if body is None else loads(body.decode("utf-8", "surrogatepass"))


def read_exactly(fd, size):
    """``size`` bytes from ``fd``, or None at end-of-file first (the worker reads its jobs so too)."""
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def reply_sender(fd, token):
    """``send_reply(message)``: ``message`` with ``token``, framed as :func:`send` frames, on ``fd``.

    Built before the program runs, so nothing the program rebinds sees the token (docs/sandbox.md).
    """
    import _json

    def refuse(value):
        raise TypeError(f"not JSON: {type(value).__name__}")

    encode = _json.make_encoder(None, refuse, _json.encode_basestring_ascii, None, ":", ",", False, False, True)
    write, length, join = os.write, len, "".join

    def send_reply(message):
        message["token"] = token
        data = join(encode(message, 0)).encode("ascii")
        data = length(data).to_bytes(8, "big") + data
        while data:
            data = data[write(fd, data):]

    return send_reply


def serve_answer(program, sandbox_dir, guard, entry_point, calls, replies, token):
    """The program's process: run ``program``, then call its ``entry_point`` for each call
    that arrives on ``calls`` and send each reply, with ``token`` and whether the program has
    tried something forbidden yet (``blocked``), on ``replies``; end at end-of-file."""
    import json

    loads = json.JSONDecoder().decode
    send_reply = reply_sender(replies, token)
    receive_, to_data_, from_data_, describe_ = receive, to_data, from_data, describe
    run, exit_now, is_instance, type_, str_, callable_ = exec, os._exit, isinstance, type, str, callable
    base_error, memory_error, exit_request = BaseException, MemoryError, SystemExit
    violations = []
    refuse_signal_handlers()
    sys.pycache_prefix = sandbox_dir + "/.no-bytecode"  # see run_together
    if guard:
        install_guard(sandbox_dir, violations)
    namespace = {"__name__": "__sandbox__", "__builtins__": builtins}

    def blocked():
        return violations[0][:300] if violations else None

    try:
        run(program, namespace)
    except base_error as error:
        reason = "memory" if is_instance(error, memory_error) else "exited" if is_instance(error, exit_request) else "failed"
        send_reply({"ended": reason, "detail": describe_(error), "blocked": blocked()})
        exit_now(0)
    # Only exact str keys: a str subclass with an __eq__ of its own would answer the lookup.
    function = None
    for name, value in namespace.items():
        if type_(name) is str_ and name == entry_point:
            function = value
    send_reply({"ready": callable_(function), "blocked": blocked()})
    while True:
        call = receive_(calls, loads)
        if call is None:
            exit_now(0)
        try:
            args, kwargs = from_data_(call["args"], 0, namespace), from_data_(call["kwargs"], 0, namespace)
            reply = {"value": to_data_(function(*args, **kwargs), 0, namespace)}
        except base_error as error:
            reply = {"error": type_(error).__name__, "detail": describe_(error)}
        reply["blocked"] = blocked()
        try:
            send_reply(reply)
        except base_error as error:  # a reply JSON cannot hold (a huge int)
            send_reply({"error": "TypeError", "detail": describe_(error), "blocked": blocked()})


class AnswerProcess:
    """The tests' side: the program's process, and a function that calls its entry point."""

    def __init__(self, pid, calls, replies, token):
        import json

        self.pid, self.calls, self.replies, self.token = pid, calls, replies, token
        self.dumps, self.loads = json.JSONEncoder().encode, json.JSONDecoder().decode
        self.blocked = None

    def next_reply(self):
        try:
            reply = receive(self.replies, self.loads)
        except (ValueError, UnicodeDecodeError, RecursionError) as error:
            raise ValueError(f"the answer's process sent what is not a reply: {describe(error)}") from None
        if reply is None:
            self.end_as_the_program_ended()
        if type(reply) is not dict or reply.get("token") != self.token:  # the program's own writing
            raise ValueError("the answer's process sent what is not a reply")
        self.blocked = self.blocked or reply.get("blocked")
        return reply

    def end_as_the_program_ended(self):
        """The program's process ended without a word (``os._exit``, a signal, the kernel's
        memory limit): end this one the same way, so the verdict reads as it would have
        with program and tests in one process."""
        _pid, status = os.waitpid(self.pid, 0)
        if os.WIFSIGNALED(status):
            os.kill(os.getpid(), os.WTERMSIG(status))
            os._exit(1)  # a signal this process ignores
        os._exit(os.WEXITSTATUS(status))

    def function(self, shared):
        """The answer's function as the tests call it; ``shared``: the tests' namespace."""

        def answer(*args, **kwargs):
            try:
                call = {"args": to_data(list(args), 0, shared), "kwargs": to_data(kwargs, 0, shared)}
            except TypeError as error:
                raise TypeError(f"the tests passed the answer something it cannot receive: {error}") from None
            send(self.calls, call, self.dumps)
            reply = self.next_reply()
            if "value" in reply:
                return from_data(reply["value"], 0, shared)
            raise answer_error(str(reply.get("error")), str(reply.get("detail")))

        return answer


def answer_error(name, detail):
    """The exception the answer raised, as the tests see it: a built-in exception of the same
    name (its message from ``describe``), so tests that expect a ValueError still get one."""
    message = detail.partition(": ")[2] if detail.startswith(name + ":") else detail
    kind = vars(builtins).get(name)
    if kind in (StopIteration, StopAsyncIteration, GeneratorExit):  # would end the tests' loop early
        return RuntimeError(f"{name}: {message}")
    if isinstance(kind, type) and issubclass(kind, BaseException):
        try:
            return kind(message)
        except Exception:
            pass
    return RuntimeError(f"{name}: {message}")


def snapshot_modules():
    """``restore()``: the modules as they are now (attributes, ``sys.modules``, the import system), for the
    tests after the program."""
    module_type, dict_, list_, vars_ = type(sys), dict, list, vars
    modules, importer_cache = sys.modules, sys.path_importer_cache
    saved_modules, saved_cache = dict_(modules), dict_(importer_cache)
    saved_namespaces = [
        (vars_(module), dict_(vars_(module))) for module in saved_modules.values() if type(module) is module_type
    ]
    saved_lists = [(found, list_(found)) for found in (sys.path, sys.meta_path, sys.path_hooks)]
    kept = []

    def restore():
        kept.append(dict_(modules))
        modules.clear()
        modules.update(saved_modules)
        for namespace, saved in saved_namespaces:
            kept.append(dict_(namespace))
            namespace.clear()
            namespace.update(saved)
        for found, saved in saved_lists:
            kept.append(list_(found))
            found[:] = saved
        kept.append(dict_(importer_cache))
        importer_cache.clear()
        importer_cache.update(saved_cache)

    return restore


def refuse_signal_handlers():
    """Python-level signal handlers receive the interrupted frame; none may be set."""
    import _signal

    namespace = {"__builtins__": {"PermissionError": PermissionError}}
    exec(REFUSE_SIGNAL, namespace)
    _signal.signal = namespace["signal"]
    # Memory files, which the address-space limit does not count, and signals by pidfd.
    for name in ("memfd_create", "pidfd_open"):
        for module in (os, sys.modules["posix"]):
            if hasattr(module, name):
                delattr(module, name)
    for module in (_signal, sys.modules.get("signal")):
        if module is not None and hasattr(module, "pidfd_send_signal"):
            delattr(module, "pidfd_send_signal")


def describe(error):
    """``Type: message`` of an exception, short; never raises."""
    try:
        text = f"{type(error).__name__}: {error}"
    except BaseException:  # a hostile __str__
        text = "unprintable exception"
    return text[:300]


def run_program(
    pass_token, report_token, program, tests, sandbox_dir, memory_mb, cpu_s, guard, verdict_fd,
    entry_point=None,
):
    """Limit this process, run ``program`` and ``tests`` in ``sandbox_dir``, write the verdict to
    ``verdict_fd`` and end the process: together here (:func:`run_together`), or, with
    ``entry_point``, the program in a child process (:func:`run_apart`)."""
    mib = 1 << 20
    for limit, value in (
        (resource.RLIMIT_AS, memory_mb * mib),
        (resource.RLIMIT_CPU, cpu_s),
        (resource.RLIMIT_FSIZE, 16 * mib),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))
    if entry_point is None:
        reason, detail = run_together(program, tests, sandbox_dir, guard)
    else:
        reason, detail = run_apart(program, tests, sandbox_dir, guard, verdict_fd, entry_point)
    if reason == "passed":
        record = pass_token
    else:  # a token of its own: a program that catches it learns nothing that passes
        message = reason + " " + detail.replace("\n", " ")
        record = report_token + b" " + message.encode("utf-8", "replace")
    os.write(verdict_fd, record + b"\n")
    os._exit(0)


def no_new_processes():
    """Enforced by the kernel for every user but root (where the sandbox drops to an
    unprivileged uid first): no new processes or threads at all."""
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))


def outcome(error):
    """The reason and detail of tests that raised ``error``, in the tests' own process. (Where
    a program runs, ``run_together`` and ``serve_answer`` decide the same with names bound
    before it, which it cannot rebind.)"""
    if isinstance(error, MemoryError):
        return "memory", describe(error)
    if isinstance(error, SystemExit):
        return "exited", describe(error)
    return "failed", describe(error)


def run_apart(program, tests, sandbox_dir, guard, verdict_fd, entry_point):
    """The tests here, the program in a child process (``serve_answer``); see the section
    above ``to_data``. This process runs no line of the program's, so it needs no hook."""
    calls_read, calls_write = os.pipe()
    replies_read, replies_write = os.pipe()
    token = os.urandom(16).hex()
    pid = os.fork()
    if pid == 0:
        for fd in (verdict_fd, calls_write, replies_read):
            os.close(fd)
        no_new_processes()
        try:
            serve_answer(program, sandbox_dir, guard, entry_point, calls_read, replies_write, token)
        finally:
            os._exit(1)
    os.close(calls_read)
    os.close(replies_write)
    no_new_processes()
    answer = AnswerProcess(pid, calls_write, replies_read, token)
    try:
        first = answer.next_reply()
        if "ended" in first:  # whatever the program's process claims, never a pass
            reason = first["ended"] if first["ended"] in ("memory", "exited") else "failed"
            detail = str(first.get("detail"))
        elif not first.get("ready"):
            reason, detail = "failed", f"NameError: the answer defines no function {entry_point!r}"
        else:
            namespace = {"__name__": "__sandbox__", "__builtins__": builtins}
            function = answer.function(namespace)
            namespace.update({entry_point: function, "__answer__": function})
            exec(tests, namespace)
            reason, detail = "passed", ""
    except BaseException as error:
        reason, detail = outcome(error)
    if answer.blocked:
        reason, detail = "blocked", str(answer.blocked)[:300]
    return reason, detail


def run_together(program, tests, sandbox_dir, guard):
    """Program and tests in this process: the tests see the program's globals."""
    no_new_processes()
    # Everything the harness uses from here on, bound before the program can rebind it.
    run, is_instance, type_, str_ = exec, isinstance, type, str
    base_error, memory_error, exit_request = BaseException, MemoryError, SystemExit
    describe_ = describe
    pristine_builtins = dict(vars(builtins))
    builtin_names = frozenset(name for name in pristine_builtins if not name.startswith("__"))

    violations = []
    refuse_signal_handlers()
    # No .pyc there: a module the worker did not load compiles from its source, since
    # unmarshalling bytecode is refused.
    sys.pycache_prefix = sandbox_dir + "/.no-bytecode"
    if guard:
        install_guard(sandbox_dir, violations)
    namespace = {"__name__": "__sandbox__", "__builtins__": builtins}
    restore_modules = snapshot_modules()
    try:
        run(program, namespace)
        restore_modules()
        # The tests see the builtins as they were before the program ran, and not the
        # program's globals that shadow a builtin (``abs = lambda x: 0``), nor any global
        # whose name is not a plain str (a str subclass can answer a lookup of any name).
        test_namespace = {
            name: value for name, value in namespace.items()
            if type_(name) is str_ and name not in builtin_names
        }
        test_namespace["__builtins__"] = dict(pristine_builtins)
        run(tests, test_namespace)
    except base_error as error:
        if is_instance(error, memory_error):
            reason = "memory"
        elif is_instance(error, exit_request):
            reason = "exited"
        else:
            reason = "failed"
        detail = describe_(error)
    else:
        reason, detail = "passed", ""
    if violations:
        reason, detail = "blocked", violations[0][:300]
    return reason, detail
