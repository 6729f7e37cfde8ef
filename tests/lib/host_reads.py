"""Count the host reads a computation makes, as a CPU stand-in for GPU synchronisations.

A value read back from a tensor (``.item()``, ``bool(t)``, ``int(t)``, ``.tolist()``, ``nonzero``
and other data-dependent shapes) goes through ATen's ``_local_scalar_dense`` or ``nonzero``; on a
GPU each of these waits for the device.  :func:`host_reads` runs a function under
``torch.profiler`` with the library's checks in ``"async"`` mode (the mode every GPU call runs
in by default) and returns the reads it made, leaving out the CPU implementation of
``torch._assert_async`` (which on a GPU does not read).
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

import attnopt

READS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::nonzero_static", "aten::masked_select",
         "aten::unique", "aten::_unique2", "aten::equal", "aten::is_nonzero")


def host_reads(fn, *args, **kwargs) -> list[str]:
    """Names of the host-reading ATen ops that ``fn(*args, **kwargs)`` ran (empty when none)."""
    with attnopt.checks("async"), profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args, **kwargs)
    found = []
    for event in prof.events():
        if event.name not in READS:
            continue
        parent, inside_assert = event.cpu_parent, False
        while parent is not None:
            if parent.name == "aten::_assert_async":
                inside_assert = True
                break
            parent = parent.cpu_parent
        if not inside_assert:
            found.append(event.name)
    return found
