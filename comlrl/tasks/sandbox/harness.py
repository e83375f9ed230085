"""The sandboxed side, run by ``Sandbox`` as ``python -I -S harness.py`` (standard library
only, Python 3.10+; it is a script, not imported by the trainer).

Two processes: this one, the *judge*, and the *program* it forks. The judge sets up the
namespaces, forks, and then never runs model code: it reads the tests (after the fork, so they
and the result marker are in no memory the program shares), runs each ``check`` itself with
stubs for the program's functions, and reports. The program runs the model's code and answers
calls of its functions over a pipe, its values sent as tagged plain data (``encode``) that the
judge rebuilds from builtin types only, so an object with its own ``__eq__`` never reaches an
``assert``. What the program does to its own ``builtins`` or to this module's copy in its memory
changes nothing in the judge.
"""

import ast
import builtins
import ctypes
import json
import os
import resource
import select
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's folder out
from plain import decode, encode  # noqa: E402

del sys.path[0]

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
ROOT = "/tmp"  # the new root's tmpfs is mounted here, in the judge's own mount namespace only
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
INODES = 4096  # files and folders the program may create on its tmpfs
MAX_REPLY = 16 << 20  # bytes of one answer of the program; past them the call fails

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def call(result, what):
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def mount(source, target, fstype, flags, data=None):
    encoded = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    call(libc.mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]), f"mount {target}")


# ------------------------------------------------------------------------------ namespaces
def enter_namespaces(ns, switch):
    """Unshare every namespace (the PID one takes effect for the forked program) and build the
    program's root: a capped tmpfs with read-only binds of the standard library and system
    libraries, minus their site-packages."""
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID
    call(libc.unshare(flags | (CLONE_NEWUSER if ns["user"] else 0)), "unshare")
    if ns["user"]:
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as file:
                file.write(text)
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted below reaches the host
    mount("tmpfs", ROOT, "tmpfs", MS_NOSUID | MS_NODEV, f"size={ns['work_bytes']},nr_inodes={INODES},mode=755")
    binds, links = view()
    for path in binds:
        bind(path, device=path in DEVICES)
    for path in binds:
        for hidden in site_folders(path):
            mount("tmpfs", ROOT + hidden, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=755")
    for link, target in links:
        os.symlink(target, ROOT + link)
    os.makedirs(ROOT + "/work", mode=0o700)
    os.makedirs(ROOT + "/tmp", mode=0o1777)
    os.chmod(ROOT + "/tmp", 0o1777)
    if switch:
        os.chown(ROOT + "/work", *switch)


def view():
    """The host paths the program sees (read-only) and the symlinks of a merged /usr."""
    stdlib = os.path.dirname(os.__file__)
    binds, links = [], []
    for path in ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/lib32"):
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            binds.append(path)
    if not any(stdlib.startswith(path + "/") for path in binds):
        binds.append(stdlib)
    binds += [path for path in ("/etc/ld.so.cache", *DEVICES) if os.path.exists(path)]
    return binds, links


def site_folders(path):
    """Installed packages under a bound tree: the trainer's, and the way to datasets' answers."""
    if not os.path.isdir(path):
        return []
    trees = [path] + [os.path.join(path, name) for name in os.listdir(path) if name.startswith("python3")]
    found = [os.path.join(tree, name) for tree in trees for name in ("site-packages", "dist-packages")]
    return [folder for folder in found if os.path.isdir(folder)]


def bind(path, device):
    target = ROOT + path
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "w").close()
    mount(path, target, None, MS_BIND)
    # A remount may not clear the flags the source mount has (the kernel locks them in a user
    # namespace), so they are kept; a device needs its mount without nodev.
    kept = os.statvfs(path).f_flag
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (0 if device else MS_NODEV)
    flags |= kept & (MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
    flags |= MS_RELATIME if kept & 4096 else 0  # ST_RELATIME is 4096 in statvfs
    mount(None, target, None, flags)


# ------------------------------------------------------------------------------ the program's process
def become_program(spec, inbox):
    """In the forked child, before any model code: die with the judge, enter the new root, set
    the limits and drop every privilege (an unprivileged process cannot raise them again)."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if select.select([inbox], [], [], 0)[0]:
        os._exit(1)  # the judge died before the line above: its end of the pipe is closed
    ns = spec["namespace"]
    if ns is not None:
        os.setsid()  # kill(0) from the program then reaches its own namespace's processes only
        os.chroot(ROOT)
        os.chdir("/work")
    for name, value in spec["limits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    for capability in range(64):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0 and ctypes.get_errno() != 1:
            break  # EINVAL: past the last capability; EPERM (1): not ours to drop
    call(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if spec["switch"]:
        uid, gid = spec["switch"]
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
    call(libc.capset(header, data), "capset")  # root in a user namespace keeps none of its powers


def serve(spec, inbox, outbox):
    """Run the program, then answer the judge's calls until it closes the pipe."""
    namespace = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        exec(compile(spec["program"], "<program>", "exec"), namespace)
    except Exception as exc:
        return answer(outbox, {"error": describe(exc)})
    entry = spec["entry_point"]
    if not callable(namespace.get(entry)):
        return answer(outbox, {"error": f"entry point {entry} is not a callable after the program ran"})
    calls = [0]
    helper = spec["helper"]
    if helper and callable(namespace.get(helper)):
        inner = namespace[helper]

        def counted(*args, **kwargs):
            calls[0] += 1
            return inner(*args, **kwargs)

        namespace[helper] = counted
    answer(outbox, {"ran": [name for name, value in namespace.items() if callable(value) and isinstance(name, str)]})
    reader = Lines(inbox)
    while True:
        request = json.loads(reader.line(None))
        try:
            function = namespace[request["call"]]
            reply = {"value": encode(function(*decode(request["args"]), **decode(request["kwargs"])))}
        except Exception as exc:  # SystemExit and the like end the program: the rest fail
            reply = {"raised": describe(exc)}
        reply["calls"] = calls[0]
        answer(outbox, reply)


def answer(fd, message):
    """Send one message to the judge after the program's buffered output: the judge may kill
    the process as soon as it has the answer, and the output is for debugging."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    send(fd, message)


def describe(exc):
    return type(exc).__name__ + ": " + str(exc)[:200]


def send(fd, message):
    write(fd, json.dumps(message) + "\n")


def write(fd, text):
    data = text.encode()
    while data:
        data = data[os.write(fd, data) :]


# ------------------------------------------------------------------------------ the judge
class Gone(Exception):
    """The program's process ended or sent what is not an answer."""


class TestTimeout(Exception):
    pass


class Lines:
    """Newline-ended messages from a pipe, each at most MAX_REPLY bytes, read by a deadline."""

    def __init__(self, fd):
        self.fd, self.buffer = fd, b""

    def line(self, deadline):
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_REPLY:
                raise Gone(f"an answer over {MAX_REPLY} bytes")
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and (wait <= 0 or not select.select([self.fd], [], [], wait)[0]):
                raise TestTimeout()
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise Gone("the program's process ended")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line


class Program:
    """The judge's handle on the program's process: stubs that call its functions."""

    def __init__(self, pid, inbox, outbox):
        self.pid, self.outbox, self.lines, self.calls = pid, outbox, Lines(inbox), 0
        self.deadline = None

    def allow(self, seconds):
        """The next answers must come within ``seconds`` from now."""
        self.deadline = time.monotonic() + seconds

    def message(self):
        try:
            message = json.loads(self.lines.line(self.deadline))
        except (ValueError, UnicodeDecodeError) as error:
            raise Gone(f"not an answer: {error}") from None
        if not isinstance(message, dict):
            raise Gone("not an answer")
        return message

    def stub(self, name):
        def remote(*args, **kwargs):
            try:
                send(self.outbox, {"call": name, "args": encode(args), "kwargs": encode(kwargs)})
            except OSError:
                raise Gone("the program's process ended") from None
            reply = self.message()
            if type(reply.get("calls")) is int:
                self.calls = reply["calls"]
            if "value" not in reply:
                raise Gone(f"{name} raised {reply.get('raised')}")
            try:
                return decode(reply["value"])
            except (ValueError, TypeError, IndexError, KeyError, RecursionError) as error:
                raise Gone(f"{name} returned what is not plain data: {error}") from None

        remote.__name__ = name
        return remote

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)  # as its PID namespace's first process, it returns once all are gone


def read_exactly(fd, size):
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError("the sandbox's input ended early")
        data += chunk
    return data


def has_body(function):
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return bool(body)


def judge(spec, program: Program, tests, report):
    """Report the program's stages and each test's verdict; the tests run here, never there."""
    try:
        tree = ast.parse(spec["program"])
    except (SyntaxError, ValueError) as error:
        return report("error", json.dumps(describe(error)))
    report("parsed")
    entry = spec["entry_point"]
    functions = (n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    if any(n.name == entry and has_body(n) for n in functions):
        report("defined")
    program.allow(tests["test_timeout"])
    try:
        first = program.message()
    except (Gone, TestTimeout) as error:
        kind = "timed out" if isinstance(error, TestTimeout) else "ended"
        return report("error", json.dumps(f"the program {kind} before its top level finished"))
    names = first.get("ran")
    if not isinstance(names, list):
        return report("error", json.dumps(str(first.get("error", "the program sent no result"))))
    report("ran")
    # The tests see the program's functions (HumanEval's use ``poly`` of the prompt), but never
    # in place of a builtin: a program's ``abs`` returning 0 would pass ``abs(got - want) < eps``.
    usable = [name for name in names if isinstance(name, str) and name.isidentifier() and not hasattr(builtins, name)]
    stubs = {name: program.stub(name) for name in usable}
    for index, test in enumerate(tests["tests"]):
        scope = {"__builtins__": builtins, **stubs}
        program.allow(tests["test_timeout"])
        try:
            exec(compile(test, f"<test {index}>", "exec"), scope)
            scope["check"](stubs[entry])
            verdict = "pass"
        except TestTimeout:
            verdict = "timeout"
        except BaseException:
            verdict = "fail"
        report("test", str(index), verdict, str(program.calls))
        if verdict == "timeout":
            break


def main():
    spec = json.loads(read_exactly(0, int(read_exactly(0, 10))))
    setup_error = None
    if spec["namespace"] is not None:
        try:
            enter_namespaces(spec["namespace"], spec["switch"])
        except OSError as error:
            setup_error = f"namespace set-up failed: {error}"
    to_program, from_judge = os.pipe()
    to_judge, from_program = os.pipe()
    pid = os.fork() if setup_error is None else -1
    if pid == 0:
        os.close(0)
        os.close(from_judge)
        os.close(to_judge)
        try:
            become_program(spec, to_program)
            serve(spec, to_program, from_program)
        finally:
            os._exit(0)
    os.close(to_program)
    os.close(from_program)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # a program of the same user may not ptrace the judge
    rest = b""
    while chunk := os.read(0, 1 << 16):
        rest += chunk
    tests = json.loads(rest)
    mark = tests["nonce"]

    def report(*words):
        write(1, "\n" + mark + " " + " ".join(words) + "\n")

    if setup_error is not None:
        report("error", json.dumps(setup_error))
    else:
        program = Program(pid, to_judge, from_judge)
        judge(spec, program, tests, report)
        program.kill()
    report("done")
    os._exit(0)


if __name__ == "__main__":
    main()
