"""Input validation shared by every module: the one place where ``attnopt`` decides what is valid.

Every helper raises :class:`TypeError` (wrong kind of object or dtype) or :class:`ValueError`
(right kind, wrong value, shape or device) with a message that names the user's argument and says
what was expected, so that a reader who passes the wrong thing learns what to pass instead.

Two kinds of check, and why they differ
---------------------------------------
*Metadata checks* (types, dtypes, shapes, devices, Python numbers) cost nothing and always run.

*Data checks* (NaN, ``+inf``, negative weights, positive definiteness) must look at the values.
On the CPU reading a value is free; on a GPU it is a host synchronisation that stalls the
pipeline, and a hot path that synchronises on every call can be several times slower than one
that does not.  So data checks go through :func:`require`, whose behaviour is set by
:func:`set_checks` (or the context manager :func:`checks`):

``"auto"`` (default)
    ``"eager"`` for CPU tensors, ``"async"`` for every other device.
``"eager"``
    Read the condition back and raise ``ValueError`` at the call.  Use it on a GPU while
    debugging, to learn at once which argument was bad.
``"async"``
    No host read: the condition becomes a device-side assertion
    (:func:`torch._assert_async`) that fails the next synchronising call if it is false.  On a
    GPU a failed device assertion ends the CUDA context (as an out-of-range index in
    ``torch.nn.functional.embedding`` does); on the CPU it raises ``RuntimeError`` at once.
``"off"``
    Skip data checks entirely (metadata checks still run).

Solvers that would read the host for *speed* (retiring converged rows, stopping early) ask
:func:`host_reads_allowed` first, so that under ``"async"`` and on a GPU they take their
read-free branch.  ``"off"`` only skips checks: on the CPU, where a read is free, solvers keep
their reading branch (the read-free one can be many times slower there).
"""

from __future__ import annotations

import contextlib
import math
import numbers
from typing import Iterator, Sequence

import torch

__all__ = [
    "CHECK_MODES",
    "all_finite",
    "as_float_tensor",
    "broadcast_shapes",
    "check_bool",
    "check_bool_mask",
    "check_choice",
    "check_device",
    "check_dim",
    "check_finite",
    "check_float_dtype",
    "check_int",
    "check_no_overflow",
    "check_nonnegative",
    "check_number",
    "check_positive",
    "check_probability_vector",
    "check_psd",
    "check_same_device",
    "check_same_dtype",
    "check_shape_match",
    "check_spd",
    "checks",
    "get_checks",
    "host_reads_allowed",
    "require",
    "set_checks",
]

#: The modes of :func:`set_checks`.
CHECK_MODES = ("auto", "eager", "async", "off")
_mode = "auto"


# --------------------------------------------------------------------------------------------
# The data-check switch
# --------------------------------------------------------------------------------------------


def set_checks(mode: str) -> str:
    """Set how data checks run (``"auto"``, ``"eager"``, ``"async"`` or ``"off"``); return the old mode.

    ``"auto"`` reads values back on the CPU (where it is free) and uses asynchronous device
    assertions elsewhere, so no hot path synchronises a GPU; see :func:`checks` for a scoped
    version.

    Args:
        mode: one of ``"auto"``, ``"eager"``, ``"async"``, ``"off"``.

    Returns:
        The previous mode.

    Raises:
        ValueError: for an unknown mode.

    Examples:
        >>> import attnopt
        >>> old = attnopt.set_checks("eager")  # ValueError at the call
        >>> attnopt.set_checks(old)
        'eager'
    """
    global _mode
    check_choice(mode, "mode", CHECK_MODES)
    old, _mode = _mode, mode
    return old


def get_checks() -> str:
    """The current mode of data checks (see :func:`set_checks`).

    Examples:
        >>> import attnopt
        >>> with attnopt.checks("eager"):
        ...     attnopt.get_checks()
        'eager'
    """
    return _mode


@contextlib.contextmanager
def checks(mode: str) -> Iterator[None]:
    """Context manager: run the block with data checks in ``mode``, then restore the old mode.

    Examples:
        >>> import torch, attnopt
        >>> with attnopt.checks("off"):  # no check reads the data in the block
        ...     p = attnopt.attention_weights(torch.zeros(2, 3))
    """
    old = set_checks(mode)
    try:
        yield
    finally:
        set_checks(old)


def host_reads_allowed(*tensors: torch.Tensor) -> bool:
    """True when a check or solver may read tensor values back to the host.

    That is in mode ``"eager"``, and in modes ``"auto"`` and ``"off"`` when every tensor lives on
    the CPU (in ``"off"`` no check runs, but a solver may still read for speed); never in
    ``"async"`` and never for ``meta`` tensors, which have shapes but no values.
    """
    if _mode == "async" or any(t.device.type == "meta" for t in tensors):
        return False
    return _mode == "eager" or all(t.device.type == "cpu" for t in tensors)


def require(condition: torch.Tensor, message: str, *, error: type[Exception] = ValueError) -> None:
    """Check a data-dependent condition, a 0-dim boolean tensor, according to the current mode.

    When host reads are allowed (:func:`host_reads_allowed`) a false condition raises
    ``error(message)`` at once; in mode ``"async"`` (and ``"auto"`` off the CPU) it becomes a
    device-side assertion with no host synchronisation; in mode ``"off"`` nothing is checked.
    """
    if _mode == "off" or condition.device.type == "meta":  # a meta tensor has no data to check
        return
    if host_reads_allowed(condition):
        if not bool(condition):
            raise error(message)
        return
    torch._assert_async(condition, device_message(message))


#: CUDA's device-side assertion refuses a message of 255 bytes or more (a ``RuntimeError`` at the
#: call, on CUDA only: the CPU accepts any length), so longer messages are cut to fit.
DEVICE_MESSAGE_BYTES = 254


def device_message(message: str) -> str:
    """``message`` cut to at most :data:`DEVICE_MESSAGE_BYTES` UTF-8 bytes for ``torch._assert_async``.

    The start of a message names the argument and what was expected, so the end is what goes,
    replaced by an ellipsis; a message that fits is returned unchanged.
    """
    encoded = message.encode()
    if len(encoded) <= DEVICE_MESSAGE_BYTES:
        return message
    ellipsis = " ..."
    head = encoded[: DEVICE_MESSAGE_BYTES - len(ellipsis)].decode(errors="ignore")
    return head + ellipsis


def all_finite(x: torch.Tensor) -> torch.Tensor:
    """The 0-dim condition "every entry of ``x`` is finite" for :func:`require`, in one reduction.

    ``torch.aminmax`` propagates NaN and sees both infinities in a single pass (about ten times
    faster on the CPU than ``torch.isfinite(x).all()``); an empty ``x`` is finite.  No host read.
    """
    if x.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=x.device)
    low, high = torch.aminmax(x)
    return (low > -math.inf) & (high < math.inf)


# --------------------------------------------------------------------------------------------
# Tensors: kind, dtype, device, shape
# --------------------------------------------------------------------------------------------


def as_float_tensor(x, name: str, *, min_ndim: int = 0, like: torch.Tensor | None = None) -> torch.Tensor:
    """Return ``x`` as a floating-point tensor, or raise a clear error.

    Tensors keep their device and dtype (integer tensors are refused rather than silently cast,
    since an integer score matrix is almost always a bug).  Python numbers and nested lists are
    converted, to the device and dtype of ``like`` when given.
    """
    if isinstance(x, torch.Tensor):
        t = x
    elif isinstance(x, bool):
        raise TypeError(f"{name} must be a tensor of floats; got a bool")
    elif isinstance(x, numbers.Real) or (isinstance(x, (list, tuple)) and len(x) > 0):
        kwargs = {} if like is None else {"dtype": like.dtype, "device": like.device}
        try:
            t = torch.as_tensor(x, **kwargs)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{name} must be a tensor or a nested list of numbers; got {type(x).__name__}") from err
        if not t.is_floating_point():
            t = t.to(torch.get_default_dtype() if like is None else like.dtype)
    else:
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype (float16/bfloat16/float32/float64); got {t.dtype}")
    if t.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s); got shape {tuple(t.shape)}")
    return t


def check_same_dtype(x: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    """Raise ``TypeError`` unless ``x`` and ``ref`` have one dtype."""
    if x.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {x.dtype} but {ref_name} has dtype {ref.dtype}; pass both in one dtype")


def check_same_device(x: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    """Raise ``ValueError`` unless ``x`` and ``ref`` live on one device."""
    if x.device != ref.device:
        raise ValueError(f"{name} is on {x.device} but {ref_name} is on {ref.device}; put both on one device")


def broadcast_shapes(**shapes: Sequence[int]) -> torch.Size:
    """The broadcast of named shapes, or ``ValueError`` naming them (``broadcast_shapes(mu=..., Sigma=...)``)."""
    try:
        return torch.broadcast_shapes(*(tuple(s) for s in shapes.values()))
    except RuntimeError as err:
        listed = ", ".join(f"{k} {tuple(v)}" for k, v in shapes.items())
        raise ValueError(f"the shapes of {listed} do not broadcast against each other") from err


def check_shape_match(a: torch.Tensor, a_name: str, b: torch.Tensor, b_name: str, dims: Sequence[tuple[int, int]]) -> None:
    """Check ``a.shape[i] == b.shape[j]`` for each ``(i, j)`` in ``dims``."""
    for i, j in dims:
        if a.shape[i] != b.shape[j]:
            raise ValueError(
                f"{a_name} and {b_name} do not match: {a_name}.shape[{i}]={a.shape[i]} "
                f"but {b_name}.shape[{j}]={b.shape[j]} (shapes {tuple(a.shape)} and {tuple(b.shape)})"
            )


def check_bool_mask(mask, name: str, shape: Sequence[int] | None = None, *, device: torch.device | None = None,
                    meaning: str = "True = keep") -> torch.Tensor:
    """Return ``mask`` after checking it is a boolean tensor broadcastable to ``shape``, on ``device``."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        what = type(mask).__name__ if not isinstance(mask, torch.Tensor) else f"a tensor of dtype {mask.dtype}"
        raise TypeError(f"{name} must be a boolean tensor ({meaning}); got {what}")
    if device is not None and mask.device != device:
        raise ValueError(f"{name} is on {mask.device} but must be on {device}, with the tensor it masks")
    if shape is not None:
        try:
            torch.broadcast_shapes(tuple(mask.shape), tuple(shape))
        except RuntimeError as err:
            raise ValueError(f"{name} of shape {tuple(mask.shape)} does not broadcast to shape {tuple(shape)}") from err
        if torch.broadcast_shapes(tuple(mask.shape), tuple(shape)) != torch.Size(shape):
            raise ValueError(f"{name} of shape {tuple(mask.shape)} would enlarge shape {tuple(shape)}")
    return mask


def check_dim(dim: int, ndim: int, name: str = "dim") -> int:
    """Return ``dim`` normalised to ``[0, ndim)``; ``TypeError`` if not an int, ``ValueError`` if out of range."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"{name} must be an int; got {type(dim).__name__}")
    dim = int(dim)
    if not -ndim <= dim < ndim:
        raise ValueError(f"{name}={dim} is out of range for a tensor with {ndim} dimension(s)")
    return dim % ndim


# --------------------------------------------------------------------------------------------
# Python numbers and choices
# --------------------------------------------------------------------------------------------


def check_number(value, name: str, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, finite: bool = True, hint: str = "") -> float:
    """Return ``value`` as a float after checking it is a real number in the given bounds.

    ``TypeError`` for anything that is not a real number (bools and tensors with more than one
    element included); ``ValueError`` for NaN, infinities (unless ``finite=False``) and values
    outside ``[low, high]`` (open ends with ``low_open``/``high_open``).  A one-element tensor is
    accepted and read once (a host read on a GPU: pass Python numbers in hot paths).
    """
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"{name} must be a number; got a tensor of shape {tuple(value.shape)}")
        if value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{name} must be a real number; got a tensor of dtype {value.dtype}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:  # an int beyond float range
        value = math.inf if value > 0 else -math.inf
    bounds = []
    if low is not None:
        bounds.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        bounds.append(f"{'<' if high_open else '<='} {high:g}")
    want = f"a finite number {' and '.join(bounds)}" if finite else f"a number {' and '.join(bounds)}"
    bad = math.isnan(value) or (finite and math.isinf(value))
    if low is not None:
        bad = bad or (value <= low if low_open else value < low)
    if high is not None:
        bad = bad or (value >= high if high_open else value > high)
    if bad:
        raise ValueError(f"{name} must be {want.strip()}{hint}; got {value!r}")
    return value


def check_positive(value, name: str, *, allow_zero: bool = False) -> float:
    """Return ``value`` as a float after checking it is a finite number > 0 (or >= 0)."""
    return check_number(value, name, low=0.0, low_open=not allow_zero)


def check_int(value, name: str, minimum: int | None = 1, maximum: int | None = None) -> int:
    """Return ``value`` after checking it is an int (not a bool) in ``[minimum, maximum]``.

    ``TypeError`` for a non-integer (``3.0`` included), ``ValueError`` when out of range.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int; got {type(value).__name__}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}; got {value}")
    return value


def check_choice(value, name: str, options: Sequence):
    """Return ``value`` if it is one of ``options``; ``TypeError`` if not a string, else ``ValueError``."""
    if not isinstance(value, str) and all(isinstance(o, str) for o in options):
        raise TypeError(f"{name} must be one of {tuple(options)}; got {type(value).__name__}")
    if value not in options:
        raise ValueError(f"{name} must be one of {tuple(options)}; got {value!r}")
    return value


def check_float_dtype(dtype, name: str = "dtype") -> torch.dtype:
    """``dtype`` after checking it is a floating :class:`torch.dtype` (``None``: torch's default); ``TypeError`` otherwise."""
    if dtype is None:
        return torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating torch.dtype (e.g. torch.float32); got {dtype!r}")
    return dtype


def check_bool(value, name: str) -> bool:
    """Return ``value`` after checking it is a bool (NumPy's ``bool_`` included); ``TypeError`` otherwise.

    A flag given a string or a number (``as_printed="no"``) would otherwise be silently truthy.
    """
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise TypeError(f"{name} must be True or False; got {type(value).__name__}")


def check_device(device, name: str = "device", *, auto: bool = False) -> torch.device:
    """Return ``device`` as a :class:`torch.device` that this machine has, or raise naming ``name``.

    Accepts a ``torch.device`` or a string (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, ...; with
    ``auto=True`` also ``"auto"``: CUDA when available, else the CPU).  ``TypeError`` for anything
    else; ``ValueError`` for a string torch does not parse, and for an accelerator that is not
    available here (or a CUDA index beyond the devices present), so that the mistake shows at the
    call rather than at the first tensor moved there.
    """
    accepted = ("'auto', " if auto else "") + "'cpu', 'cuda', 'cuda:N', 'mps' or a torch.device"
    if isinstance(device, torch.device):
        dev = device
    elif isinstance(device, str):
        if auto and device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            dev = torch.device(device)
        except RuntimeError as err:
            raise ValueError(f"{name} must be one of {accepted}; got {device!r}") from err
    else:
        raise TypeError(f"{name} must be one of {accepted}; got {type(device).__name__}")
    if dev.type in ("cpu", "meta"):
        return dev
    if dev.type == "mps":
        available, count = torch.backends.mps.is_available(), 1
    else:
        backend = getattr(torch, dev.type, None)
        available = bool(getattr(backend, "is_available", lambda: False)())
        count = getattr(backend, "device_count", lambda: 1)() if available else 0
    if not available:
        raise ValueError(f"{name}={device!r} was asked for but {dev.type} is not available on this machine; "
                         f"use {'auto' if auto else 'cpu'!r}")
    if dev.index is not None and dev.index >= count:
        raise ValueError(f"{name}={device!r} was asked for but this machine has {count} {dev.type} device(s)")
    return dev


# --------------------------------------------------------------------------------------------
# Data checks (through `require`: no host read off the CPU unless asked for)
# --------------------------------------------------------------------------------------------


def check_finite(x: torch.Tensor, name: str, *, allow_neg_inf: bool = False) -> None:
    """Raise ``ValueError`` if ``x`` holds NaN or ±inf (``-inf`` allowed when asked), per :func:`require`."""
    if not x.is_floating_point() or x.numel() == 0 or _mode == "off":
        return
    if not host_reads_allowed(x):
        # One reduction, no read: the maximum is NaN or +inf exactly when a NaN or +inf is present.
        ok = x.amax() < math.inf if allow_neg_inf else all_finite(x)
        what = "NaN or +inf" if allow_neg_inf else "NaN or infinite values"
        require(ok, f"{name} contains {what}")
        return
    # Fast path, one pass and one read: NaN and ±inf propagate through a sum (inf - inf = NaN), so a
    # finite sum proves every entry finite.  A failed fast check (or an overflowing sum) gets the
    # exact checks and their message.
    if bool(x.amax() < math.inf) if allow_neg_inf else bool(torch.isfinite(x.sum())):
        return
    if torch.isnan(x).any():
        raise ValueError(f"{name} contains NaN")
    bad = torch.isposinf(x) if allow_neg_inf else torch.isinf(x)
    if bad.any():
        what = "+inf" if allow_neg_inf else "infinite values"
        raise ValueError(f"{name} contains {what}")


def check_no_overflow(result: torch.Tensor, what: str, culprits: str) -> None:
    """Require a result computed from finite inputs to be finite (per :func:`require`).

    An infinite entry then means the true value lies beyond the dtype's range; the ``ValueError``
    says so and names the arguments to shrink (``what``: the quantity, e.g. "the scores
    alpha * <z, t_i>"; ``culprits``: e.g. "z, templates or alpha").
    """
    fix = "smaller" if result.dtype == torch.float64 else "float64 tensors or smaller"
    require(
        all_finite(result),
        f"{what} overflow {result.dtype} (largest finite value {torch.finfo(result.dtype).max:.3g}): "
        f"{culprits} are too large for this dtype; pass {fix} {culprits}",
    )


def check_nonnegative(x: torch.Tensor, name: str, *, what: str = "") -> None:
    """Raise ``ValueError`` if ``x`` holds a negative entry or NaN (per :func:`require`)."""
    if x.numel() == 0:
        return
    # NaN >= 0 is False, so one reduction catches both.
    require((x >= 0).all(), f"{name} must be non-negative{what}; found a negative entry or NaN")


def check_probability_vector(p: torch.Tensor, name: str, *, dim: int = -1, atol: float | None = None) -> None:
    """Check that ``p`` is non-negative and sums to one along ``dim`` (per :func:`require`)."""
    check_nonnegative(p, name)
    if atol is None:
        atol = 1e-3 if p.dtype in (torch.float16, torch.bfloat16) else (1e-5 if p.dtype == torch.float32 else 1e-10)
    if p.numel() == 0 or _mode == "off":
        return
    off = (p.sum(dim=dim) - 1).abs()
    if host_reads_allowed(p):
        if not bool((off <= atol).all()):
            raise ValueError(f"{name} must sum to 1 along dim {dim}; off by up to {off.max().item():.3g}")
        return
    require((off <= atol).all(), f"{name} must sum to 1 along dim {dim} (within {atol:g})")


def _symmetric_work(S: torch.Tensor, name: str) -> torch.Tensor | None:
    """Shape, finiteness and symmetry checks shared by :func:`check_spd` and :func:`check_psd`.

    Returns ``S`` in at least float32 (half precision has no Cholesky), or None when there is
    nothing more to check.  Symmetry is relative: ``|S - S^T| <= sqrt(eps) max|S|``.
    """
    if S.ndim < 2 or S.shape[-1] != S.shape[-2]:
        raise ValueError(f"{name} must have shape (..., D, D) with square trailing dimensions; got {tuple(S.shape)}")
    check_finite(S, name)
    if S.numel() == 0 or _mode == "off":
        return None
    work = S.to(torch.float32) if S.dtype in (torch.float16, torch.bfloat16) else S
    scale = work.abs().amax().clamp_min(torch.finfo(work.dtype).tiny)
    tol = math.sqrt(torch.finfo(work.dtype).eps)
    asym = (work - work.transpose(-1, -2)).abs().amax()
    if host_reads_allowed(S):
        if bool(asym > tol * scale):
            raise ValueError(
                f"{name} must be symmetric; max |{name} - {name}^T| = {asym.item():.3g} "
                f"(relative {(asym / scale).item():.3g} > {tol:.1g})"
            )
    else:
        require(asym <= tol * scale, f"{name} must be symmetric (relative asymmetry above {tol:.1g})")
    return 0.5 * (work + work.transpose(-1, -2))


def check_spd(S: torch.Tensor, name: str) -> None:
    """Check ``S`` has shape ``(..., D, D)`` (always) and holds finite symmetric positive-definite matrices.

    Positive definiteness is a Cholesky factorization in at least float32.
    """
    work = _symmetric_work(S, name)
    if work is None:
        return
    _, info = torch.linalg.cholesky_ex(work)
    require((info == 0).all(), f"{name} must be positive definite; at least one matrix is not (Cholesky failed)")


def check_psd(S: torch.Tensor, name: str) -> None:
    """Check ``S`` has shape ``(..., D, D)`` (always) and holds finite symmetric positive *semi*-definite matrices.

    Semi-definiteness up to the symmetry tolerance, per matrix: a Cholesky factorization of
    ``S + sqrt(eps) max|S| I`` succeeds, so ``S = 0`` and a rank-deficient covariance whose zero
    eigenvalues round-off made slightly negative pass, and an eigenvalue below ``-sqrt(eps) max|S|``
    fails.
    """
    work = _symmetric_work(S, name)
    if work is None:
        return
    tol = math.sqrt(torch.finfo(work.dtype).eps)
    eye = torch.eye(S.shape[-1], dtype=work.dtype, device=work.device)
    per_matrix = work.abs().amax((-2, -1), keepdim=True).clamp_min(torch.finfo(work.dtype).tiny)
    _, info = torch.linalg.cholesky_ex(work + (tol * per_matrix) * eye)
    require((info == 0).all(), f"{name} must be positive semi-definite; at least one matrix has a negative eigenvalue")
