"""What Linux, macOS and Windows do differently for the processes the package starts, said once:
the CPUs a process may use and their load, the memory still free, how a process group stops,
how a process dies at once, what an exit code means, whether a parent still runs (and how a
rank goes with it).

Each answer checks for the feature (`hasattr(os, "killpg")`), not for the system's name, so the
Linux-only names cut away in tests/cuts/ take the same path as macOS and Windows.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

#: the signal that ends a process at once; Windows has no SIGKILL, and os.kill with SIGTERM there
#: is TerminateProcess, which no handler can catch
HARD_KILL = getattr(signal, "SIGKILL", signal.SIGTERM)


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity where the OS has one, else all of them."""
    if hasattr(os, "process_cpu_count"):  # Python 3.13+: the affinity wherever there is one
        return os.process_cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):  # Linux
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def load_average() -> float:
    """Processes running or waiting for a CPU, averaged over the last minute; NaN where the
    system keeps no such figure (Windows)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def available_bytes() -> int | None:
    """Memory the machine can still give; None where it cannot tell (macOS)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo") as f:  # Linux: MemAvailable counts reclaimable caches too
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    if "SC_AVPHYS_PAGES" in getattr(os, "sysconf_names", {}):  # other POSIX that has it
        with contextlib.suppress(ValueError, OSError):
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if sys.platform == "win32":
        return _windows_available_bytes()
    return None


class _MemoryStatus(ctypes.Structure):  # Windows' MEMORYSTATUSEX
    _fields_ = [("dwLength", ctypes.c_uint32), ("dwMemoryLoad", ctypes.c_uint32)] + [
        (name, ctypes.c_uint64) for name in ("ullTotalPhys", "ullAvailPhys", "ullTotalPageFile",
                                             "ullAvailPageFile", "ullTotalVirtual",
                                             "ullAvailVirtual", "ullAvailExtendedVirtual")]


def _windows_available_bytes() -> int | None:
    status = _MemoryStatus(dwLength=ctypes.sizeof(_MemoryStatus))
    if not ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):
        return None
    return status.ullAvailPhys


def new_group() -> dict:
    """Popen's keyword arguments that start a child in a process group of its own, so that
    stop_group reaches whatever it starts too (POSIX: a new session; Windows: a new group)."""
    if os.name == "posix":
        return {"start_new_session": True}
    return {"creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}


def stop_group(proc: subprocess.Popen, hard: bool = False) -> None:
    """Ask `proc`, started with new_group(), and its group to stop; `hard`: kill them at once.
    POSIX signals the whole group (SIGTERM, then SIGKILL); Windows asks with Ctrl-Break (which
    `allreduce-edu launch` turns into stopping its ranks) and kills with TerminateProcess."""
    if proc.poll() is not None:
        return
    if hasattr(os, "killpg"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            # the group outlives its leader while any member runs
            os.killpg(proc.pid, HARD_KILL if hard else signal.SIGTERM)
        return
    with contextlib.suppress(OSError):  # it ended meanwhile
        if hard:
            proc.kill()
        elif hasattr(signal, "CTRL_BREAK_EVENT"):  # Windows, to a CREATE_NEW_PROCESS_GROUP child
            proc.send_signal(signal.CTRL_BREAK_EVENT)
        else:
            proc.terminate()


def die_now() -> None:
    """End this process at once, as SIGKILL does: no handler, no cleanup, no flushed output (a
    real crash, for the elastic lessons)."""
    os.kill(os.getpid(), HARD_KILL)


def signal_name(exit_code: int | None) -> str | None:
    """The signal that ended a process with this exit code ("SIGKILL"); None when it exited by
    itself (POSIX reports a signal as a negative code; Windows has no such codes)."""
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:  # not a signal's number here
        return None


def parent_watch(parent: int) -> Callable[[], bool]:
    """A check that says whether `parent`, this process's parent, still runs. POSIX hands an
    orphan to another parent, so getppid changes; Windows never does: ask a handle opened now."""
    if sys.platform != "win32":
        return lambda: os.getppid() == parent
    kernel32 = ctypes.windll.kernel32
    handle = kernel32.OpenProcess(0x00100000, False, parent)  # SYNCHRONIZE: may wait on it
    if not handle:  # already gone
        return lambda: False
    return lambda: kernel32.WaitForSingleObject(handle, 0) == 0x102  # WAIT_TIMEOUT: still runs


def exit_when_gone(parent: int) -> None:
    """Exit as soon as the process that started this rank is gone: no rank outlives its caller
    (the portable watch; on Linux the kernel's below needs no thread at all)."""
    alive = parent_watch(parent)
    while alive():
        time.sleep(0.5)
    os._exit(1)


PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent thread exits


def die_with(parent: int) -> None:
    """Ask the kernel to SIGKILL this rank when `parent` goes: it works even while a stuck
    interpreter holds the GIL (seen once: torch's gloo group joining its threads in a destructor),
    with no helper process and nothing polling. The kernel watches the thread that started the
    rank, so every starter spawns from a thread that lives as long as its process (the main
    thread, or runtime/processes.py's spawner). Linux only; elsewhere exit_when_gone remains."""
    if not sys.platform.startswith("linux") or os.getppid() != parent:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):  # no prctl: the Python watch remains
        return
    if os.getppid() != parent:  # it died before the kernel was asked to watch
        os._exit(1)
