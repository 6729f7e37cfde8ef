"""The assignments' notebooks run in this process (test_checks, test_sandbox) and set torch's default
dtype to float64, as students' notebooks do; each test gives back the dtype it found, so that no other
module (under pytest-xdist, any module can come next in the same worker) inherits it."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _keep_default_dtype():
    dtype = torch.get_default_dtype()
    yield
    torch.set_default_dtype(dtype)
