"""Stands in for Windows: this Linux Python loses everything the macOS cut takes (tests/cuts/
macos) and what Windows' Python has never had and the package could reach (issue 34):

- the fcntl, resource, pwd, grp and termios modules;
- os.fork, killpg, setsid, getpgid, getuid, geteuid, getgid, getegid, getloadavg, sysconf;
- signal.SIGKILL, SIGSTOP, SIGCONT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGCHLD, SIGPIPE
  (on Windows, os.kill(pid, SIGTERM) is TerminateProcess), signal.alarm, setitimer, pthread_kill;
- socket.AF_UNIX (a socket of that family is refused), sendmsg, recvmsg, send_fds, recv_fds and
  SCM_RIGHTS (no descriptor passing); select.poll and select.epoll; mmap's MAP_* and PROT_*;
- /proc (open() finds nothing there).

Kept, and why (the kernel underneath is Linux, and sys.platform stays "linux"): socket.socketpair() makes a Unix pair, under the hood (Windows makes a loopback TCP
pair; multiprocessing's Pipe uses it here, where Windows' uses named pipes). Popen.kill() and
Process.kill() use the kernel's SIGKILL, as Windows' use TerminateProcess. POSIX shared memory
stays (multiprocessing.shared_memory has no other way on this kernel; Windows maps by name).
"""

import _signal
import contextlib
import importlib.util
import mmap
import multiprocessing.popen_fork
import os
import select
import signal
import socket
import subprocess
import sys

_here = os.path.dirname(__file__)
_macos = importlib.util.spec_from_file_location(
    "allreduce_edu_macos_cut", os.path.join(os.path.dirname(_here), "macos", "sitecustomize.py"))
_module = importlib.util.module_from_spec(_macos)
_macos.loader.exec_module(_module)  # the macOS cut first
cut = _module.cut

# platformdirs picks its module by sys.platform, which stays "linux" here, and that one takes
# os.getuid as it loads: it loads before the cut (on Windows it would load its Windows module)
with contextlib.suppress(ImportError):
    import platformdirs  # noqa: F401
cut.no_modules("fcntl", "resource", "pwd", "grp", "termios")
cut.remove(os, "fork", "forkpty", "killpg", "setsid", "getpgid", "setpgid", "getuid", "geteuid",
           "getgid", "getegid", "getloadavg", "sysconf", "sysconf_names")
cut.remove(signal, "SIGKILL", "SIGSTOP", "SIGCONT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2",
           "SIGALRM", "SIGCHLD", "SIGPIPE", "alarm", "setitimer", "pthread_kill")
subprocess.Popen.kill = lambda self: self.send_signal(_signal.SIGKILL)
multiprocessing.popen_fork.Popen.kill = lambda self: self._send_signal(_signal.SIGKILL)
cut.refuse_unix_sockets(any_unix=True)
cut.remove(socket, "send_fds", "recv_fds", "SCM_RIGHTS", "SCM_CREDENTIALS", "CMSG_LEN",
           "CMSG_SPACE")
cut.missing_methods(socket.socket, "sendmsg", "recvmsg", "recvmsg_into")
cut.remove(select, "poll", "epoll")
cut.no_proc()
cut.remove(mmap, *[n for n in dir(mmap) if n.startswith(("MAP_", "PROT_"))])
sys.modules.pop("allreduce_edu_macos_cut", None)
cut.chain(_here)
