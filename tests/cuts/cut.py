"""Cut this Linux Python's standard library down to what macOS or Windows has (issue 34).

A folder under tests/cuts/ first on PYTHONPATH makes its sitecustomize.py run these at the start
of every Python of that environment (a test's subprocess, the ranks it spawns, a notebook's
kernel), so the package meets the names the other system lacks as missing. The kernel underneath
stays Linux: the cuts prove the package never reaches a Linux-only name, not that it runs there.
"""

from __future__ import annotations

import _socket
import builtins
import errno
import importlib
import io
import os
import socket
import sys

# SOCK_SEQPACKET and friends carry flags (SOCK_CLOEXEC, SOCK_NONBLOCK) above the kind
_KIND_MASK = 0xF
_SUN_PATH = 104  # macOS's sockaddr_un.sun_path: a path of at most 103 bytes and its NUL
_SHM_NAME = 31  # macOS's PSHMNAMLEN: the longest POSIX shared-memory name


def remove(module, *names: str) -> None:
    """Take `names` off `module` where present (a name is missing, as on the other system)."""
    for name in names:
        if hasattr(module, name):
            delattr(module, name)


def no_modules(*names: str) -> None:
    """Make `import name` raise ModuleNotFoundError, as for a module the system does not build."""
    for name in names:
        sys.modules[name] = None


def missing_methods(cls, *names: str) -> None:
    """Make `cls().name` raise AttributeError (so hasattr is False) for methods a C base class
    defines, which delattr cannot take away."""
    def absent(name):
        def get(self):
            raise AttributeError(f"{cls.__name__!r} object has no attribute {name!r} here")
        return property(get)
    for name in names:
        setattr(cls, name, absent(name))


def refuse_unix_sockets(any_unix: bool = False) -> None:
    """The macOS kernel: AF_UNIX refuses SOCK_SEQPACKET, abstract (NUL-first) addresses and paths
    over 103 bytes. `any_unix`: Windows, where Python has no AF_UNIX socket at all (a socketpair
    still works: Windows builds one from loopback TCP, and multiprocessing uses pipes there)."""
    init, bind, connect, connect_ex = (socket.socket.__init__, _socket.socket.bind,
                                       _socket.socket.connect, _socket.socket.connect_ex)

    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
        if fileno is None and family == _socket.AF_UNIX:
            if any_unix:
                raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol "
                                                  "(tests/cuts: no AF_UNIX on Windows)")
            if type != -1 and type & _KIND_MASK == _socket.SOCK_SEQPACKET:
                raise OSError(errno.EPROTONOSUPPORT, "Protocol not supported "
                                                     "(tests/cuts: no SEQPACKET on macOS)")
        init(self, family, type, proto, fileno)

    def checked(self, address):
        if self.family == _socket.AF_UNIX and isinstance(address, str | bytes):
            raw = address.encode() if isinstance(address, str) else address
            if raw[:1] == b"\0":
                raise OSError(errno.EINVAL, "Invalid argument "
                                            "(tests/cuts: abstract socket addresses are Linux's)")
            if len(raw) >= _SUN_PATH:
                raise OSError("AF_UNIX path too long")
        return address

    socket.socket.__init__ = __init__
    socket.socket.bind = lambda self, address: bind(self, checked(self, address))
    socket.socket.connect = lambda self, address: connect(self, checked(self, address))
    socket.socket.connect_ex = lambda self, address: connect_ex(self, checked(self, address))
    if any_unix:
        pair = socket.socketpair

        def socketpair(family=None, type=socket.SOCK_STREAM, proto=0):
            return pair(_socket.AF_UNIX if family is None else family, type, proto)

        socket.socketpair = socketpair
        remove(socket, "AF_UNIX")


def short_shm_names() -> None:
    """macOS refuses POSIX shared-memory names over 31 characters (ENAMETOOLONG)."""
    try:
        import _posixshmem
    except ImportError:
        return
    shm_open = _posixshmem.shm_open

    def checked(path, flags, mode=0o777):
        if len(path) > _SHM_NAME:
            raise OSError(errno.ENAMETOOLONG, f"File name too long (tests/cuts: macOS allows "
                                              f"{_SHM_NAME} characters)", path)
        return shm_open(path, flags, mode)

    _posixshmem.shm_open = checked


def no_proc() -> None:
    """No /proc: open() of a path under it finds nothing (Windows; macOS has none either, but
    Jupyter's kernels here read it, so only the Windows cut, which starts no kernel, hides it)."""
    real = io.open

    def open_(file, *args, **kwargs):
        if isinstance(file, str | bytes | os.PathLike) and os.fsdecode(file).startswith("/proc/"):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory (tests/cuts)", file)
        return real(file, *args, **kwargs)

    io.open = builtins.open = open_


def no_numba_cuda() -> None:
    """As on macOS, where numba-cuda has no build: `numba.cuda` is Numba's own retired target
    (numba-cuda installs a finder that redirects the name to itself; it goes)."""
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "NumbaCudaFinder"]
    no_modules("numba_cuda")


def chain(here: str) -> None:
    """Run the sitecustomize this one stands in front of, if the environment has one."""
    own = sys.modules.pop("sitecustomize", None)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.abspath(here)]
    try:
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as e:
        if e.name != "sitecustomize":
            raise
        if own is not None:
            sys.modules["sitecustomize"] = own
    finally:
        sys.path[:] = saved
