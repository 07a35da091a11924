"""What k3lab's model code does, for the warm record's key: its source without the prose.

The warm record (`k3lab.runner.runtime.kernel_cache`) is keyed by the model code because a change there may
call other kernels or shapes. The model code is every file that decides which kernels a trial
compiles and tunes (`MODEL_CODE_FILES`, under k3lab/): the model, the ops (k3lab's own Triton
kernels and the calls into FLA's), the optimizer (Muon's compiled steps) and the compile settings. Keyed by the files' bytes, a docstring edit too sent every fresh
GPU back to its warm-up, until the shipped archive was re-made on a GPU. The code text here is
the source with its comments, docstrings, blank lines and trailing spaces taken out; the rest,
indentation and line breaks included, is kept as written.

Why text and not `ast.dump`: the dump's fields change between Python versions (3.12 added
`type_params`), and the record's keys must come out the same on the GPU machine (Python 3.12)
and where the shipped record is checked (CI, Python 3.11). Comments come from `tokenize` and
docstrings from `ast` positions, which no recent version changed.

What it misses: a comment inside one of k3lab's own `@triton.jit` kernels is part of Triton's
cache key (the kernel's source), so such an edit recompiles that kernel once (seconds, no
autotuning) on a machine the record calls warm. torch.compile's graph caches do not key by
line numbers: a compiled model hits the same FX-graph and AOTAutograd entries after lines are
added to the model files' docstrings.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2]  # k3lab/
MODEL_CODE_FILES = ("model/*.py", "ops/**/*.py", "optim/*.py", "compiling.py")  # under PACKAGE
# model code no training step runs: parameter and FLOP counting, Hugging Face conversion, generation
NOT_IN_A_STEP = ("model/counting.py", "model/hf.py", "model/inference.py")


def model_code_files(root: Path = PACKAGE) -> list[Path]:
    """The model code's files under `root` that a training step runs, sorted by their path."""
    files = {path for pattern in MODEL_CODE_FILES for path in root.glob(pattern)}
    return sorted(path for path in files if path.relative_to(root).as_posix() not in NOT_IN_A_STEP)


def add_model_code(digest, root: Path = PACKAGE) -> None:
    """Each model code file's path under `root` and its code text, into `digest` (a hashlib object)."""
    for path in model_code_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + code_text(path.read_text()).encode())


def code_text(source: str) -> str:
    """`source` without comments, docstrings, blank lines and trailing whitespace."""
    lines = source.splitlines()
    for (start_row, start_col), (end_row, end_col) in sorted(prose_spans(source), reverse=True):
        first, last = lines[start_row - 1], lines[end_row - 1]
        lines[start_row - 1:end_row] = [first[:start_col] + last[end_col:]]
    return "\n".join(line.rstrip() for line in lines if line.strip())


def prose_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """((row, col), (end row, end col)) of every comment and docstring (rows from 1)."""
    comments = [(t.start, t.end) for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type == tokenize.COMMENT]
    docstrings = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                docstrings.append(((first.lineno, first.col_offset), (first.end_lineno, first.end_col_offset)))
    return comments + docstrings
