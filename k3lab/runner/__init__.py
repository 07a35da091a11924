"""What runs trials: `train/` one trial's training (no Ray, no MLflow), `tune/` the sweep on Ray Tune
(trials, the seeds policy's searcher, progress, the parent run), `runtime/` what a sweep's processes
need around Tune (lock, reaper, MPS, signals, crash records, kernel cache, GPU packing, preflight)."""
