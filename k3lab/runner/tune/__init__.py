"""Ray Tune orchestration: sweeps, trials (one process or DDP), the seeds policy's Searcher, the
reporter between training and Tune, the parent run and the live progress table. The process, GPU
and cache plumbing around it lives in `k3lab.runner.runtime`.
"""
