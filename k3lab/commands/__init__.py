"""The `k3lab` sub-commands that drive training, sweeps and reports (see `k3lab.cli`)."""
