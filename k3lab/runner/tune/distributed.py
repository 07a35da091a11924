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

import time

import attrs

from k3lab.runner.tune.ray_reports import TrialReporter
from k3lab.runner.tune.trial import TrialSpec, limit_threads, load_ray_checkpoint, run_trial


def ddp_worker(config: dict) -> None:
    """One rank of a DDP trial (runs inside a Ray Train worker): rank 0 tracks and checkpoints,
    every rank reports (Ray Train forwards rank 0's reports to Tune)."""
    import ray.train
    import ray.train.torch

    started_at = time.time()
    spec: TrialSpec = config["spec"]
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    limit_threads()
    restored = ray.train.get_checkpoint()
    reporter = TrialReporter(spec, ray.train.report, ray.train.Checkpoint, restored=restored is not None,
                             checkpoints=rank == 0, extra={"world_size": world_size})
    tracked = spec if rank == 0 else attrs.evolve(spec, tracking_uri=None)
    result, run_id = run_trial(tracked, checkpoint=load_ray_checkpoint(restored), reporter=reporter,
                               flush_with_checkpoints=True, started_at=started_at,
                               device=ray.train.torch.get_device(), rank=rank, world_size=world_size)
    # diverged: every rank sees the same all-reduced loss, so all stop together
    reporter.finish(result, run_id)


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
