"""Shared fixtures: fresh random inputs seeded per test, Triton under the CPU interpreter, GPU skips."""

import importlib.util
import os
import random
import zlib

import pytest
import torch

# Without a GPU, Triton kernels run in the CPU interpreter. The variable must be set before triton is imported
# (its own library functions such as tl.sum are built then), before the kernel ops are registered
# (fullgraph.kernels._library picks the registration from it) and before any kernel is built.
if importlib.util.find_spec("triton") is not None and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fullgraph import env  # after the variable is set

# A new base seed each session, so every run draws fresh inputs; FULLGRAPH_TEST_SEED replays a failure.
BASE_SEED = int(os.environ.get("FULLGRAPH_TEST_SEED", random.SystemRandom().randrange(2**31)))


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
