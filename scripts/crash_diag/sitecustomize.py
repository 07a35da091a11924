"""Crash diagnostics for GPU sweeps: what each Python process did around a segfault.

    gcc -shared -fPIC -O1 -o /tmp/libk3segv.so scripts/crash_diag/segv.c -ldl
    export K3DIAG_DIR=/tmp/diag PYTHONPATH=$PWD/scripts/crash_diag:$PYTHONPATH LD_PRELOAD=/tmp/libk3segv.so
    python bench/sweep_ceiling.py experiments/attnres_block.yaml --phase fresh --work /tmp/w --seeds 0,1

Every process (Ray's trial workers inherit the environment) imports this file at start-up and
writes, into K3DIAG_DIR:
- diag-PID.log: each CUDA-graph capture (`CUDAGraph.capture_end`) and each CUDA module that
  Inductor's static launcher unloads (torch >= 2.13 unloads a kernel's module when its launcher
  is collected; a graph that launched it would then launch freed code), with thread and stack;
- gc-PID.log: each full (generation 2) garbage collection, its thread and what it freed.
segv.c adds the fault address, the PC and a native backtrace to the worker's stderr, which Ray
keeps as logs/worker-*.err. Without K3DIAG_DIR set this file does nothing.
"""
import importlib.abc
import importlib.util
import os
import sys
import threading
import time
import traceback

DIR = os.environ.get("K3DIAG_DIR")
LAUNCHERS = ("torch._inductor.runtime.static_triton_launcher", "torch._inductor.runtime.static_cuda_launcher")
GRAPHS = "torch.cuda.graphs"


def log(kind: str, detail: str = "") -> None:
    """One entry in diag-PID.log: time, kind, thread, and the Python stack that got here."""
    stack = "".join(traceback.format_stack(limit=25)[:-2])
    with open(os.path.join(DIR, f"diag-{os.getpid()}.log"), "a") as f:
        f.write(f"=== {time.time():.3f} {kind} thread={threading.current_thread().name} {detail}\n{stack}\n")


def log_captures(graphs) -> None:
    """Wrap torch.cuda.graphs.CUDAGraph.capture_end to log each capture."""
    capture_end = graphs.CUDAGraph.capture_end

    def logged(self, *args, **kwargs):
        out = capture_end(self, *args, **kwargs)
        log("CAPTURE_END", f"graph={id(self):x}")
        return out

    graphs.CUDAGraph.capture_end = logged


def log_unloads(launcher) -> None:
    """Wrap the static launcher's close/__del__ (where a torch version has them) to log each
    module it unloads."""
    for name in ("StaticallyLaunchedCudaKernel", "StaticallyLaunchedTritonKernel"):
        cls = getattr(launcher, name, None)
        methods = [m for m in ("close", "__del__") if cls is not None and m in cls.__dict__]
        for method in methods:
            def logged(self, *args, _original=cls.__dict__[method], _what=f"{name}.{method}", **kwargs):
                if getattr(self, "module", None) is not None:
                    log("UNLOAD", f"{_what} name={getattr(self, 'name', '?')} module={self.module}")
                return _original(self, *args, **kwargs)

            setattr(cls, method, logged)
        if cls is not None:
            log("PATCHED", f"{launcher.__name__}.{name} methods={methods}")


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Applies log_captures / log_unloads to their modules as they are imported."""

    PATCHES = {GRAPHS: log_captures, **{name: log_unloads for name in LAUNCHERS}}

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.PATCHES:
            return None
        sys.meta_path.remove(self)  # the real spec, found without this finder
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module, patch = spec.loader.exec_module, self.PATCHES[fullname]

        def exec_and_patch(module):
            exec_module(module)
            try:
                patch(module)
            except Exception as error:  # a torch whose classes moved: say so, never break the import
                log("PATCH_FAILED", repr(error))

        spec.loader.exec_module = exec_and_patch
        return spec


def log_full_collections(phase: str, info: dict) -> None:
    """gc callback: one line in gc-PID.log for each start and stop of a generation-2 collection."""
    if info.get("generation", 0) < 2:
        return
    with open(os.path.join(DIR, f"gc-{os.getpid()}.log"), "a") as f:
        f.write(f"{time.time():.3f} {phase} gen={info['generation']} collected={info.get('collected')} "
                f"thread={threading.current_thread().name}\n")


if DIR:
    import gc

    os.makedirs(DIR, exist_ok=True)
    sys.meta_path.insert(0, PatchOnImport())
    gc.callbacks.append(log_full_collections)
