"""Stands in for macOS: this Linux Python loses what the Python documentation marks "Availability:
Linux" and the package could reach (issue 34), and the kernel refuses what macOS's refuses:

- memfd and its seals (fcntl.F_*SEAL*), eventfd, pidfd, os.pipe2, CPU affinity
  (os.sched_getaffinity: ask os.process_cpu_count or os.cpu_count), mmap.MAP_POPULATE;
- SO_PEERCRED, SOCK_CLOEXEC and SOCK_NONBLOCK; AF_UNIX with SOCK_SEQPACKET, abstract (NUL-first)
  addresses and paths over 103 bytes; POSIX shared-memory names over 31 characters;
- numba-cuda, which has no macOS build (lesson 14 then skips its kernels with the reason).

Kept although macOS lacks it: select.epoll (asyncio's and so Jupyter's kernels pick their selector
from it on this Linux kernel; the package itself must not use it).
"""

import fcntl
import importlib.util
import mmap
import os
import socket
import sys

_cut = importlib.util.spec_from_file_location(
    "allreduce_edu_cut", os.path.join(os.path.dirname(os.path.dirname(__file__)), "cut.py"))
cut = importlib.util.module_from_spec(_cut)
_cut.loader.exec_module(cut)

cut.remove(fcntl, "F_ADD_SEALS", "F_GET_SEALS", "F_SEAL_SEAL", "F_SEAL_SHRINK", "F_SEAL_GROW",
           "F_SEAL_WRITE", "F_SEAL_FUTURE_WRITE", "F_GETPIPE_SZ", "F_SETPIPE_SZ")
cut.remove(os, "memfd_create", "eventfd", "eventfd_read", "eventfd_write", "pidfd_open",
           "sched_getaffinity", "sched_setaffinity", "pipe2",
           *[n for n in dir(os) if n.startswith(("MFD_", "EFD_"))])
cut.remove(socket, "SO_PEERCRED", "SOCK_CLOEXEC", "SOCK_NONBLOCK")
cut.remove(mmap, "MAP_POPULATE")
cut.refuse_unix_sockets()
cut.short_shm_names()
cut.no_numba_cuda()
sys.modules.pop("allreduce_edu_cut", None)
if __name__ == "sitecustomize":  # not when the Windows cut runs this one first
    cut.chain(os.path.dirname(__file__))
