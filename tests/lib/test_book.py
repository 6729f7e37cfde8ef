"""Tests for the notebook helpers of attnopt.book that compare and generate tensors, against
independent computations (NumPy, and the draws of a generator written out by hand)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnopt import book

F64 = torch.float64


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=8), st.integers(0, 2**31 - 1))
def test_max_error_is_numpys_largest_absolute_difference(values, seed):
    a = np.array(values)
    b = a + np.random.default_rng(seed).normal(size=a.shape)
    assert book.max_error(torch.tensor(a), torch.tensor(b)) == np.max(np.abs(a - b))


def test_max_error_broadcasts_and_compares_in_the_wider_dtype():
    a32 = torch.tensor([[0.1, 0.2]], dtype=torch.float32)
    b64 = torch.tensor([[0.1], [0.3]], dtype=F64)
    expected = np.max(np.abs(a32.numpy().astype(np.float64) - b64.numpy()))
    assert book.max_error(a32, b64) == expected
    assert book.max_error(a32, b64) == book.max_error(b64, a32)


def test_max_error_ignores_gradients():
    x = torch.ones(3, requires_grad=True)
    assert book.max_error(2 * x, torch.full((3,), 2.5)) == 0.5


def test_random_qkv_is_three_draws_of_one_generator():
    g = torch.Generator().manual_seed(7)
    expected = [torch.randn(2, 3, 4, generator=g, dtype=F64) for _ in range(3)]
    got = book.random_qkv((2, 3, 4), seed=7, dtype=F64)
    assert all(torch.equal(x, y) for x, y in zip(got, expected))
    assert not torch.equal(got[0], got[1])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_random_qkv_gives_the_same_numbers_on_cuda():
    on_cpu = book.random_qkv((5, 6), seed=3)
    on_gpu = book.random_qkv((5, 6), seed=3, device="cuda")
    assert all(x.device.type == "cuda" and torch.equal(x.cpu(), y) for x, y in zip(on_gpu, on_cpu))
