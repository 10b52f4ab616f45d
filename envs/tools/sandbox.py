"""Running untrusted Python: one subprocess per call, boxed in several layers.

* a fresh session / process group (``start_new_session``) and a wall-clock
  timeout that kills the *whole group*;
* rlimits: CPU seconds, address space, file size, open files, and process count
  (as root the child first drops to ``nobody`` where ``nobody`` can run the
  interpreter, since root ignores RLIMIT_NPROC; otherwise the audit hook below is
  what stops forks);
* a throwaway working directory, removed afterwards; ``-I`` isolated mode,
  empty environment;
* an audit hook installed before the user code runs that refuses sockets,
  ``fork``/``exec``/``subprocess`` (and importing the modules that reach them
  directly: ``_posixsubprocess``, ``_socket``, ``ctypes``, ...), and opening files
  outside the working directory (reads of the Python installation stay allowed);
* stdout/stderr captured and truncated.

The parent never runs user code and always gets a :class:`SandboxResult` back,
whatever the child did (tests: infinite loop, fork bomb, memory bomb, socket,
reads and writes outside the directory).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass

_GUARD = r'''
import os, sys
_root = os.path.realpath(os.getcwd())
_ro = tuple(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, %(stdlib)r, %(purelib)r, %(platlib)r, "/dev/null", "/dev/urandom", "/proc/self", "/etc/localtime", "/usr/share/zoneinfo"))
def _inside(p, roots):
    return any(p == r or p.startswith(r.rstrip(os.sep) + os.sep) for r in roots)
_BLOCK = ("socket.", "subprocess.", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec",
          "os.spawn", "os.system", "os.kill", "os.killpg", "pty.spawn", "ctypes.dlopen",
          "os.setuid", "os.chdir", "shutil.rmtree")
_PATH_EVENTS = {"os.listdir", "os.scandir", "os.remove", "os.rename", "os.mkdir", "os.rmdir",
                "os.chmod", "os.chown", "os.symlink", "os.link", "os.truncate", "os.utime",
                "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr", "shutil.copyfile",
                "shutil.copytree", "shutil.move", "shutil.make_archive"}
_NO_IMPORT = {"_posixsubprocess", "_socket", "socket", "ctypes", "_ctypes", "multiprocessing",
              "_multiprocessing", "pty", "resource", "signal"}
def _hook(event, args):
    if event == "import" and args and str(args[0]).split(".")[0] in _NO_IMPORT:
        raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
    if event.startswith(_BLOCK) and not event.startswith("socket.getaddrinfo"):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event in _PATH_EVENTS:
        for a in args:
            if not isinstance(a, (str, bytes, os.PathLike)):
                continue
            p = os.path.realpath(os.fsdecode(a))
            if not (_inside(p, (_root,)) or (event in ("os.listdir", "os.scandir")
                                             and _inside(p, _ro))):
                raise PermissionError(f"sandbox: {event} on {p} is outside the working directory")
        return
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        p = os.path.realpath(os.fsdecode(args[0]))
        write = len(args) > 1 and isinstance(args[1], str) and any(c in args[1] for c in "wax+")
        if _inside(p, (_root,)) or (not write and _inside(p, _ro)):
            return
        raise PermissionError(f"sandbox: access to {p} is outside the working directory")
sys.addaudithook(_hook)
del _hook
with open("__main__.py") as _f:
    _code = compile(_f.read(), "<sandbox>", "exec")
exec(_code, {"__name__": "__main__"})
'''


@dataclass(frozen=True)
class SandboxLimits:
    wall_seconds: float = 5.0
    cpu_seconds: int = 5
    memory_mb: int = 512
    file_mb: int = 16
    max_processes: int = 16
    max_open_files: int = 64
    max_output_chars: int = 4000


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    seconds: float

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
                         else f"[killed by signal {signal.Signals(sig).name}]")
        elif self.returncode not in (0, None):
            parts.append(f"[exit code {self.returncode}]")
            if self.stderr:
                parts.append(self.stderr.rstrip().splitlines()[-1])
        return "\n".join(parts) if parts else "[no output]"


def _limits(lim: SandboxLimits, drop_to: tuple[int, int] | None):
    import resource

    def apply() -> None:
        mb = 1 << 20
        resource.setrlimit(resource.RLIMIT_CPU, (lim.cpu_seconds, lim.cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_AS, (lim.memory_mb * mb, lim.memory_mb * mb))
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim.file_mb * mb, lim.file_mb * mb))
        resource.setrlimit(resource.RLIMIT_NOFILE, (lim.max_open_files, lim.max_open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if drop_to is not None:  # root ignores RLIMIT_NPROC: become nobody first
            os.setgroups([])
            os.setgid(drop_to[1])
            os.setuid(drop_to[0])
        resource.setrlimit(resource.RLIMIT_NPROC, (lim.max_processes, lim.max_processes))
    return apply


def _nobody() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    try:
        import pwd
        pw = pwd.getpwnam("nobody")
        return pw.pw_uid, pw.pw_gid
    except (KeyError, ImportError):
        return None


def _truncate(b: bytes, n: int) -> str:
    s = b.decode("utf-8", errors="replace")
    return s if len(s) <= n else s[:n] + f"\n... [truncated {len(s) - n} chars]"


_CAN_DROP: list[bool] = []  # learnt once: can ``nobody`` start this interpreter?


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Runs ``code`` in a boxed child process; never raises for anything the code does."""
    drop = _nobody() if (not _CAN_DROP or _CAN_DROP[0]) else None
    try:
        res = _run(code, limits, drop)
        if drop is not None and not _CAN_DROP:
            _CAN_DROP.append(True)
        return res
    except PermissionError:
        if drop is None:
            raise
        _CAN_DROP[:] = [False]  # e.g. the interpreter lives under /root
        return _run(code, limits, None)


def _run(code: str, limits: SandboxLimits, drop) -> SandboxResult:
    work = tempfile.mkdtemp(prefix="turngym-sbx-")
    try:
        with open(os.path.join(work, "__main__.py"), "w") as f:
            f.write(code)
        if drop is not None:
            os.chown(work, *drop)
            os.chown(os.path.join(work, "__main__.py"), *drop)
        paths = sysconfig.get_paths()
        guard = _GUARD % {"stdlib": paths["stdlib"], "purelib": paths["purelib"],
                          "platlib": paths["platlib"]}
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", guard], cwd=work,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={"PYTHONIOENCODING": "utf-8"},
                                start_new_session=True, preexec_fn=_limits(limits, drop))
        timed_out = False
        try:
            out, err = proc.communicate(timeout=limits.wall_seconds)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            out, err = proc.communicate()
        _kill_group(proc.pid)  # stragglers the code left behind
        return SandboxResult(_truncate(out, limits.max_output_chars),
                             _truncate(err, limits.max_output_chars),
                             None if timed_out else proc.returncode, timed_out,
                             time.monotonic() - t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
