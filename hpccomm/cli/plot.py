"""``bench --plot``: latency and bus bandwidth against size, one line per contender.

The only module that imports matplotlib, and only when a plot is asked for:
it is an optional extra (``pip install 'hpccomm[plot]'``).
"""

from __future__ import annotations

from typing import Any

_COLOURS = {"hpccomm": "tab:blue", "gloo": "tab:orange", "mpi4py": "tab:green"}
_STYLES = {"in-place": "-", "out-of-place": "--"}


def require() -> None:
    """Fail with the install hint now, before a sweep, if matplotlib is missing.

    Raises:
        SystemExit: matplotlib cannot be imported.
    """
    _pyplot()


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("hpccomm bench --plot needs matplotlib: pip install 'hpccomm[plot]'") from None
    return plt


def plot_sweep(rows: list[dict[str, Any]], path: str, title: str) -> None:
    """Draw one row of two panels per collective: time (us) and busbw (GB/s) against size, log-log.

    Args:
        rows: the bench's JSON rows (collective, placement, contender, bytes, time_us, busbw_GBps).
        path: the PNG file to write.
        title: the figure's title.
    """
    plt = _pyplot()
    collectives = list(dict.fromkeys(row["collective"] for row in rows))
    if not collectives:
        return
    fig, axes = plt.subplots(len(collectives), 2, figsize=(11, 3.0 * len(collectives) + 0.6), squeeze=False)
    for (time_axis, bw_axis), collective in zip(axes, collectives):
        lines: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for row in rows:
            if row["collective"] == collective and row["time_us"]:
                lines.setdefault((row["contender"], row["placement"]), []).append(row)
        for (contender, placement), points in lines.items():
            points.sort(key=lambda r: r["bytes"])
            style = {"color": _COLOURS.get(contender), "linestyle": _STYLES.get(placement, ":"), "marker": "."}
            label = f"{contender} {placement}"
            time_axis.plot([p["bytes"] for p in points], [p["time_us"] for p in points], label=label, **style)
            positive = [p for p in points if p["busbw_GBps"]]
            bw_axis.plot([p["bytes"] for p in positive], [p["busbw_GBps"] for p in positive], label=label, **style)
        for axis, unit in ((time_axis, "time (us)"), (bw_axis, "busbw (GB/s)")):
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
            axis.set_xlabel("size (bytes)")
            axis.set_ylabel(unit)
            axis.set_title(collective, fontsize=10)
            axis.grid(True, which="major", alpha=0.3)
        time_axis.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))  # room for the title
    fig.savefig(path, dpi=100)
    plt.close(fig)
