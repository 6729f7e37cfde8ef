"""Every library test starts from the same random state, so a test's outcome never depends on
which tests ran before it (tests that need several draws use their own seeded generators)."""

import os
import random

import numpy as np
import pytest
import torch

# The fused Triton kernels (attnopt.transforms._triton) run on the CPU through Triton's interpreter
# when no GPU is present.  The switch must be on before the kernels are built (at their first use),
# so it is set here, at collection, before any test runs; with CUDA the kernels compile for the GPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed_everything():
    # torch's default dtype too: the assignments' notebooks, run in-process by tests/assignments,
    # set float64, and under pytest-xdist a worker may run them before a library module
    torch.set_default_dtype(torch.float32)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny tensors: on a shared 2-core machine OpenMP threads
    only add synchronisation. Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _assert_async_as_on_cuda(monkeypatch):
    """``torch._assert_async`` on the CPU accepts any message, CUDA's refuses one of 255 bytes or
    more (a ``RuntimeError`` at the call).  Every test that runs a check in mode ``"async"`` on the
    CPU meets CUDA's rule here, so a long message cannot pass on the CPU and fail on the first GPU
    (as one did: the overflow check of ``softmatch_kernel``)."""
    real = torch._assert_async

    def as_on_cuda(condition, message=None):
        if message is not None and len(message.encode()) >= 255:
            raise RuntimeError(f"Message length must be smaller than 255 ({len(message.encode())} bytes)")
        return real(condition, message) if message is not None else real(condition)

    monkeypatch.setattr(torch, "_assert_async", as_on_cuda)
