"""Line plots of predictions (matplotlib, imported on use: it is not a dependency)."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence


def plot_lines(series: Mapping[str, Sequence[tuple]], path: Path, title: str,
               xlabel: str = "nodes", ylabel: str = "predicted step time (ms)", log_x: bool = True) -> Path:
    """One line per ``series`` entry (label -> [(x, y), ...]), written to ``path``."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError(f"writing {path} needs matplotlib, which is not installed; "
                           "pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in series.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
