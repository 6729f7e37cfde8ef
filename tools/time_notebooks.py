"""Time every notebook's code at a given scale on this machine, without a Jupyter kernel.

    python tools/time_notebooks.py --scale full [--only STEM ...] [--timeout 120] [--out times.json]

For machines that have PyTorch but no Jupyter stack (a rented GPU box, say): each notebook runs in
a fresh Python process, its code cells executed in order with the ``parameters`` cell's values
replaced by ``--scale`` (and ``device="auto"``, so CUDA is used when present).  Display-only
figures go to matplotlib's Agg backend, so the times are the notebooks' computation, import of
the libraries included.  A missing ``ipywidgets`` (the slider of one notebook) is replaced by a
silent stand-in; a notebook that uses ``IPython.display`` needs IPython installed.  The book itself
is always executed by papermill (tools/run_notebooks.py); this tool only measures.  A failing
notebook's traceback is printed after the table row.  Prints a Markdown table and writes the times as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r'''
import json, sys, types, importlib.util
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

def stand_in(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    def anything(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return lambda *a, **k: None
    module.__getattr__ = anything
    sys.modules[name] = module
    return module

if importlib.util.find_spec("ipywidgets") is None:
    stand_in("ipywidgets", interact=lambda *a, **k: None)

path, params = sys.argv[1], json.loads(sys.argv[2])
nb = json.load(open(path))
ns = {"__name__": "__main__"}
for i, cell in enumerate(nb["cells"]):
    if cell["cell_type"] != "code":
        continue
    tags = cell.get("metadata", {}).get("tags", [])
    if "colab-setup" in tags:
        continue
    exec(compile("".join(cell["source"]), f"{path}[cell {i}]", "exec"), ns)
    if "parameters" in tags:
        ns.update(params)
    plt.close("all")
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", default="book", choices=["book", "full"])
    ap.add_argument("--only", nargs="*", help="notebook stems (default: all)")
    ap.add_argument("--skip", nargs="*", default=[], help="notebook stems to leave out")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per notebook")
    ap.add_argument("--out", type=Path, default=None, help="JSON file for the times")
    args = ap.parse_args()
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if args.only:
        notebooks = [p for p in notebooks if p.stem in args.only]
    notebooks = [p for p in notebooks if p.stem not in args.skip]
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    env.setdefault("ATTNOPT_RESULTS_DIR", str(ROOT / "_build" / "timed_results"))  # never the book's results
    params = json.dumps({"scale": args.scale, "device": "auto"})
    times: dict[str, dict] = {}
    print(f"| notebook | scale | seconds | status |\n|---|---|---:|---|", flush=True)
    for nb in notebooks:
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-c", CHILD, str(nb), params], cwd=ROOT / "notebooks", env=env,
                                  capture_output=True, text=True, timeout=args.timeout)
            status = "ok" if proc.returncode == 0 else "failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:120]
        except subprocess.TimeoutExpired:
            status = f"stopped after {args.timeout:.0f} s"
        seconds = time.perf_counter() - t0
        times[nb.stem] = {"scale": args.scale, "seconds": round(seconds, 1), "status": status}
        print(f"| {nb.stem} | {args.scale} | {seconds:.1f} | {status} |", flush=True)
        if status.startswith("failed"):
            print("\n".join("    " + line for line in proc.stderr.strip().splitlines()[-12:]), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(times, indent=1) + "\n")
    return 0 if all(t["status"] == "ok" for t in times.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
