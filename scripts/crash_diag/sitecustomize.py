"""Crash diagnostics for GPU sweeps: what each Python process did around a segfault.

    gcc -shared -fPIC -O1 -o /tmp/libk3segv.so scripts/crash_diag/segv.c
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
import importlib.abc, importlib.util, os, sys, threading, time, traceback

DIR = os.environ.get("K3DIAG_DIR")
TARGETS = {"torch._inductor.runtime.static_triton_launcher", "torch._inductor.runtime.static_cuda_launcher",
           "torch.cuda.graphs"}


def log(kind, detail=""):
    stack = "".join(traceback.format_stack(limit=25)[:-2])
    with open(os.path.join(DIR, f"diag-{os.getpid()}.log"), "a") as f:
        f.write(f"=== {time.time():.3f} {kind} thread={threading.current_thread().name} {detail}\n{stack}\n")


def patch(module):
    name = module.__name__
    if name == "torch.cuda.graphs":
        cls = module.CUDAGraph
        orig = cls.capture_end
        def capture_end(self, *a, **k):
            out = orig(self, *a, **k)
            log("CAPTURE_END", f"graph={id(self):x}")
            return out
        cls.capture_end = capture_end
        return
    for cname in ("StaticallyLaunchedCudaKernel", "StaticallyLaunchedTritonKernel"):
        cls = getattr(module, cname, None)
        if cls is None:
            continue
        for meth in ("close", "__del__"):
            orig = cls.__dict__.get(meth)
            if orig is None:
                continue
            def wrapped(self, *a, _orig=orig, _meth=meth, _c=cname, **k):
                if getattr(self, "module", None) is not None:
                    log("UNLOAD", f"{_c}.{_meth} name={getattr(self, 'name', '?')} module={self.module}")
                return _orig(self, *a, **k)
            setattr(cls, meth, wrapped)
        log("PATCHED", f"{name}.{cname} methods={[m for m in ('close', '__del__') if m in cls.__dict__]}")


class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in TARGETS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        orig_exec = loader.exec_module
        def exec_module(module):
            orig_exec(module)
            try:
                patch(module)
            except Exception as e:
                log("PATCH_FAILED", repr(e))
        loader.exec_module = exec_module
        return spec


if DIR:
    os.makedirs(DIR, exist_ok=True)
    sys.meta_path.insert(0, Finder())


def gc_logger(phase, info):
    if info.get("generation", 0) < 2:
        return
    with open(os.path.join(DIR, f"gc-{os.getpid()}.log"), "a") as f:
        f.write(f"{time.time():.3f} {phase} gen={info['generation']} collected={info.get('collected')} "
                f"thread={threading.current_thread().name}\n")


if DIR:
    import gc
    gc.callbacks.append(gc_logger)
