"""The paired bench's picture: accepted length against tokens since the image, one line per column with
its 95% band, one panel per draft and image size (matplotlib: the ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path

from ... import command
from .paired import TRAINED

# one colour per column, the same in every panel
COLOURS = {
    "twin semantics": "tab:blue",
    "definition": "tab:red",
    "as-trained": "tab:purple",
    "b11434 twin": "tab:cyan",
    "zero-fill": "tab:gray",
    "text only": "tab:green",
}


def plot_since_image(runs: dict[str, dict], target: str, path: Path, asked_by: str = "bench --plot") -> Path:
    """Write the picture of ``target``'s runs (``"target/trained_on/rows"`` -> measure_paired's result);
    ``asked_by`` is the command a missing matplotlib is reported against."""
    command.require("matplotlib", extra="plot", command=asked_by)
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a build machine
    import matplotlib.pyplot as plt

    keys = [k for k in runs if k.startswith(f"{target}/")]
    drafts = sorted({k.split("/")[1] for k in keys})
    sizes = sorted({int(k.split("/")[2]) for k in keys})
    fig, axes = plt.subplots(
        len(drafts), len(sizes), figsize=(4 * len(sizes), 3 * len(drafts)), sharex=True, sharey=True, squeeze=False
    )
    for i, draft in enumerate(drafts):
        for j, rows in enumerate(sizes):
            ax = axes[i][j]
            run = runs.get(f"{target}/{draft}/{rows}")
            ax.set_title(f"{TRAINED[draft]} draft, {rows}-row image", fontsize=9)
            if run is None:
                continue
            for name, entry in run["table"].items():
                curve = entry.get("since_image") or []
                if not curve:
                    continue
                x = [p["index"] for p in curve]
                ax.plot(x, [p["mean_accepted"] for p in curve], label=name, color=COLOURS.get(name), lw=1.4)
                ax.fill_between(
                    x,
                    [p["ci95"][0] for p in curve],
                    [p["ci95"][1] for p in curve],
                    color=COLOURS.get(name),
                    alpha=0.15,
                    lw=0,
                )
            if i == len(drafts) - 1:
                ax.set_xlabel("tokens since the image")
            if j == 0:
                ax.set_ylabel("accepted (of n_max)")
    axes[0][-1].legend(fontsize=7, loc="upper right")
    fig.suptitle(f"Paired acceptance after an image, the {target} target", fontsize=10)
    fig.supxlabel(
        "drawn (a line the same as another lies under it): "
        + ", ".join(sorted({n for r in runs.values() for n in r["table"]})),
        fontsize=7,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg" if path.suffix == ".svg" else None)
    plt.close(fig)
    return path
