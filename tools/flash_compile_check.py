"""Compile every kernel for sm_90 without a GPU (ptxas from the triton wheel): catches what the interpreter accepts but the compiler rejects."""
import inspect, sys
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attnopt import _attention_flash as F

def sig(fn, ptr, consts, fp):
    s = {}
    for name in fn.arg_names:
        if name in consts: s[name] = "constexpr"
        elif name[0].isupper() or name in ("dO", "dK", "dV", "dQ"): s[name] = "*" + ptr.get(name, fp)
        elif name in ("n_q","n_k","d","dv","causal_off","n_qb","n_kb","max_iter"): s[name] = "i32"
        else: s[name] = "fp32" if fp=="fp32" else "fp64"
    return s
target = GPUTarget("cuda", 90, 32)
ok = True
for fp in ("fp32", "fp64"):
  WORK = tl.float32 if fp == "fp32" else tl.float64
  for mode in (0, 1, 2, 3):
    for causal in (False, True):
      base = dict(HAS_KM=True, CAUSAL=causal, BM=64 if fp=="fp32" else 32, BN=64 if fp=="fp32" else 32, BD=64, WORK=WORK)
      jobs = []
      if mode == 0:
          jobs.append((F._softmax_fwd_kernel, dict(base, BDV=64)))
      else:
          jobs.append((F._max_kernel, dict(base)))
          jobs.append((F._entmax_fwd_kernel, dict(base, BDV=64, MODE=mode)))
      jobs.append((F._bwd_kv_kernel, dict(base, BDV=64, MODE=mode)))
      jobs.append((F._bwd_q_kernel, dict(base, BDV=64, MODE=mode)))
      for fn, consts in jobs:
          ptr = {"KM": "i8", "Visits": "i32"}
          s = sig(fn, ptr, consts, fp)
          try:
              k = triton.compile(ASTSource(fn, s, constexprs=consts), target=target)
              print("ok", fp, mode, causal, fn.fn.__name__, "regs", k.n_regs if hasattr(k,'n_regs') else "?", "spills", getattr(k, "n_spills", "?"))
          except Exception as e:
              ok = False
              print("FAIL", fp, mode, causal, fn.fn.__name__, type(e).__name__, str(e)[:1500])
sys.exit(0 if ok else 1)
