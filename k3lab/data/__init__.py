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

from k3lab.lazy import lazy_exports

_EXPORTS = {  # name -> the module it comes from, imported on first use (`k3lab --help` imports no torch)
    'cache_root': 'k3lab.data.cache',
    'Dataset': 'k3lab.data.dataset',
    'DEFAULT_VAL_FRACTION': 'k3lab.data.prepare',
    'find_datasets': 'k3lab.data.prepare',
    'list_datasets': 'k3lab.data.prepare',
    'load_dataset_info': 'k3lab.data.prepare',
    'prepare_dataset': 'k3lab.data.prepare',
    'BatchSampler': 'k3lab.data.sampler',
    'Document': 'k3lab.data.sources',
    'get_source': 'k3lab.data.sources',
    'ByteTokenizer': 'k3lab.data.tokenizer',
    'FileTokenizer': 'k3lab.data.tokenizer',
    'get_tokenizer': 'k3lab.data.tokenizer',
}

__all__ = [
    "BatchSampler", "ByteTokenizer", "DEFAULT_VAL_FRACTION", "Dataset", "Document", "FileTokenizer",
    "cache_root", "find_datasets", "get_source", "get_tokenizer", "list_datasets", "load_dataset_info", "prepare_dataset",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
