"""Corpus sources, tokenizers, Arrow token shards and batch sampling.

Typical use in a trainer:

    ds = prepare_dataset("stdlib")               # once, in the driver; cached after
    ds = Dataset.open(path)                      # in each trial, by ds.path
    train = BatchSampler(ds.train_tokens, batch_size, seq_len, seed, rank, world_size)
    x, y = train.next_batch(device)              # int64 (B, T)
    val = BatchSampler(ds.val_tokens, batch_size, seq_len, rank=rank, world_size=world_size)
    for x, y in val.eval_batches(n): ...
    bpb = ds.bits_per_byte(val_loss_nats)
"""

from k3lab.data.cache import cache_root
from k3lab.data.dataset import Dataset
from k3lab.data.prepare import (DEFAULT_VAL_FRACTION, find_datasets, list_datasets, load_dataset_info,
                                 prepare_dataset)
from k3lab.data.sampler import BatchSampler
from k3lab.data.sources import Document, get_source
from k3lab.data.tokenizer import ByteTokenizer, FileTokenizer, get_tokenizer

__all__ = [
    "BatchSampler", "ByteTokenizer", "DEFAULT_VAL_FRACTION", "Dataset", "Document", "FileTokenizer",
    "cache_root", "find_datasets", "get_source", "get_tokenizer", "list_datasets", "load_dataset_info", "prepare_dataset",
]
