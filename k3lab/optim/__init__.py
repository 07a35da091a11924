"""The optimizers: k3lab's batched Muon (`muon.py`) and which parameters it or AdamW takes (`assignment.py`)."""
