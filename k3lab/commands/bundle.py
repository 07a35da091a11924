"""`k3lab bundle OUT_DIR`: an offline install bundle for a machine with no package index (`k3lab.bundle`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from k3lab.bundle.build import run


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bundle", help="build an offline install bundle (wheels + install.sh) for a machine with no package index",
        description="Build OUT_DIR/wheels, OUT_DIR/install.sh and OUT_DIR/manifest.json: k3lab and every "
                    "dependency the target lacks, as wheels for the target's Python and platform.")
    parser.add_argument("out", metavar="OUT_DIR", help="the bundle folder (created; an old bundle there is replaced)")
    parser.add_argument("--python-version", default="%d.%d" % sys.version_info[:2],
                        help="the target's Python, e.g. 3.12 (default: this one)")
    parser.add_argument("--platform", action="append", default=[], metavar="TAG",
                        help="a pip platform tag the target accepts, e.g. manylinux_2_28_x86_64 (repeatable; "
                             "default: this machine's)")
    parser.add_argument("--exclude", action="append", default=[], metavar="NAMES",
                        help="packages the target already has, comma-separated, optionally pinned "
                             "(torch==2.11.0,numpy); @FILE reads one a line (repeatable)")
    parser.add_argument("-c", "--constraint", action="append", default=[], metavar="FILE",
                        help="pin the bundled packages' versions to a pip constraints file (repeatable), e.g. "
                             "the checkout's constraints.txt, the versions every install of k3lab shares")
    parser.add_argument("--extras", default="gpu", help="k3lab's extras to bundle, comma-separated (default: gpu; "
                                                        "'' for none)")
    parser.add_argument("--with", dest="with_requirements", action="append", default=[], metavar="REQS",
                        help="more requirements to bundle, comma-separated (e.g. pytest,hypothesis)")
    parser.add_argument("--max-size", default="64MiB", help="fail when the bundle is larger (default: 64MiB; "
                                                            "'none' for no limit)")
    parser.add_argument("--part-size", metavar="SIZE",
                        help="split the bundle into OUT_DIR/part-1, part-2, ... of at most SIZE each (e.g. 30MiB), "
                             "for a transfer that caps its size; install them in order into one target")
    parser.add_argument("--without-project", action="store_true",
                        help="leave k3lab's own wheel out (its dependencies stay in), for a target that runs k3lab "
                             "from a checkout on PYTHONPATH; install.sh then does not import it")
    parser.add_argument("--full-mlflow", action="store_true",
                        help="bundle the full mlflow (with its UI) instead of mlflow-skinny + sqlalchemy + alembic")
    parser.add_argument("--no-slim", action="store_true", help="bundle ray's wheel as published (not slimmed: larger)")
    parser.add_argument("--no-strip", action="store_true",
                        help="keep the symbol tables of the slimmed wheels' ELF files (stripped by default, "
                             "where binutils' strip is on PATH)")
    parser.add_argument("--spare-max-size", default="1MiB",
                        help="bundle a spare wheel of an excluded package whose target version is unknown when the "
                             "wheel is at most this big; install.sh uses it only if the target's is too old "
                             "(default: 1MiB; 0 for no spares)")
    parser.add_argument("--project", type=Path, default=None, help="k3lab's source tree (default: this one's)")
    parser.add_argument("--no-cache", action="store_true", help="do not reuse or store slimmed wheels in "
                                                                 "~/.cache/k3lab/bundle")
    parser.set_defaults(func=run)
