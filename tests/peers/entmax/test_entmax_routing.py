"""The vendored entmax tests really exercise attnopt: broken on purpose, attnopt makes them fail.

A pytest plugin replaces ``attnopt.transforms.sparsemax``, ``entmax15`` and ``entmax`` by softmax
(a valid, differentiable distribution, but the wrong one) and runs entmax's loss tests in a
subprocess.  Each loss projects with exactly one of the three (``SparsemaxLoss``: sparsemax,
``Entmax15Loss``: entmax15, ``SparsemaxBisectLoss`` and ``EntmaxBisectLoss``: entmax), and its
gradcheck holds only if the projection is the right one, so each route must show failures.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import attnopt

HERE = Path(__file__).parent
ROOT = HERE.parents[2]

SABOTAGE = '''
import torch
from attnopt import transforms as T

def _softmax_instead(scores, *args, dim=-1, **kwargs):
    return torch.softmax(scores, dim=dim)

for _name in ("sparsemax", "entmax15", "entmax"):
    setattr(T, _name, _softmax_instead)
'''


def test_sabotaged_attnopt_fails_the_vendored_tests(tmp_path):
    (tmp_path / "attnopt_sabotage.py").write_text(SABOTAGE)
    src = str(Path(attnopt.__file__).parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), src]))
    files = [str(HERE / "test_entmax_losses.py")]
    command = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "-p", "attnopt_sabotage", "-k", "test_loss", *files]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out  # 1: tests ran and some failed (not a usage or import error)
    failed = set(re.findall(r"^FAILED \S+::(\S+)", out, flags=re.M))
    # sparsemax (SparsemaxLoss), entmax15 (Entmax15Loss), entmax (SparsemaxBisectLoss, EntmaxBisectLoss):
    for loss in ("SparsemaxLoss", "Entmax15Loss", "SparsemaxBisectLoss", "EntmaxBisectLoss"):
        broken = {name for name in failed if name.startswith("test_loss[") and name.endswith(f"-{loss}]")}
        assert len(broken) == 4, (loss, out)  # every reduction and ignore_index case of that loss
