"""Each trial's run lists the corpus it trained on as an MLflow dataset input (k3lab.store.inputs)."""

import copy
import json

import pytest
from mlflow.tracking import MlflowClient

from k3lab.registry import TrainSpec, load_preset
from k3lab.store.inputs import CONTEXT, TRAINING, corpus_digest, corpus_name, log_corpus

pytestmark = pytest.mark.usefixtures("isolated_data")

MANIFEST = {"source": "stdlib", "fingerprint": "45554d8d", "tokenizer": "byte", "tokenizer_fingerprint": "byte",
            "val_fraction": 0.02, "vocab_size": 257, "dtype": "uint16",
            "splits": {"train": {"documents": 716, "tokens": 100, "bytes": 99,
                                 "shards": [{"file": "train-00000.arrow", "tokens": 100}]},
                       "val": {"documents": 15, "tokens": 10, "bytes": 9,
                               "shards": [{"file": "val-00000.arrow", "tokens": 10}]}}}


def test_the_digest_follows_the_tokens_and_nothing_else():
    moved = MANIFEST | {"created": "another day", "python": "3.12.3"}
    assert corpus_digest(moved) == corpus_digest(MANIFEST)
    for change in ({"fingerprint": "0"}, {"tokenizer_fingerprint": "bpe-1"}, {"val_fraction": 0.05}):
        assert corpus_digest(MANIFEST | change) != corpus_digest(MANIFEST), change
    resharded = copy.deepcopy(MANIFEST)
    resharded["splits"]["train"]["shards"][0]["tokens"] = 99
    assert corpus_digest(resharded) != corpus_digest(MANIFEST)
    assert corpus_name(MANIFEST) == "stdlib-byte"
    assert corpus_name(MANIFEST | {"tokenizer": "bpe-4096", "tokenizer_fingerprint": "9f8e7d6c5b4a"}) \
        == "stdlib-bpe-4096-9f8e7d6c"


def test_a_trial_run_lists_its_corpus_once_and_the_runs_table_filters_by_it(tmp_path):
    from k3lab.runner.tune.trial import TrialSpec, run_trial

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    train = TrainSpec(steps=2, batch_size=2, seq_len=32, warmup_steps=1, eval_interval=2, eval_batches=1)
    spec = TrialSpec(variant_id="v", variant_name="tiny", seed=0, config=load_preset("tiny"),
                     train=train, tracking_uri=uri, experiment="inputs")
    _, run_id = run_trial(spec, device="cpu")
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    (listed,) = run.inputs.dataset_inputs
    assert listed.dataset.name == "stdlib-byte" and {(t.key, t.value) for t in listed.tags} == {(CONTEXT, TRAINING)}
    profile = json.loads(listed.dataset.profile)
    assert profile["train_tokens"] == int(run.data.params["data.train_tokens"]) and profile["tokenizer"] == "byte"
    log_corpus(client, run_id, json.loads(listed.dataset.source)["uri"],  # a reopened run logs it again
               json.loads(open(json.loads(listed.dataset.source)["uri"] + "/manifest.json").read()))
    assert len(client.get_run(run_id).inputs.dataset_inputs) == 1
    experiment = run.info.experiment_id
    assert [r.info.run_id for r in client.search_runs([experiment], "dataset.name = 'stdlib-byte'")] == [run_id]
    assert client.search_runs([experiment], f"dataset.digest = '{listed.dataset.digest}'")
    assert not client.search_runs([experiment], "dataset.name = 'another-corpus'")


class LosesTheFirstRace:
    """An MlflowClient whose first log_inputs runs after another trial inserted the same dataset:
    MLflow's lookup missed it, so its insert breaks the (experiment, name, digest) key."""

    def __init__(self, client, other_run_id):
        self.client, self.other_run_id, self.lost = client, other_run_id, False

    def get_run(self, run_id):
        return self.client.get_run(run_id)

    def log_inputs(self, run_id, datasets):
        from mlflow.exceptions import MlflowException

        if not self.lost:
            self.lost = True
            self.client.log_inputs(self.other_run_id, datasets=datasets)
            raise MlflowException("UNIQUE constraint failed: datasets.experiment_id, datasets.name, datasets.digest")
        self.client.log_inputs(run_id, datasets=datasets)


def test_a_trial_that_loses_the_insert_race_to_another_trial_still_lists_the_corpus(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("race")
    mine, other = (client.create_run(experiment).info.run_id for _ in range(2))
    racing = LosesTheFirstRace(client, other)
    log_corpus(racing, mine, tmp_path, MANIFEST)
    assert racing.lost
    for run_id in (mine, other):
        (listed,) = client.get_run(run_id).inputs.dataset_inputs
        assert listed.dataset.digest == corpus_digest(MANIFEST)
