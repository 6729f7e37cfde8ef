"""Every library test starts from the same random state, so a test's outcome never depends on
which tests ran before it (tests that need several draws use their own seeded generators)."""

import random

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield
