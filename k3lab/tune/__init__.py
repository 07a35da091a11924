"""Ray Tune orchestration: sweeps, trials (one process or DDP), the reporter between training and
Tune, kernel warm-up, preflight checks and the live progress table.
"""
