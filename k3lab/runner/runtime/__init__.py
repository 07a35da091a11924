"""What a sweep's processes need around Ray Tune: the experiment's lock, the Ray watchdog (reaper),
the MPS daemon, signals, crash records, training slots, the kernel cache and shipped tunings,
library logs and the preflight. The sweep enters it through `k3lab.runner.runtime.session`.
"""
