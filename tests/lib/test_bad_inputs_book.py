"""Bad and edge inputs of the notebook helpers of attnopt.book that compare and generate tensors.

Written from the contract (the docstrings): a bad argument raises TypeError or ValueError naming it;
an edge input gives its documented result.  The other helpers of attnopt.book have their cases in
``test_bad_inputs_mixture_vqa_book.py`` and ``test_bad_inputs.py``.
"""

import math

import pytest
import torch

from attnopt import book

F64 = torch.float64
INF, NAN = float("inf"), float("nan")

BAD = [
    (lambda: book.max_error("1", torch.zeros(2)), TypeError, "actual"),
    (lambda: book.max_error(torch.zeros(2), torch.zeros(2, dtype=torch.long)), TypeError, "expected"),
    (lambda: book.max_error(torch.zeros(2), torch.zeros(3)), ValueError, "expected"),
    (lambda: book.max_error(torch.zeros(2), torch.zeros(2, device="meta")), ValueError, "expected"),
    (lambda: book.random_qkv(4), TypeError, "shape"),
    (lambda: book.random_qkv((2, -1)), ValueError, r"shape\[1\]"),
    (lambda: book.random_qkv((2, 2.0)), TypeError, r"shape\[1\]"),
    (lambda: book.random_qkv((2, 3), seed=2**70), ValueError, "seed"),
    (lambda: book.random_qkv((2, 3), seed="0"), TypeError, "seed"),
    (lambda: book.random_qkv((2, 3), dtype=torch.int64), TypeError, "dtype"),
    (lambda: book.random_qkv((2, 3), device="nonsense"), ValueError, "device"),
    (lambda: book.random_qkv((2, 3), device=0), TypeError, "device"),
]


@pytest.mark.parametrize("call, error, word", BAD, ids=[f"{i}-{w}" for i, (_, _, w) in enumerate(BAD)])
def test_bad_argument_is_named(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_max_error_edges():
    assert book.max_error(torch.zeros(0, 3), torch.zeros(3)) == 0.0  # nothing to compare
    assert book.max_error(torch.tensor([-INF, 1.0]), torch.tensor([-INF, 1.0])) == 0.0  # equal infinities
    assert book.max_error(torch.tensor([INF]), torch.tensor([-INF])) == INF
    assert math.isnan(book.max_error(torch.tensor([NAN, 0.0]), torch.zeros(2)))  # a check "< tol" fails
    assert book.max_error(1.5, torch.ones(2)) == 0.5  # numbers broadcast


def test_random_qkv_edges():
    q, k, v = book.random_qkv((0, 3))
    assert q.shape == k.shape == v.shape == (0, 3)
    assert book.random_qkv(())[0].shape == ()
