"""Trials that span several workers: DDP through a Ray Train `TorchTrainer` inside a Tune trial.

The Tune trial runs `ddp_trainable`, which starts a TorchTrainer whose workers each run
`ddp_worker` on one GPU (NCCL), or on CPU with gloo where the cluster has no GPUs.
`TuneReportCallback` forwards rank 0's reports to Tune. Every rank trains on its own
slice of each global batch (the sampler shards by rank); rank 0 alone logs to the
trial's MLflow run and writes checkpoints, whose extra data carries the run id, so a
restored trial (Train restores from the latest checkpoint in its storage folder)
continues the same run, as single-worker trials do.
"""

from __future__ import annotations

import dataclasses
import time

from k3lab.train.trainer import FINISHED
from k3lab.tune.trial import (LastReportHeld, TrialSpec, diverged_report, inject_failure, limit_threads,
                                load_ray_checkpoint, report_metrics, report_with_checkpoint, run_trial)


def ddp_worker(config: dict) -> None:
    """One rank of a DDP trial (runs inside a Ray Train worker)."""
    import ray.train
    import ray.train.torch

    started_at = time.time()
    spec: TrialSpec = config["spec"]
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    limit_threads()
    restored = ray.train.get_checkpoint()
    state = load_ray_checkpoint(restored)

    def report_to_train(result, checkpoint):  # a test crash after rank 0 sent its metrics (trial.py)
        inject_failure(result["done_steps"], restored=restored is not None)
        ray.train.report(result, checkpoint=checkpoint)

    def report(trainer, metrics, tracker):
        metrics = report_metrics(spec, trainer, metrics, tracker) | {"world_size": world_size}
        if rank == 0:
            report_with_checkpoint(report_to_train, ray.train.Checkpoint, trainer, metrics, tracker)
        else:
            report_to_train(metrics, checkpoint=None)

    tracked = spec if rank == 0 else dataclasses.replace(spec, tracking_uri=None)
    last = LastReportHeld(spec, report, keep_checkpoint=rank == 0)
    result, run_id = run_trial(tracked, checkpoint=state, on_eval=last.on_eval, flush_with_checkpoints=True,
                               started_at=started_at, device=ray.train.torch.get_device(), rank=rank,
                               world_size=world_size)
    if result.status != FINISHED:  # every rank sees the same all-reduced loss, so all stop together
        ray.train.report(diverged_report(spec, result, run_id), checkpoint=None)
        return
    last.send(report_to_train, ray.train.Checkpoint, result, run_id, {"world_size": world_size})  # see trial.py


def ddp_trainable(param: dict, trials: dict[str, TrialSpec], num_workers: int, cpus_per_worker: float,
                  use_gpu: bool, storage: str) -> None:
    """The Tune trial of a DDP variant: start the workers and wait for them."""
    from ray import train
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    key = param["trial"]
    resources = {"CPU": cpus_per_worker, "GPU": 1} if use_gpu else {"CPU": cpus_per_worker}
    trainer = TorchTrainer(
        ddp_worker,
        train_loop_config={"spec": trials[key]},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=train.ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                           resources_per_worker=resources),
        run_config=train.RunConfig(name=f"ddp-{key}", storage_path=storage, callbacks=[TuneReportCallback()],
                                   checkpoint_config=train.CheckpointConfig(num_to_keep=1)),
    )
    trainer.fit()
