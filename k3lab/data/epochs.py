"""How many tokens a corpus' training split holds, for `data.epochs` and the sweep plan's note on
trials that would repeat data.

`train_split_tokens(source, tokenizer)` is exact when the dataset is prepared in the token cache
(its manifest), else an estimate for the byte tokenizer (the source files' bytes, less the
validation share, plus one end-of-document token per file), else None (not known before
tokenizing).
"""

from __future__ import annotations

from k3lab.errors import UserError


def train_split_tokens(source: str, tokenizer: str = "byte", val_fraction: float | None = None,
                       cache_dir=None) -> tuple[int, bool] | None:
    """(tokens in the training split, exact?) or None when not known."""
    from k3lab.data.prepare import DEFAULT_VAL_FRACTION, find_datasets
    from k3lab.data.sources import get_source

    val_fraction = DEFAULT_VAL_FRACTION if val_fraction is None else val_fraction
    try:
        prepared = find_datasets(source, tokenizer, cache_dir, val_fraction)
        if prepared:
            return int(prepared[0].manifest["splits"]["train"]["tokens"]), True
        if tokenizer != "byte" or source.startswith("hf:"):
            return None
        src = get_source(source)
        files = src.files()
        if hasattr(src, "total_bytes"):
            size = src.total_bytes()
        else:
            size = sum(path.stat().st_size for path in files)
        return int((size + len(files)) * (1 - val_fraction)), False
    except (UserError, OSError):
        return None


def epochs(tokens_trained: int, train_tokens: int) -> float:
    """Passes over the training split that `tokens_trained` tokens make."""
    return tokens_trained / train_tokens if train_tokens else float("inf")
