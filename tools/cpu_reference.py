"""A fixed PyTorch workload whose CPU time measures how fast this machine runs the notebooks.

The notebooks' budget (tests/book/test_results.py) is in *reference seconds*: a kernel's CPU time
scaled by ``REFERENCE_SECONDS / measured``, where ``measured`` is the CPU time of this workload in
the same run of tools/run_notebooks.py and ``REFERENCE_SECONDS`` its CPU time on the machine the
book is built on. Two machines of the same kind have differed by a factor of two in the CPU time of
the same notebook (the VQA notebook took 294 s on one and 557 s on another, both quiet); the
workload slows down with them, so the scaled time measures what the notebook does, not the machine.

The workload is the notebooks' kind of work, on one thread: small-batch training of a small network
with autograd and Adam (many small operators, as the VQA heads), elementwise passes over tensors of
10^5 entries (as the EM fits and transforms) and a few dense products. It uses PyTorch alone, never
attnopt, so a slower library shows as a slower notebook rather than as a slower machine.

    python tools/cpu_reference.py [--repeat N]   # prints the CPU seconds of each repetition
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

#: CPU seconds of one run of :func:`workload` on the book's 2-core machine (AMD EPYC, PyTorch 2.13
#: CPU build, one thread), the least of several quiet runs (2026-11-28).
REFERENCE_SECONDS = 2.0


def workload() -> float:
    """Run the fixed workload once; return its CPU seconds (imports excluded)."""
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    start = time.process_time()
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 11))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.randn(128, 196, 13, generator=g)
    w = torch.randn(13, 64, generator=g)
    for _ in range(300):  # small steps: operator overhead and autograd
        h = torch.softmax(x @ w[:, :1] * 0.1, 1)  # (128, 196, 1)
        pooled = (h * x).sum(1) @ w  # (128, 64)
        loss = torch.nn.functional.cross_entropy(net(pooled), torch.zeros(128, dtype=torch.long))
        opt.zero_grad()
        loss.backward()
        opt.step()
    a = torch.randn(128, 2, 196, 2, generator=g)
    b = torch.rand(128, 2, 196, 1, generator=g) + 0.5
    for _ in range(3000):  # elementwise passes over 10^5 entries
        a = torch.exp(-0.5 * (a * b - a / b).clamp(-5, 5)) + a.mean()
    m = torch.randn(256, 256, generator=g)
    for _ in range(120):  # dense products
        m = torch.tanh(m @ m * 0.05)
    return time.process_time() - start


def measure(repeat: int = 3) -> float:
    """The least CPU time of ``repeat`` runs of the workload in a fresh one-thread Python process,
    after one run that warms it up (the first run pays one-time costs: lazy imports, allocations).
    The least, because what else the machine does can only slow a run down."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, __file__, "--repeat", str(repeat), "--json"], env=env,
                         capture_output=True, text=True, check=True).stdout
    return min(json.loads(out))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the times as a JSON list")
    args = parser.parse_args(argv)
    workload()  # warm-up, not counted
    times = [workload() for _ in range(max(1, args.repeat))]
    if args.json:
        print(json.dumps(times))
    else:
        for t in times:
            print(f"{t:.3f} s of CPU (the book's machine: {REFERENCE_SECONDS} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
