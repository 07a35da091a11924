"""What a trial is refused for before it trains, each with the field that breaks it: checks the
preflight runs in the driver (before a corpus is prepared, or once it is) and the trainer again."""

from __future__ import annotations

from k3lab.data.split import SPLITS
from k3lab.errors import UserError
from k3lab.model.config import KimiK3Config
from k3lab.registry.train_spec import TrainSpec


def check_seq_len(config: KimiK3Config, spec: TrainSpec) -> None:
    """Reject a trial whose sequences the model cannot take, with the field that breaks it: needs no
    data, so it runs before a corpus is prepared (minutes for a large one)."""
    if spec.seq_len > config.max_seq_len:
        raise UserError(f"train.seq_len: {spec.seq_len} exceeds the model's max_seq_len={config.max_seq_len}")
    if spec.seq_len % config.seq_len_multiple:
        raise UserError(f"train.seq_len: {spec.seq_len} is not a multiple of kda_chunk_size={config.kda_chunk_size}")


def check_vocab(config: KimiK3Config, vocab_size: int) -> None:
    """Reject a model whose embedding has fewer ids than the tokenizer."""
    if vocab_size > config.vocab_size:
        raise UserError(f"vocab_size: the tokenizer has {vocab_size} ids, more than the model's "
                        f"vocab_size={config.vocab_size}")


def check_splits(spec: TrainSpec, dataset) -> None:
    """Reject a prepared corpus whose training or validation split holds no window of
    train.seq_len + 1 tokens, naming the corpus, the split and the field (the sampler said only
    'split has 24 tokens', from inside each trial). Reads the manifest's counts: cheap."""
    for split in SPLITS:
        tokens = dataset.manifest["splits"][split]["tokens"]
        if tokens < spec.seq_len + 1:
            raise UserError(f"train.dataset {spec.dataset}: its {split} split has {tokens:,} tokens, fewer than "
                            f"train.seq_len + 1 = {spec.seq_len + 1} (a larger corpus or a shorter seq_len)")
