"""attnopt.attention.flash_attention: the Triton kernels against the dense path, forward and backward.

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set here before the
kernels are decorated) on small shapes with 16 x 16 tiles, so that every row spans several key
blocks and every code path (skipping, causal ends, padding, partial blocks) is exercised.  On CUDA
the same tests run the compiled kernels with the default tiles; ``ATTNOPT_FULL_SIZE=1`` makes the
shapes larger (sequence lengths in the hundreds, d = 64).
"""

import importlib
import os
import sys

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    # The interpreter must be on before Triton is imported: triton.jit decorates Triton's own
    # helpers (tl.zeros, ...) at import, and the kernels here when they are imported.
    _TRITON_ALREADY_IMPORTED = "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
    os.environ["TRITON_INTERPRET"] = "1"

triton = pytest.importorskip("triton")

if not CUDA and _TRITON_ALREADY_IMPORTED:
    raise RuntimeError("Triton was imported before TRITON_INTERPRET=1 was set: run the CPU tests with "
                       "TRITON_INTERPRET=1 in the environment (make test does)")

import attnopt  # noqa: E402
from attnopt import transforms  # noqa: E402
from attnopt.attention import _flash_attention, attention_weights, flash_attention  # noqa: E402

from attnopt.transforms import _flash as flash  # noqa: E402

if not CUDA and not isinstance(flash._max_kernel, triton.runtime.interpreter.InterpretedFunction):
    # Imported before this module set the variable: decorate the kernels again, interpreted.
    flash = importlib.reload(flash)

pytestmark = pytest.mark.usefixtures("one_thread")

DEVICE = "cuda" if CUDA else "cpu"
FULL = os.environ.get("ATTNOPT_FULL_SIZE", "0") == "1"
# Tiles: small in the interpreter (several blocks per row), the kernels' defaults on the GPU.
BLOCKS = {} if CUDA else {"block_m": 16, "block_n": 16}
N_Q, N_K, D, DV = (300, 333, 64, 48) if FULL else (20, 37, 8, 5)
ALPHAS = [1.0, 1.5, 2.0, 1.25, 3.0]
TOL = {torch.float64: (1e-11, 1e-9), torch.float32: (2e-6, 5e-5)}  # (output, gradients), absolute


def qkv(lead=(2,), n_q=N_Q, n_k=N_K, d=D, dv=DV, dtype=torch.float64, seed=0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, n_q, d, generator=g, dtype=torch.float64) * spread
    k = torch.randn(*lead, n_k, d, generator=g, dtype=torch.float64)
    v = torch.randn(*lead, n_k, dv, generator=g, dtype=torch.float64)
    return [x.to(device=DEVICE, dtype=dtype).requires_grad_() for x in (q, k, v)]


def dense(q, k, v, alpha, **kw):
    """The reference: the scores, the library's transform, then @ v (no flash code involved)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    mask = None
    if kw.get("causal"):
        mask = torch.arange(n_k, device=q.device)[None, :] <= torch.arange(n_q, device=q.device)[:, None] + n_k - n_q
    if kw.get("key_padding_mask") is not None:
        keep = kw["key_padding_mask"][..., None, :]
        mask = keep if mask is None else mask & keep
    s = attnopt.attention_scores(q, k, mask=mask, scale=kw.get("scale"))
    if alpha == 1.0:
        p = attention_weights(s)
    elif alpha == 2.0:
        p = transforms.sparsemax(s)
    elif alpha == 1.5:
        p = transforms.entmax15(s)
    else:
        p = transforms.entmax(s, alpha)
    return p @ v


def run_triton(q, k, v, alpha, **kw):
    out, info = _flash_attention(q, k, v, alpha=alpha, method="triton", **BLOCKS, **kw)
    assert info["path"] == "triton"
    return out, info


def compare(q, k, v, alpha, dtype, check_grad=True, **kw):
    out_tol, grad_tol = TOL[dtype]
    if alpha > 2:
        # Near the edge of the support an error e in the threshold is e^(1/(alpha-1)) in the weights:
        # both paths are exact only to the square root of the dtype's epsilon at alpha = 3.
        out_tol, grad_tol = out_tol ** 0.5 * 10, grad_tol ** 0.5 * 10
    out, _ = run_triton(q, k, v, alpha, **kw)
    ref = dense(q, k, v, alpha, **kw)
    assert out.dtype == q.dtype and out.shape == ref.shape
    assert (out - ref).abs().max().item() <= out_tol
    if not check_grad:
        return
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(ref)
    grads = torch.autograd.grad((out * g).sum(), (q, k, v))
    grads_ref = torch.autograd.grad((ref * g).sum(), (q, k, v))
    for name, a, b in zip("qkv", grads, grads_ref):
        err = (a - b).abs().max().item()
        assert err <= grad_tol * max(1.0, b.abs().max().item()), (name, err)


# -------- agreement with the dense path ----------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_matches_dense_with_padding(alpha, dtype):
    q, k, v = qkv(dtype=dtype)
    keep = torch.rand(2, N_K, generator=torch.Generator().manual_seed(1)) > 0.3
    compare(q, k, v, alpha, dtype, key_padding_mask=keep.to(DEVICE))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_matches_dense_causal(alpha, dtype):
    # n_q < n_k: queries aligned with the last keys, the diagonal crosses tiles off their corners.
    q, k, v = qkv(dtype=dtype, seed=2)
    compare(q, k, v, alpha, dtype, causal=True, scale=0.7)


def test_broadcast_leading_dims_and_default_scale():
    q, _, _ = qkv(lead=(2, 2), n_q=12)
    _, k, v = qkv(lead=(2,), seed=4)
    keep = torch.ones(2, 1, N_K, dtype=torch.bool, device=DEVICE)
    keep[0, 0, : N_K // 2] = False
    compare(q, k, v, 1.5, torch.float64, key_padding_mask=keep)


# -------- adversarial rows: the weights themselves, via v = identity ----------------------------


def weights_of(q, k, alpha, **kw):
    """With v the identity the output rows ARE the attention weights (only in tests: n_k columns)."""
    eye = torch.eye(k.shape[-2], dtype=k.dtype, device=k.device).expand(*k.shape[:-1], k.shape[-2])
    return run_triton(q, k, eye, alpha, **kw)[0], dense(q, k, eye, alpha, **kw)


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 1.25, 3.0])
@pytest.mark.parametrize("case", ["flat", "ties", "offset", "ramp", "tiny_noise"])
def test_adversarial_rows(case, alpha):
    n_k, d = 40, 4
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 8, d, generator=g, dtype=torch.float64)
    k = torch.randn(1, n_k, d, generator=g, dtype=torch.float64)
    if case == "flat":  # every score equal: the support is every key, tau far from both bounds
        k = torch.ones_like(k)
    elif case == "ties":  # blocks of exactly tied keys, the top tie split across two tiles
        k = torch.randn(1, 4, d, generator=g, dtype=torch.float64).repeat_interleave(10, dim=1)
    elif case == "offset":  # scores of order 1e4: the threshold carries 4 more digits than the weights
        q = q + 100.0
        k = k + 100.0
    elif case == "ramp":  # evenly spaced scores: the support edge moves by one key per Newton step
        q = torch.ones(1, 8, d, dtype=torch.float64)
        k = torch.linspace(-3, 3, n_k, dtype=torch.float64)[None, :, None].expand(1, n_k, d).clone()
    elif case == "tiny_noise":  # a flat row plus noise at 1e-9: many keys on the edge of the support
        k = torch.ones_like(k) + 1e-9 * k
    q, k = q.to(DEVICE), k.to(DEVICE)
    p, ref = weights_of(q, k, alpha)
    err = (p - ref).abs().max().item()
    assert err <= (1e-6 if alpha > 2 else 1e-12), err
    assert (p.sum(-1) - 1).abs().max().item() <= 1e-12
    assert p.min().item() >= 0
    if alpha > 1:  # exact zeros outside the support, the same support as the dense path
        assert torch.equal(p == 0, ref == 0) or err <= 1e-12


def test_float32_rows_sum_to_one():
    q, k, _ = qkv(dtype=torch.float32, n_q=12, n_k=40, d=4, spread=3.0)
    for alpha in (1.5, 2.0):
        p, ref = weights_of(q.detach(), k.detach(), alpha)
        assert (p.sum(-1) - 1).abs().max().item() <= 1e-6
        assert (p - ref).abs().max().item() <= 1e-6


# -------- dead rows ------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 3.0])
def test_fully_masked_rows_give_zeros_like_the_dense_path(alpha):
    q, k, v = qkv(n_q=20, n_k=12)
    keep = torch.ones(2, 12, dtype=torch.bool, device=DEVICE)
    keep[1] = False  # the second batch entry may attend to nothing
    # causal with n_q > n_k: the first 8 queries come before the first key, dead as well
    out, _ = run_triton(q, k, v, alpha, causal=True, key_padding_mask=keep)
    ref = dense(q, k, v, alpha, causal=True, key_padding_mask=keep)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(out[0, :8], torch.zeros_like(out[0, :8]))
    assert (out - ref).abs().max().item() <= 1e-11
    gq, gk, gv = torch.autograd.grad(out.sum(), (q, k, v))
    rq, rk, rv = torch.autograd.grad(ref.sum(), (q, k, v))
    assert torch.isfinite(gq).all() and torch.isfinite(gk).all() and torch.isfinite(gv).all()
    assert torch.equal(gq[1], torch.zeros_like(gq[1])) and torch.equal(gk[1], torch.zeros_like(gk[1]))
    for a, b in ((gq, rq), (gk, rk), (gv, rv)):
        assert (a - b).abs().max().item() <= 1e-9


# -------- gradcheck ------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 1.25])
def test_gradcheck_float64(alpha):
    q, k, v = qkv(n_q=6, n_k=20, d=3, dv=2, seed=6)
    keep = torch.ones(2, 20, dtype=torch.bool, device=DEVICE)
    keep[0, 3] = False

    def fn(q, k, v):
        return run_triton(q, k, v, alpha, causal=True, key_padding_mask=keep)[0]

    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-6, fast_mode=not CUDA)


# -------- the kernel path, skipping, memory -------------------------------------------------------


def separated(n=64, d=8, winners=16, dtype=torch.float64):
    """Keys 0..winners-1 far above the rest for every query: only the first key block is in the support."""
    g = torch.Generator().manual_seed(7)
    q = torch.ones(1, n, d, dtype=dtype) + 0.1 * torch.randn(1, n, d, generator=g, dtype=dtype)
    k = -torch.ones(1, n, d, dtype=dtype) + 0.1 * torch.randn(1, n, d, generator=g, dtype=dtype)
    k[:, :winners] += 2.0
    v = torch.randn(1, n, 3, generator=g, dtype=dtype)
    return [x.to(DEVICE).requires_grad_() for x in (q, k, v)]


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_blocks_outside_the_support_are_skipped(alpha, monkeypatch):
    q, k, v = separated()
    # The dense path must not run: make it fail loudly if it were taken.
    monkeypatch.setattr(attnopt.attention, "attention_scores", lambda *a, **kw: pytest.fail("dense path taken"))
    # 16 x 16 tiles on every device, so that the 64 keys span 4 key blocks.
    out, info = _flash_attention(q, k, v, alpha=alpha, method="triton", block_m=16, block_n=16)
    assert info["path"] == "triton"
    monkeypatch.undo()
    visits = info["visits"]  # (batch, query blocks, [threshold-pass tiles, output-pass tiles, passes])
    n_kb = 64 // 16
    passes = visits[..., 2]
    assert (passes >= 1).all()
    # The output pass loads only the first key block: the other three lie below every threshold.
    assert (visits[..., 1] == 1).all(), visits
    # The threshold passes skip too: fewer tiles than passes x key blocks.
    assert (visits[..., 0] < passes * n_kb).all(), visits
    assert (out - dense(q, k, v, alpha)).abs().max().item() <= 1e-12
    # The dense weights confirm the premise: no weight outside the first block.
    s = attnopt.attention_scores(q.detach(), k.detach())
    p = transforms.sparsemax(s) if alpha == 2.0 else transforms.entmax15(s)
    assert p[..., 16:].abs().max() == 0 and p[..., :16].sum(-1).min() > 0.99


def test_no_keys_or_no_queries():
    """Empty inputs need no kernel: zeros (every query a dead row) or an empty output, with grads."""
    q, k, v = qkv(n_k=0)
    out = flash_attention(q, k, v, alpha=1.5, method="triton")
    assert out.shape == (2, N_Q, DV) and out.abs().max() == 0
    out.sum().backward()
    assert q.grad.abs().max() == 0
    q, k, v = qkv(n_q=0)
    assert flash_attention(q, k, v, alpha=2.0, method="triton").shape == (2, 0, DV)


def test_second_derivatives_are_refused_not_wrong():
    q, k, v = qkv(n_q=5, n_k=7, d=3, dv=2)
    out, _ = run_triton(q, k, v, 1.5)
    (gq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(gq.sum(), k)


def test_auto_method_and_triton_errors(monkeypatch):
    q, k, v = qkv()
    _, info = _flash_attention(q, k, v, method="auto")
    assert info["path"] == "dense"  # until the kernels pass their tests on a GPU (see flash_attention)
    if not CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="TRITON_INTERPRET"):
            flash_attention(q, k, v, method="triton")


class AllocationRecorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the size in bytes of every tensor any ATen op returns, forward and backward (bytes, not
    elements: Triton's interpreter copies arguments to the host as byte views of their storage)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


@pytest.mark.parametrize("alpha", [1.0, 1.5])
def test_no_n_by_n_tensor_forward_or_backward(alpha):
    n = 64
    q, k, v = qkv(lead=(1,), n_q=n, n_k=n, d=8, dv=8)
    with AllocationRecorder() as rec:
        out, _ = run_triton(q, k, v, alpha, causal=True)
        out.sum().backward()
    # Everything the flash path allocates is O(n d) (and the (n/16)^2 tile maxima): the largest is
    # an (n, d=8) float64 tensor, an eighth of the n x n scores.
    assert rec.largest <= 8 * n * 8 < n * n * 8, rec.largest
    # The recorder does see the dense path's n x n scores: the check above is not vacuous.
    with AllocationRecorder() as rec_dense:
        dense(q, k, v, alpha, causal=True).sum().backward()
    assert rec_dense.largest >= n * n * 8


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_accumulates_in_float32(dtype):
    q, k, v = (x.detach().to(dtype) for x in qkv(dtype=torch.float32))
    ref = dense(q.float(), k.float(), v.float(), 1.5)  # the same rounded inputs, in float32
    out, _ = run_triton(q, k, v, 1.5)
    assert out.dtype == dtype
    assert (out.float() - ref).abs().max().item() <= (2e-2 if dtype == torch.bfloat16 else 5e-3)


def test_bad_inputs():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="alpha"):
        flash_attention(q, k, v, alpha=0.5)
    with pytest.raises(ValueError, match="method"):
        flash_attention(q, k, v, method="fast")
    with pytest.raises(TypeError, match="key_padding_mask"):
        flash_attention(q, k, v, key_padding_mask=torch.ones(2, N_K))
    with pytest.raises(ValueError, match="key_padding_mask"):
        flash_attention(q, k, v, key_padding_mask=torch.ones(2, N_K + 1, dtype=torch.bool, device=DEVICE))
    with pytest.raises(TypeError, match="v"):
        flash_attention(q, k, v.float())
    with pytest.raises(ValueError, match="scale"):
        flash_attention(q, k, v, scale=-1.0)
    with pytest.raises(TypeError, match="causal"):
        flash_attention(q, k, v, causal=1)
    with pytest.raises(ValueError, match="q"):
        flash_attention(q.detach() * float("nan"), k, v)


def test_import_without_triton_does_not_load_the_kernels():
    """``import attnopt`` must not import Triton (an optional extra)."""
    import subprocess

    code = "import sys, attnopt, attnopt.attention; print('triton' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ})
    assert res.returncode == 0 and res.stdout.strip() == "False", res.stderr
