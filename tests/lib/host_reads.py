"""Count the host reads a computation makes, as a CPU stand-in for GPU synchronisations.

A value read back from a tensor (``.item()``, ``bool(t)``, ``int(t)``, ``.tolist()``, ``nonzero``
and other data-dependent shapes) goes through ATen's ``_local_scalar_dense`` or ``nonzero``; on a
GPU each of these waits for the device.  :func:`host_reads` runs a function under
``torch.profiler`` with the library's checks in ``"async"`` mode (the mode every GPU call runs
in by default) and returns the reads it made, each with the chain of ops it happened in.

Two kinds of read are left out, because they happen on the CPU only:

* the CPU implementation of ``torch._assert_async`` (on a GPU the assertion runs on the device);
* reads inside the ``*_ex`` linear-algebra functions (``linalg.solve_ex``, ``inv_ex``,
  ``cholesky_ex``, ``lu_factor_ex``), which PyTorch documents as synchronising a CUDA device only
  when ``check_errors=True``; their CPU kernels read LAPACK's error codes.

Everything else counts, including the error checks of ``cholesky_solve``, ``cholesky_inverse``,
``linalg.solve``, ``linalg.inv`` and ``linalg.eigh``, which synchronise on CUDA as well: hot paths
use ``linalg.solve_triangular`` on a Cholesky factor from ``cholesky_ex`` instead.
"""

from __future__ import annotations

from torch.profiler import ProfilerActivity, profile

import attnopt

READS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::nonzero_static", "aten::masked_select",
         "aten::unique", "aten::_unique2", "aten::unique_consecutive", "aten::equal")
CPU_ONLY_READERS = ("aten::_assert_async", "aten::linalg_solve_ex", "aten::linalg_inv_ex",
                    "aten::linalg_cholesky_ex", "aten::linalg_lu_factor_ex")


def host_reads(fn, *args, **kwargs) -> list[str]:
    """The host-reading ATen ops that ``fn(*args, **kwargs)`` ran, each as ``"op < parent < ..."``.

    Empty when there is none.
    """
    with attnopt.checks("async"), profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args, **kwargs)
    found = []
    for event in prof.events():
        if event.name not in READS:
            continue
        chain, parent = [event.name], event.cpu_parent
        while parent is not None:
            chain.append(parent.name)
            parent = parent.cpu_parent
        if not any(name in CPU_ONLY_READERS for name in chain):
            found.append(" < ".join(chain[:6]))
    return found
