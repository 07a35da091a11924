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
    """Save and close; labels, titles and legends outside the axes stay inside the file."""
    if fig.get_layout_engine() is None:  # a figure made with layout="constrained" keeps its own
        fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
