"""matplotlib set up for files: what every report plot opens and saves through."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (sweeps run without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
