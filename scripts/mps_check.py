"""On a GPU machine, from the repository root: `python scripts/mps_check.py`.

k3lab.runner.runtime.mps's daemon starts, two CUDA processes connect to it (nvidia-smi lists the MPS
server and them), it quits after (the time it took printed); a driver that called cuInit, as
sweeps' drivers once did, against it; then a driver killed with SIGKILL: its daemon and server go
with it. Its runs: docs/runs/mps-check-*.log.
"""
import os, subprocess, sys, textwrap, time
from pathlib import Path
sys.path.insert(0, os.getcwd())
from k3lab.runner.runtime.mps import gpu_sharing

CHILD = textwrap.dedent('''
    import os, time, torch
    x = torch.randn(8192, 8192, device="cuda")
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(100): y = x @ x
    torch.cuda.synchronize(); print(os.getpid(), "100 matmuls", round(time.perf_counter() - t, 3), "s", flush=True)
    time.sleep(3)
''')

def sh(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()

def mps_procs():
    return sh("pgrep", "-a", "nvidia-cuda-mps") or "none"

print("before:", mps_procs(), flush=True)
alone = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True).stdout
print("alone, no MPS:", alone.strip(), flush=True)
with gpu_sharing(None, True, False, log_dir=Path("/tmp/mpslog"), where="check", say=print) as how:
    print("sharing:", how, flush=True)
    from k3lab.runner.runtime.preflight import cuda_gpus
    print("GPUs (NVML, as the sweep's driver counts them):", cuda_gpus(), flush=True)
    procs = [subprocess.Popen([sys.executable, "-c", CHILD]) for _ in range(2)]
    time.sleep(6)
    print(sh("nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv"), flush=True)
    print("during:", mps_procs(), flush=True)
    for p in procs:
        p.wait()
    told = time.monotonic()
print(f"daemon stopped {time.monotonic() - told:.1f} s after the trials' processes ended", flush=True)
time.sleep(1)
print("after the with:", mps_procs(), flush=True)
print(sh("sh", "-c", "tail -5 /tmp/mpslog/control.log /tmp/mpslog/server.log /tmp/mpslog/daemon.out"), flush=True)

cuinit = textwrap.dedent(f'''
    import subprocess, sys, time
    from pathlib import Path
    sys.path.insert(0, {os.getcwd()!r})
    import torch
    from k3lab.runner.runtime.mps import gpu_sharing
    with gpu_sharing(None, True, False, log_dir=Path("/tmp/mpslog3"), where="x", say=print):
        print("torch.cuda.is_available() in the driver (cuInit):", torch.cuda.is_available(), flush=True)
        subprocess.run([sys.executable, "-c", {CHILD!r}])
        told = time.monotonic()
    print(f"daemon stopped {{time.monotonic() - told:.1f}} s after the trial's process ended", flush=True)
''')
print("a driver that initialised CUDA:", flush=True)
subprocess.run([sys.executable, "-c", cuinit])
print("after it:", mps_procs(), flush=True)

driver = textwrap.dedent(f'''
    import os, signal, subprocess, sys, time
    from pathlib import Path
    sys.path.insert(0, {os.getcwd()!r})
    from k3lab.runner.runtime.mps import gpu_sharing
    with gpu_sharing(None, True, False, log_dir=Path("/tmp/mpslog2"), where="x", say=print):
        subprocess.run([sys.executable, "-c", {CHILD!r}])
        print("killing the driver", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
''')
print("driver exit:", subprocess.run([sys.executable, "-c", driver]).returncode, flush=True)
for wait in (1, 3, 6):
    time.sleep(wait)
    print(f"after the driver's SIGKILL (+{wait}s):", mps_procs(), flush=True)
