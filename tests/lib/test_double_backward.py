"""Second derivatives are correct or refused, library-wide (issue #21).

Every ``torch.autograd.Function`` subclass defined in attnopt (all its modules imported, private ones
included) has a case in ``CASES``: a small float64 computation whose autograd graph runs through it.
For each, differentiating twice either agrees with finite differences (``gradgradcheck``) or raises
a ``RuntimeError`` that says so (``once_differentiable``'s message, or one naming the second
derivative); a silently wrong second derivative fails.  A new Function without a case fails
``test_every_function_has_a_case``.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import Callable, NamedTuple

import pytest
import torch

import attnopt
from attnopt import attention as A
from attnopt import continuous as C
from attnopt import transforms as T
from attnopt import value_functions as VF

F64 = torch.float64
CORRECT, REFUSED, EITHER = "correct", "refused", "correct or refused"
# What a refusal must say: once_differentiable's "trying to differentiate twice a function that was
# marked with @once_differentiable", or a message of the library's own about second derivatives.
REFUSAL = re.compile(r"once_differentiable|differentiate twice|double backward|second derivative", re.I)


def attnopt_functions() -> dict[str, type]:
    for module in pkgutil.walk_packages(attnopt.__path__, "attnopt."):
        importlib.import_module(module.name)
    found, stack = {}, [torch.autograd.Function]
    while stack:
        for sub in stack.pop().__subclasses__():
            stack.append(sub)
            # the package's own modules only (not, say, tests/peers' attnopt_entmax_shim)
            if sub.__module__ == "attnopt" or sub.__module__.startswith("attnopt."):
                found[f"{sub.__module__}.{sub.__qualname__}"] = sub
    return found


def _rand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64) * scale


def _basis():
    centres = VF.grid_locations(3, 2, dtype=F64)
    return VF.GaussianRBF(centres, torch.full((9,), 0.05, dtype=F64))


def _spd(seed):
    A = _rand(2, 2, 2, seed=seed, scale=0.3)
    return A @ A.transpose(-1, -2) * 0.2 + 0.02 * torch.eye(2, dtype=F64)


def _triton_kernels():
    """entmax15 through the Triton kernels, or a skip where they cannot run (no Triton, no interpreter)."""
    from attnopt.transforms import _triton as K

    if not (K.available() and K.usable_on(torch.zeros(1))):
        pytest.skip("the Triton kernels need Triton and, on the CPU, TRITON_INTERPRET=1")
    return T.entmax15


class Case(NamedTuple):
    fn: Callable
    inputs: Callable[[], tuple]  # float64 leaves, made fresh for each use
    expect: str


CASES: dict[str, Case] = {
    # chapter 3: Sinkhorn (differentiable once: the unrolled reverse pass is written by hand, the
    # implicit one solves at the saved plan)
    "attnopt.transforms._sinkhorn.SinkhornUnrolledFunction": Case(
        lambda s: T.sinkhorn_attention(s, 0.7, 12, tol=None), lambda: (_rand(3, 4, seed=1),), REFUSED),
    "attnopt.transforms._sinkhorn.SinkhornImplicitFunction": Case(
        lambda s: T.sinkhorn_attention(s, 0.7, 12, tol=None, grad="implicit"), lambda: (_rand(3, 4, seed=2),), REFUSED),
    # the generic one-sided solver: implicit gradient, Omega'' kept differentiable
    "attnopt.transforms._one_sided.OneSidedEOTFunction": Case(
        lambda c: T.one_sided_eot(c, 0.5, "tsallis", alpha=1.5), lambda: (_rand(2, 5, seed=3),), CORRECT),
    # softmax and the entmaxes: backward passes written in differentiable torch ops
    "attnopt.transforms._thresholds.SoftmaxFunction": Case(
        lambda s: T.softmax(s), lambda: (_rand(2, 5, seed=4),), CORRECT),
    "attnopt.transforms._thresholds.SparseEntmaxFunction": Case(
        lambda s: T.entmax15(s), lambda: (_rand(2, 6, seed=5),), CORRECT),
    "attnopt.transforms._thresholds.EntmaxBisectFunction": Case(
        lambda s: T.entmax(s, 1.7), lambda: (_rand(2, 6, seed=6),), CORRECT),
    # the fused Triton kernels (on the CPU through the interpreter; tests/lib/conftest.py): the
    # backward under create_graph=True is the differentiable torch one
    "attnopt.transforms._triton.TritonRowFunction": Case(
        lambda s: _triton_kernels()(s, method="triton"), lambda: (_rand(2, 6, seed=12),), CORRECT),
    # flash attention's kernels (through the interpreter on the CPU): first derivatives only, the
    # second refused by once_differentiable (the dense path has exact second derivatives)
    "attnopt.transforms._flash.FlashAttentionFunction": Case(
        lambda q, k, v: (_triton_kernels(), A.flash_attention(q, k, v, alpha=1.5, method="triton"))[1],
        lambda: (_rand(5, 3, seed=16), _rand(6, 3, seed=17), _rand(6, 2, seed=18)), REFUSED),
    # chapter 4: continuous softmax and sparsemax, closed-form moments with hand-written backwards
    "attnopt.continuous._softmax.ContinuousSoftmaxFn": Case(
        lambda m, S: C.continuous_softmax(m, S, _basis()), lambda: (0.5 + 0.1 * _rand(2, 2, seed=7), _spd(8)), REFUSED),
    "attnopt.continuous._sparsemax.ContinuousSparsemaxFn": Case(
        lambda m, S: C.continuous_sparsemax(m, S, _basis()), lambda: (0.5 + 0.1 * _rand(2, 2, seed=9), _spd(10)), REFUSED),
}
# Abstract bases, never applied themselves: covered through the subclasses named.
BASES = {
    "attnopt.transforms._thresholds._TsallisBackward": ("attnopt.transforms._thresholds.SparseEntmaxFunction",
                                                        "attnopt.transforms._thresholds.EntmaxBisectFunction"),
}
# The refusal itself (attnopt._numerics.differentiable_once): its backward always raises.
REFUSALS = {"attnopt._numerics._SecondDerivativeRefused"}
# Functions known to give a silently wrong second derivative (none now: entmax15's and
# alpha-entmax's NaN second derivatives of issue #21 are fixed); an entry here is an xfail.
KNOWN_WRONG: set[str] = set()
# The sparsemax path of SparseEntmaxFunction (power 1) as well as entmax15's (power 2).
EXTRA = {"sparsemax": Case(lambda s: T.sparsemax(s), lambda: (_rand(2, 6, seed=11),), CORRECT),
         # the Triton kernels' other modes: sparsemax, softmax at a temperature (alpha-entmax: its
         # gradgradcheck through the interpreter takes minutes; the backward is the same code)
         "triton sparsemax": Case(lambda s: (_triton_kernels(), T.sparsemax(s, method="triton"))[1],
                                  lambda: (_rand(2, 6, seed=13),), CORRECT),
         "triton softmax tau=0.5": Case(lambda s: (_triton_kernels(), T.softmax(s, 0.5, method="triton"))[1],
                                        lambda: (_rand(2, 6, seed=15),), CORRECT)}


def test_every_function_has_a_case():
    found = attnopt_functions()
    assert found, "no autograd.Function found in attnopt: the walk is broken"
    missing = sorted(set(found) - set(CASES) - set(BASES) - REFUSALS)
    assert not missing, f"autograd Functions without a double-backward case in CASES: {missing}"
    stale = sorted((set(CASES) | set(BASES) | REFUSALS) - set(found))
    assert not stale, f"cases for Functions that no longer exist: {stale}"
    for base, subs in BASES.items():
        assert all(issubclass(found[sub], found[base]) for sub in subs), base


def _graph_nodes(t: torch.Tensor) -> set[str]:
    names, stack, seen = set(), [t.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(n for n, _ in node.next_functions)
    return names


def _outputs(case, xs):
    out = case.fn(*xs)
    return out if isinstance(out, torch.Tensor) else out[0]


def test_the_refusal_raises_with_its_message():
    from attnopt._numerics import _SecondDerivativeRefused

    x = torch.ones(3, dtype=F64, requires_grad=True)
    (y,) = _SecondDerivativeRefused.apply("no second derivative here", 1, x * 2, x)
    torch.testing.assert_close(y, x.detach() * 2)
    with pytest.raises(RuntimeError, match="no second derivative here"):
        y.sum().backward()


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    reason="known silently wrong second derivative", strict=True)) if n in KNOWN_WRONG else n
    for n in sorted(CASES) + sorted(EXTRA)])
def test_second_derivative_is_correct_or_refused(name):
    case = CASES.get(name) or EXTRA[name]
    xs = [x.detach().requires_grad_(True) for x in case.inputs()]
    out = _outputs(case, xs)
    if name in CASES:  # the case does run through its Function
        assert name.rsplit(".", 1)[1] + "Backward" in _graph_nodes(out), f"{name} is not in the case's graph"
    # Two losses: one whose gradient with respect to the output depends on the input, as in
    # training, and one linear in the output with a second path from the input to the loss (where a
    # refusal that is linked to nothing would silently drop the Function's part).
    for loss in (lambda o, z: (o * o * _rand(*o.shape, seed=99)).sum(),
                 lambda o, z: (o * _rand(*o.shape, seed=97)).sum() + sum((x**3).sum() for x in z)):
        xs = [x.detach().requires_grad_(True) for x in case.inputs()]
        grads = torch.autograd.grad(loss(_outputs(case, xs), xs), xs, create_graph=True)
        try:
            second = torch.autograd.grad(sum((g * _rand(*g.shape, seed=98)).sum() for g in grads), xs,
                                         allow_unused=True)
        except RuntimeError as err:
            assert case.expect in (REFUSED, EITHER), f"{name}: expected a correct second derivative, got {err}"
            assert REFUSAL.search(str(err)), f"{name}: a refusal that does not say why: {err}"
            continue
        assert case.expect in (CORRECT, EITHER), f"{name}: second derivative computed, expected a refusal"
        assert all(s is None or torch.isfinite(s).all() for s in second)
        fresh = [x.detach().requires_grad_(True) for x in case.inputs()]
        ok = torch.autograd.gradgradcheck(lambda *z: _outputs(case, z), fresh, raise_exception=False, atol=1e-6,
                                          rtol=1e-4)
        assert ok, f"{name}: a second derivative that disagrees with finite differences (silently wrong)"
