"""`k3lab data prepare SOURCE` and `k3lab data info [SOURCE]`."""

from __future__ import annotations

import argparse

from typing import TYPE_CHECKING

from k3lab.data.bpe import MAX_VOCAB, MIN_VOCAB
from k3lab.data.split import DEFAULT_VAL_FRACTION, SPLITS
from k3lab.errors import UserError
from k3lab.hints import command

if TYPE_CHECKING:  # imported where used: `k3lab --help` registers these commands without numpy or pyarrow
    from rich.table import Table

    from k3lab.data.dataset import Dataset

SOURCE_HELP = "'stdlib' (default, offline), 'stdlib+tests', 'packages' (every installed package's source and docs, offline), a .txt/.jsonl/.parquet file or directory, or hf:NAME[:CONFIG][@SPLIT]"


def register(subparsers: argparse._SubParsersAction) -> None:
    data = subparsers.add_parser("data", help="prepare and inspect tokenized datasets")
    commands = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")

    prepare = commands.add_parser("prepare", help="tokenize a source into cached Arrow shards")
    prepare.add_argument("source", nargs="?", default="stdlib", help=SOURCE_HELP)
    _common(prepare)
    prepare.add_argument("--no-progress", action="store_true", help="no progress bar")
    prepare.set_defaults(func=run_prepare)

    info = commands.add_parser("info", help="show a prepared dataset, or all of them without SOURCE")
    info.add_argument("source", nargs="?", default=None,
                      help="a source as for prepare (default: list every prepared dataset)")
    _common(info, val_default=None)
    info.set_defaults(func=run_info)


def _common(parser: argparse.ArgumentParser, val_default: float | None = DEFAULT_VAL_FRACTION) -> None:
    parser.add_argument("--tokenizer", default="byte",
                        help="'byte' (default), tokenizer:PATH/tokenizer.json, or bpe:VOCAB: a byte-level BPE of "
                             f"VOCAB ids ({MIN_VOCAB} to {MAX_VOCAB:,}) trained on the source's training split")
    parser.add_argument("--cache-dir", default=None, help="cache root (default $K3LAB_DATA_DIR or ~/.cache/k3lab/data)")
    parser.add_argument("--val-fraction", type=float, default=val_default,
                        help="share of documents held out for validation "
                             f"(default {val_default if val_default is not None else 'any'})")


def run_prepare(args: argparse.Namespace) -> int:
    from rich.console import Console

    from k3lab.data.prepare import prepare_dataset

    ds = prepare_dataset(args.source, args.tokenizer, args.cache_dir, args.val_fraction,
                         progress=not args.no_progress)
    console = Console()
    console.print("already prepared" if ds.cached else "prepared", f"[bold]{ds.path}[/bold]")
    console.print(dataset_table(ds))
    return 0


def run_info(args: argparse.Namespace) -> int:
    from rich.console import Console

    from k3lab.data.prepare import check_options, find_datasets, list_datasets

    check_options(args.tokenizer, args.val_fraction)  # as prepare does, with or without a source
    if args.source is None:
        found = list_datasets(args.cache_dir)
    else:
        found = find_datasets(args.source, args.tokenizer, args.cache_dir, args.val_fraction)
        if not found:
            raise UserError(f"source '{args.source}' with tokenizer '{args.tokenizer}' is not prepared"
                            f"{'' if args.val_fraction is None else f' with val fraction {args.val_fraction}'}; "
                            f"run `{prepare_command(args)}`")
    console = Console()
    if not found:
        console.print("no prepared datasets")
    for ds in found:
        console.print(dataset_table(ds))
    return 0


def dataset_table(ds: Dataset) -> Table:
    """Per split: documents, tokens, UTF-8 bytes, bytes/token, shards; source facts in the caption."""
    from rich.table import Table

    m = ds.manifest
    table = Table(title=f"{m['source']}  [dim]({m['tokenizer']}, vocab {m['vocab_size']}, {m['dtype']})[/dim]",
                  caption=f"fingerprint {m['fingerprint'][:16]}\npath {ds.path}", title_justify="left",
                  caption_justify="left")
    for column in ("split", "documents", "tokens", "bytes", "bytes/token", "shards"):
        table.add_column(column, justify="left" if column == "split" else "right")
    for split in SPLITS:
        s = m["splits"][split]
        table.add_row(split, f"{s['documents']:,}", f"{s['tokens']:,}", f"{s['bytes']:,}",
                      f"{ds.bytes_per_token(split):.3f}", str(len(s["shards"])))
    return table


def prepare_command(args: argparse.Namespace) -> str:
    """`k3lab data prepare` of the dataset `info` looked for, in the same cache (`k3lab.hints`)."""
    return command("data", "prepare", args.source, tokenizer=None if args.tokenizer == "byte" else args.tokenizer,
                   cache_dir=args.cache_dir, val_fraction=args.val_fraction)
