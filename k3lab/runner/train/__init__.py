"""One trial's training: the trainer and its loop (`trainer`) of a `TrainSpec` (`k3lab.registry.train_spec`), checkpoints,
CUDA graphs, DDP settings and the metrics of the architecture and the device. No Ray, no MLflow:
the loop logs through any tracker it is given and reports through the `on_eval` callback.
"""
