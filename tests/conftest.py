"""Shared fixtures: clusters are expensive to start, so each world size is started once per session."""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import shutil
import signal
import tempfile

import numpy as np
import pytest

# Checkers record progress; tests and the lessons' nbval kernels (which inherit this environment) must never
# write to the home directory (a fresh folder per run, inside $ALLREDUCE_EDU_DATA_DIR when .ci/run sets it).
_outer = os.environ.get("ALLREDUCE_EDU_DATA_DIR")
if _outer:
    os.makedirs(_outer, exist_ok=True)
_data = tempfile.mkdtemp(prefix="allreduce-edu-test-data-", dir=_outer or None)
os.environ["ALLREDUCE_EDU_DATA_DIR"] = _data
atexit.register(shutil.rmtree, _data, ignore_errors=True)  # and a run leaves no folder behind

import allreduce_edu as ae  # noqa: E402 - after the data folder is set
from allreduce_edu.comm.transports.shm import backend as shm_backends  # noqa: E402
from allreduce_edu.comm.transports.shm import linux as shm_linux  # noqa: E402
from allreduce_edu.comm.transports.shm import portable as shm_portable  # noqa: E402
from allreduce_edu.runtime import limits, osfacts  # noqa: E402

_clusters: dict[tuple, ae.Cluster] = {}


def pytest_configure(config):
    """Ctrl-C reaches the tests as it reaches a terminal or a Jupyter kernel. A shell that starts a
    command in the background without job control (`cmd &` in a script, nohup) hands it SIGINT
    ignored, and Python leaves it ignored: the tests of interrupted runs would wait out their
    timeouts. Python's own handler, then; the processes the tests start get the default back (exec
    resets a caught signal). A hook, not module code: rank processes import this module to unpickle
    its helpers, on a worker thread, and a rank ignores SIGINT on purpose."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def backend_env(backend: str | None):
    """The shared-memory backend (linux, portable) for ranks started inside; None: as it is."""
    saved = os.environ.get(shm_backends.ENV)
    if backend is not None:
        os.environ[shm_backends.ENV] = backend
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(shm_backends.ENV, None)
        else:
            os.environ[shm_backends.ENV] = saved


def cluster_for(transport: str, world_size: int, timeout: float = 30.0, backend: str | None = None) -> ae.Cluster:
    """A running cluster of this size, shared by every test that asks for one (restarted if broken);
    `backend` picks the shared-memory backend its ranks use (None: this process's choice)."""
    key = (transport, world_size, backend)
    cluster = _clusters.get(key)
    if cluster is None or cluster.closed:
        with backend_env(backend):
            cluster = _clusters[key] = ae.Cluster(world_size, transport=transport, timeout=timeout)
    elif "dead" in repr(cluster):
        with backend_env(backend):
            cluster.restart()
    return cluster


@pytest.fixture(params=["linux", "portable"])
def shm_backend(request) -> str:
    """Each shared-memory backend that this system has (the portable one everywhere)."""
    if request.param == "linux" and not shm_linux.available():
        pytest.skip("the linux shm backend needs memfd, seals, SO_PEERCRED and SOCK_SEQPACKET: Linux only")
    with backend_env(request.param):
        yield request.param


def close_clusters() -> None:
    """Close every shared cluster (the next cluster_for starts a new one)."""
    while _clusters:
        _clusters.popitem()[1].close()


@pytest.fixture(scope="session", autouse=True)
def _close_clusters():
    yield
    close_clusters()


@pytest.fixture(autouse=True)
def _rank_limit_stays_the_tests():
    """`allreduce-edu ... --max-ranks N` sets ALLREDUCE_EDU_MAX_RANKS for the ranks it starts; a
    test that drives the command line must not leave that limit to the tests after it (in another
    order, they were refused their worlds)."""
    before = os.environ.get(limits.ENV)
    yield
    if before is None:
        os.environ.pop(limits.ENV, None)
    else:
        os.environ[limits.ENV] = before


@pytest.fixture(params=["local", pytest.param("grpc", marks=pytest.mark.processes),
                        pytest.param("shm", marks=pytest.mark.processes)])
def transport(request) -> str:
    return request.param


@pytest.fixture
def no_leftover_processes():
    """Fail a test that leaves rank processes behind."""
    before = set(multiprocessing.active_children())
    yield
    leftover = [p for p in multiprocessing.active_children() if p not in before and p.name.startswith("allreduce-edu")]
    assert not leftover, f"rank processes left running: {leftover}"


def _readable(path: str) -> bool:
    try:
        with open(path, "rb"):
            return True
    except OSError:
        return False


#: whether /proc tells about processes (Linux; not macOS or Windows, nor the Windows cut)
HAS_PROC = _readable("/proc/self/maps")
needs_proc = pytest.mark.skipif(not HAS_PROC, reason="reads /proc: Linux only")
needs_killpg = pytest.mark.skipif(not hasattr(os, "killpg"), reason="signals a process group (os.killpg): POSIX only")

#: how a rank ended by osfacts.HARD_KILL (die_now) is reported, as regular expressions: by its
#: signal, SIGKILL, on POSIX; Windows has none (os.kill with SIGTERM is TerminateProcess, exit code
#: 15), and under the Windows cut the kernel reports SIGTERM (-15)
KILLED = "killed by SIGKILL" if hasattr(signal, "SIGKILL") else "(killed by SIGTERM|exit code 15)"
KILLED_CODE = "-9" if hasattr(signal, "SIGKILL") else "-?15"


#: tests/cuts/<system>: a sitecustomize that takes away what that system's Python lacks
CUTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuts")


def cut_env(system: str) -> dict:
    """This process's environment with the cut for `system` ("macos", "windows") first on
    PYTHONPATH: every Python started with it, and every process that one starts, lacks what
    `system` lacks."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(CUTS, system), *filter(None, [os.environ.get("PYTHONPATH")])]))


def running(pid: int) -> bool:
    """Whether a process with this id exists (POSIX: a zombie, ended but not yet reaped, does)."""
    if os.name == "nt":  # there os.kill would end it: ask a handle to the process instead
        return osfacts.parent_watch(pid)()
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def interrupt_me() -> None:
    """Ctrl-C for this process, as a terminal sends it (POSIX: SIGINT to this process; on Windows
    os.kill would end it with TerminateProcess, so the signal is raised inside)."""
    if os.name == "nt":
        signal.raise_signal(signal.SIGINT)
    else:
        os.kill(os.getpid(), signal.SIGINT)


def shm_objects() -> int:
    """Shared memory this user holds anywhere: /dev/shm entries, plus our mappings (memfds, and the
    portable backend's files, named or already unlinked). Without /proc (macOS, Windows) mappings
    cannot be seen: only the portable backend's files that still have a name are counted."""
    if not HAS_PROC:
        return sum(n.startswith(shm_portable.PREFIX) for n in os.listdir(shm_portable.scratch_base()))
    count = len(os.listdir("/dev/shm"))
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                count += sum("allreduce-edu" in line for line in f)
        except OSError:
            pass  # gone, or not ours
    return count


# --- the canonical all-reduce check (tests/collectives, tests/comm) --------------------------
DTYPES = ["float32", "float64", "int32", "int64"]
REFERENCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


def contribution(rank: int, shape, dtype, seed: int = 0) -> np.ndarray:
    """Rank r's input: small values (so int products do not overflow), different on every rank."""
    rng = np.random.default_rng([seed, rank])
    if np.dtype(dtype).kind == "f":
        return rng.uniform(-2, 2, size=shape).astype(dtype)
    return rng.integers(-3, 4, size=shape).astype(dtype)


def _allreduce_on_rank(comm, algorithm, op, shape, dtype, seed, strided):
    x = contribution(comm.rank, shape, dtype, seed)
    if strided:  # a non-contiguous view of a bigger array
        x = np.repeat(x[..., None], 2, axis=-1)[..., 0]
    before = x.copy()
    y = ae.allreduce(comm, x, op=op, algorithm=algorithm)
    assert np.array_equal(x, before, equal_nan=True), "the caller's input was modified"
    return y


def check_allreduce(cluster, algorithm, op, shape, dtype, seed=0, strided=False):
    results = cluster.run(_allreduce_on_rank, algorithm, op, shape, dtype, seed, strided)
    stacked = np.stack([contribution(r, shape, dtype, seed) for r in range(cluster.world_size)])
    expected = REFERENCE[op](stacked.astype(np.float64) if stacked.dtype.kind == "f" else stacked, axis=0)
    for rank, y in enumerate(results):
        assert y.shape == tuple(shape) and y.dtype == np.dtype(dtype), f"rank {rank}: {y.shape} {y.dtype}"
        assert y.tobytes() == results[0].tobytes(), f"rank {rank} differs from rank 0"
    if np.dtype(dtype).kind == "f":
        np.testing.assert_allclose(results[0], expected, rtol=1e-4 if dtype == "float32" else 1e-10, atol=1e-5)
    else:
        np.testing.assert_array_equal(results[0], expected.astype(dtype))
