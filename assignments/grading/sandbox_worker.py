"""The process that runs a submission's code while it is graded, and the format of what it sends back.

``autograde_sandbox.py`` (the grader, in nbgrader's own process) starts this file inside the
sandbox (bubblewrap: no network, no view of the course directory, the library ``attnopt`` absent)
and talks to it through two pipes. It runs the student's cells in one namespace, calls the
student's functions on the inputs the checks send, and sends back only data: the message format
below carries ``None``, booleans, numbers, strings, tuples, lists, dicts and tensors (and NumPy
arrays) as a JSON header plus raw bytes, never pickle, so nothing a submission returns can run code
in the grader. The checks themselves never run here.

Message: 4-byte big-endian length of a UTF-8 JSON header, the header, then the raw bytes of the
tensors it names (``{"__t": "tensor", "dtype": ..., "shape": ..., "blob": i}``; blob ``i`` has the
length ``header["blobs"][i]``). This file imports only the standard library, NumPy and torch, so
that the grader can use the same encoder and decoder.
"""

from __future__ import annotations

import io
import json
import math
import os
import struct
import sys
import traceback

MAX_MESSAGE = 1 << 30  # a student's function that returns a GiB is wrong; refuse it rather than swap
MAX_DEPTH = 32
DTYPES = ("float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")
LIBRARY = "attnopt"


class ProtocolError(RuntimeError):
    """A message that does not follow the format (too large, wrong type, inconsistent sizes)."""


# ------------------------------------------------------------------------------------------- codec


def encode(tree, grad_ids=frozenset()):
    """``(header tree, blobs)`` for a tree of plain values and tensors. A tensor whose ``id`` is in
    ``grad_ids`` is marked ``requires_grad`` (so the other side can differentiate through it)."""
    import numpy as np
    import torch

    blobs: list[bytes] = []

    def enc(x, depth):
        if depth > MAX_DEPTH:
            raise ProtocolError("the value is nested too deeply")
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return {"__t": "int", "v": str(x)} if abs(x) >= 2**53 else x
        if isinstance(x, float):
            return x if math.isfinite(x) else {"__t": "float", "v": repr(x)}
        if isinstance(x, (np.floating, np.integer, np.bool_)):
            return enc(x.item(), depth)
        if isinstance(x, torch.Tensor):
            return enc_array(x.detach().cpu().contiguous(), "tensor", id(x) in grad_ids)
        if isinstance(x, np.ndarray):
            return enc_array(torch.from_numpy(np.ascontiguousarray(x)), "ndarray", False)
        if isinstance(x, tuple):
            return {"__t": "tuple", "items": [enc(v, depth + 1) for v in x]}
        if isinstance(x, list):
            return [enc(v, depth + 1) for v in x]
        if isinstance(x, dict):
            if not all(isinstance(k, (str, int)) for k in x):
                raise ProtocolError("a dict with keys that are not strings or integers")
            return {"__t": "dict", "items": [[enc(k, depth + 1), enc(v, depth + 1)] for k, v in x.items()]}
        if isinstance(x, torch.dtype):
            return {"__t": "dtype", "v": str(x).removeprefix("torch.")}
        raise ProtocolError(
            f"a value of type {type(x).__name__} cannot be sent: return tensors, numbers, strings, "
            "tuples, lists or dicts of them")

    def enc_array(t, tag, requires_grad):
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise ProtocolError(f"a tensor of dtype {dtype} cannot be sent (use one of {', '.join(DTYPES)})")
        blobs.append(t.numpy().tobytes() if t.numel() else b"")
        return {"__t": tag, "dtype": dtype, "shape": list(t.shape), "blob": len(blobs) - 1,
                "requires_grad": bool(requires_grad)}

    return enc(tree, 0), blobs


def decode(tree, blobs, on_tensor=None):
    """The values of an encoded tree; ``on_tensor(tensor, node)`` may replace each decoded tensor."""
    import numpy as np
    import torch

    def dec(x, depth):
        if depth > MAX_DEPTH:
            raise ProtocolError("the value is nested too deeply")
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [dec(v, depth + 1) for v in x]
        if not isinstance(x, dict) or not isinstance(x.get("__t"), str):
            raise ProtocolError("malformed value")
        tag = x["__t"]
        if tag == "int":
            return int(str(x["v"]))
        if tag == "float":
            if x["v"] not in ("nan", "inf", "-inf"):
                raise ProtocolError("malformed float")
            return float(x["v"])
        if tag == "tuple":
            return tuple(dec(v, depth + 1) for v in _list(x["items"]))
        if tag == "dict":
            items = [(dec(k, depth + 1), dec(v, depth + 1)) for k, v in (_pair(p) for p in _list(x["items"]))]
            if not all(isinstance(k, (str, int)) for k, _ in items):
                raise ProtocolError("malformed dict")
            return dict(items)
        if tag == "dtype":
            if x["v"] not in DTYPES:
                raise ProtocolError("unknown dtype")
            return getattr(torch, x["v"])
        if tag in ("tensor", "ndarray"):
            dtype, shape, i = x.get("dtype"), x.get("shape"), x.get("blob")
            if dtype not in DTYPES or not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
                raise ProtocolError("malformed tensor")
            if not isinstance(i, int) or not 0 <= i < len(blobs):
                raise ProtocolError("a tensor without its bytes")
            torch_dtype = getattr(torch, dtype)
            size = math.prod(shape) * torch.empty((), dtype=torch_dtype).element_size()
            if len(blobs[i]) != size:
                raise ProtocolError("a tensor whose bytes do not match its shape")
            t = torch.frombuffer(bytearray(blobs[i]), dtype=torch_dtype).reshape(shape) if size else torch.empty(shape, dtype=torch_dtype)
            if tag == "ndarray":
                return np.array(t.numpy())
            return on_tensor(t, x) if on_tensor else t
        raise ProtocolError(f"unknown value type {tag!r}")

    return dec(tree, 0)


def _list(x):
    if not isinstance(x, list):
        raise ProtocolError("malformed value")
    return x


def _pair(x):
    if not isinstance(x, list) or len(x) != 2:
        raise ProtocolError("malformed dict item")
    return x


def write_message(fd: int, header: dict, blobs=(), write=None) -> None:
    """Send one message on ``fd`` (with ``write(view) -> bytes written`` instead of ``os.write`` if given)."""
    header = dict(header, blobs=[len(b) for b in blobs])
    data = json.dumps(header, allow_nan=False).encode()
    payload = b"".join([struct.pack(">I", len(data)), data, *blobs])
    view = memoryview(payload)
    while view:
        view = view[(write(view) if write else os.write(fd, view)):]


def read_exact(read, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = read(left)
        if not chunk:
            raise EOFError("the other side closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_message(read) -> tuple[dict, list[bytes]]:
    """One message from ``read(n)`` (which returns at most ``n`` bytes, b"" at the end)."""
    (n,) = struct.unpack(">I", read_exact(read, 4))
    if n > MAX_MESSAGE:
        raise ProtocolError("message too large")
    header = json.loads(read_exact(read, n))
    sizes = header.get("blobs", []) if isinstance(header, dict) else None
    if not isinstance(sizes, list) or not all(isinstance(s, int) and 0 <= s for s in sizes) or sum(sizes) > MAX_MESSAGE:
        raise ProtocolError("malformed message")
    return header, [read_exact(read, s) for s in sizes]


# ------------------------------------------------------------------------------------------ worker


class _NoLibrary:
    """``import attnopt`` inside the sandbox: the library is not there (this only explains why)."""

    def find_spec(self, name, path=None, target=None):
        if name == LIBRARY or name.startswith(LIBRARY + "."):
            raise ModuleNotFoundError(
                f"No module named {name!r}: the course library is not available while your notebook is "
                "graded (LibraryBlocked); the task asks you to write it yourself with torch", name=name)
        return None


def _error(exc) -> dict:
    """The student's error: its type, message and the lines of the student's own cells."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<cell ")]
    return {"ename": type(exc).__name__, "evalue": str(exc)[:4000],
            "frames": [[f.filename, f.lineno or 0, (f.line or "").strip()] for f in frames[-4:]]}


class Worker:
    def __init__(self, read_fd: int, write_fd: int):
        self.rfile = os.fdopen(read_fd, "rb", buffering=0)
        self.write_fd = write_fd
        self.namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
        self.graphs: dict[int, tuple[list, list]] = {}

    def run(self) -> None:
        import torch

        while True:
            try:
                header, blobs = read_message(self.rfile.read)
            except EOFError:
                return
            out = io.StringIO()
            saved = sys.stdout, sys.stderr
            sys.stdout = sys.stderr = out
            reply_blobs: list[bytes] = []
            try:
                reply, reply_blobs = self.handle(header, blobs, torch)
            except BaseException as exc:  # the student's code raised (or called exit())
                reply = {"error": _error(exc)}
            finally:
                sys.stdout, sys.stderr = saved
            reply["output"] = out.getvalue()[-20000:]
            try:
                write_message(self.write_fd, reply, reply_blobs)
            except ProtocolError as exc:
                write_message(self.write_fd, {"error": _error(exc), "output": reply["output"]})

    def handle(self, header, blobs, torch):
        op = header.get("op")
        if op == "exec":
            before = dict(self.namespace)
            import linecache

            filename = f"<cell {header.get('cell', '?')}>"
            source = str(header["code"])
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # lines for errors
            code = compile(source, filename, "exec")
            try:
                exec(code, self.namespace)
                error = None
            except BaseException as exc:
                error = _error(exc)
            changed = {name: "callable" if callable(value) else "value"
                       for name, value in self.namespace.items()
                       if not name.startswith("__") and before.get(name, self) is not value}
            return ({"names": changed, "error": error} if error else {"names": changed}), []
        if op == "call":
            fn = self.namespace.get(header["name"])
            if not callable(fn):
                raise NameError(f"`{header['name']}` is not defined: run the cell that defines it")
            leaves = []

            def leaf(t, node):
                if node.get("requires_grad"):
                    t.requires_grad_(True)
                    leaves.append(t)
                return t

            args = decode(header["args"], blobs, leaf)
            kwargs = decode(header["kwargs"], blobs, leaf)
            with torch.enable_grad() if leaves else torch.no_grad():
                result = fn(*args, **kwargs)
            outputs = []
            if leaves:
                outputs = [t for t in _tensors(result) if t.requires_grad]
            call_id = None
            if outputs:
                call_id = len(self.graphs) + 1
                self.graphs[call_id] = (leaves, outputs)
            tree, reply_blobs = encode(result, {id(t) for t in outputs})
            return {"result": tree, "call_id": call_id}, reply_blobs
        if op == "backward":
            leaves, outputs = self.graphs[int(header["call_id"])]
            grads = decode(header["grads"], blobs)
            found = torch.autograd.grad(outputs, leaves, grads, allow_unused=True, retain_graph=True)
            found = [torch.zeros_like(x) if g is None else g for g, x in zip(found, leaves)]
            tree, reply_blobs = encode(found)
            return {"grads": tree}, reply_blobs
        if op == "get":
            if header["name"] not in self.namespace:
                raise NameError(f"`{header['name']}` is not defined: run the cell that defines it")
            tree, reply_blobs = encode(self.namespace[header["name"]])
            return {"result": tree}, reply_blobs
        if op == "hello":
            finders = [f for f in sys.meta_path if not isinstance(f, _NoLibrary)]
            return {"library_found": any(f.find_spec(LIBRARY, None) is not None for f in finders
                                         if hasattr(f, "find_spec"))}, []
        raise ProtocolError(f"unknown request {op!r}")


def _tensors(tree):
    import torch

    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (tuple, list)):
        for v in tree:
            yield from _tensors(v)
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _tensors(v)


def main() -> None:
    # The requests come on fd 0 and the replies go to fd 1; the student's code gets neither: both
    # move to private descriptors, and its own output (Python's and C's) is captured per request.
    read_fd, write_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(os.open("/tmp/.worker-output", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) if os.path.isdir("/tmp") else devnull, 1)
    os.dup2(1, 2)
    sys.meta_path.insert(0, _NoLibrary())
    sys.path.insert(0, os.getcwd())  # files handed in beside the notebook, as in a notebook's kernel
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    Worker(read_fd, write_fd).run()


if __name__ == "__main__":
    main()
