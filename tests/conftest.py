"""Shared fixtures: fresh random inputs seeded per test, Triton under the CPU interpreter, GPU skips."""

import contextlib
import importlib.util
import os
import random
import tempfile
import zlib

import pytest
import torch

# Without a GPU, Triton kernels run in the CPU interpreter. The variable must be set before triton is imported
# (its own library functions such as tl.sum are built then), before the kernel ops are registered
# (fullgraph.kernels._library picks the registration from it) and before any kernel is built.
if importlib.util.find_spec("triton") is not None and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fullgraph import env  # after the variable is set

# A new base seed each session, so every run draws fresh inputs; FULLGRAPH_TEST_SEED replays a failure. Set in the
# environment here, so pytest-xdist's workers (started later, from this process) draw from the same seed.
BASE_SEED = int(os.environ.get("FULLGRAPH_TEST_SEED", random.SystemRandom().randrange(2**31)))
os.environ["FULLGRAPH_TEST_SEED"] = str(BASE_SEED)


def pytest_report_header(config):
    cap = env.cuda_capability()
    gpu = f"{torch.cuda.get_device_name(0)} (sm_{cap[0]}{cap[1]})" if cap else "none"
    return [
        f"fullgraph: torch {torch.__version__}, triton {env.triton_version()}, gpu {gpu}",
        f"fullgraph: FULLGRAPH_TEST_SEED={BASE_SEED} (set it to replay this run's inputs)",
    ]


def pytest_collection_modifyitems(config, items):
    if env.has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist (`-n auto`), a test marked `exclusive` (it times something against a bound) runs while no
    other worker runs a test, so the other workers' load does not move its figures; every other test runs beside
    the others as usual. Two POSIX file locks shared by the run's workers: every test holds `run` shared, an
    exclusive test holds it alone; an exclusive test first takes `next`, which other tests pass through before
    they start, so new tests wait behind it instead of keeping it out for good."""
    with _turn("exclusive" in item.keywords):
        yield


_LOCKS: dict[str, int] = {}


@contextlib.contextmanager
def _turn(exclusive: bool):
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    try:
        import fcntl
    except ImportError:  # not POSIX: no locks, the exclusive tests take their chances
        fcntl = None
    if run_id is None or fcntl is None:
        yield
        return
    for name in ("next", "run"):
        if name not in _LOCKS:
            _LOCKS[name] = os.open(_lock_path(run_id, name), os.O_RDWR | os.O_CREAT, 0o600)
    nxt, run = _LOCKS["next"], _LOCKS["run"]
    if exclusive:
        fcntl.flock(nxt, fcntl.LOCK_EX)
        fcntl.flock(run, fcntl.LOCK_EX)
    else:
        fcntl.flock(nxt, fcntl.LOCK_SH)  # waits while an exclusive test waits or runs
        fcntl.flock(nxt, fcntl.LOCK_UN)
        fcntl.flock(run, fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(run, fcntl.LOCK_UN)
        if exclusive:
            fcntl.flock(nxt, fcntl.LOCK_UN)


def pytest_sessionfinish(session):
    """A worker done with its tests closes the lock files and removes them (a worker still running keeps its own
    descriptors, and with them the locks; one with no test left has nothing to share them with)."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    for name, fd in list(_LOCKS.items()):
        os.close(fd)
        with contextlib.suppress(OSError):
            os.remove(_lock_path(run_id, name))
    _LOCKS.clear()


def _lock_path(run_id: str, name: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"fullgraph-pytest-{run_id}-{name}.lock")


@pytest.fixture(autouse=True)
def seed(request) -> int:
    """Seed torch and random from the session seed and the test's id: fresh per test, reproducible per run."""
    s = (BASE_SEED + zlib.crc32(request.node.nodeid.encode())) % 2**31
    torch.manual_seed(s)
    random.seed(s)
    return s


@pytest.fixture
def triton_device():
    """The device Triton kernels run on here: "cuda" with a GPU, else "cpu" under TRITON_INTERPRET=1 (set
    above for the whole session, since the kernel ops are registered for one mode per process)."""
    if not env.has_triton():
        pytest.skip("needs triton (pip install 'fullgraph[triton]')")
    if env.has_cuda():
        return "cuda"
    if not env.triton_interpret():
        pytest.skip("kernel ops were registered without TRITON_INTERPRET=1; set it before importing fullgraph")
    return "cpu"
