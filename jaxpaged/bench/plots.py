"""PNG plots of a run (matplotlib, Agg): throughput per system against the sweep axis, TTFT/ITL percentiles
against the sweep axis (the request rate in a serving sweep), and the KV utilization comparison.

The x axis is categorical (the swept values in order), so inf request rates and booleans plot too. A peer whose
result does not depend on the axis (an engine option) is drawn as a dashed horizontal line.
"""

import pathlib
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from jaxpaged.bench.results_writer import fmt  # noqa: E402

# Line style of an axis-independent reference line, per marker style of the plotted series.
_REFERENCE_STYLES = {"-o": "--", "--s": "-.", ":^": ":"}


def _series(rows: list[dict], x_axis: Optional[str]) -> dict[str, list[dict]]:
    """Rows grouped into lines: one per system and combination of the other axes' values."""
    lines: dict[str, list[dict]] = {}
    for row in rows:
        if row["status"] != "ok":
            continue
        others = {k: v for k, v in row["point"].items() if k != x_axis}
        label = row["system"] + ("" if not others else " " + ", ".join(f"{k.split('.', 1)[1]}={fmt(v)}"
                                                                        for k, v in others.items()))
        lines.setdefault(label, []).append(row)
    return lines


def _x_values(run: dict, x_axis: str) -> list:
    return list(run["config"]["sweep"][x_axis])


def _plot_metric(ax, run: dict, x_axis: Optional[str], metric: str, label_suffix: str = "", style: str = "-o"):
    """One line per series (same colour for a series in every panel); axis-independent peers as dashed lines."""
    if x_axis is None:
        rows = [r for r in run["rows"] if r["status"] == "ok" and r["metrics"].get(metric) is not None]
        ax.bar([r["system"] for r in rows], [r["metrics"][metric] for r in rows])
        ax.tick_params(axis="x", labelrotation=20)
        return
    xs = _x_values(run, x_axis)
    colors = plt.get_cmap("tab10")
    for color_index, (label, rows) in enumerate(_series(run["rows"], x_axis).items()):
        color = colors(color_index % 10)
        points = [(xs.index(r["point"][x_axis]), r["metrics"].get(metric)) for r in rows
                  if x_axis in r["point"] and r["point"][x_axis] in xs and r["metrics"].get(metric) is not None]
        if points:
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], style, color=color, label=label + label_suffix)
        elif rows and rows[0]["metrics"].get(metric) is not None:  # independent of the axis: a reference line
            parameter = x_axis.split(".", 1)[1]
            # A peer has its own precision: "(bfloat16)" on a dtype axis, never "(any dtype)".
            setting = rows[0]["metrics"].get("dtype", "float32") if parameter == "dtype" else "any " + parameter
            ax.axhline(rows[0]["metrics"][metric], linestyle=_REFERENCE_STYLES.get(style, "--"), color=color,
                       label=f"{label}{label_suffix} ({setting})")
    # A joint axis's value is a list: one line per parameter keeps neighbouring labels apart.
    ax.set_xticks(range(len(xs)), ["\n".join(fmt(v) for v in x) if isinstance(x, list) else fmt(x) for x in xs])
    ax.set_xlabel(x_axis)


def throughput_plot(run: dict, x_axis: Optional[str], path: pathlib.Path) -> pathlib.Path:
    """Output tokens/s of every system against the sweep axis."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _plot_metric(ax, run, x_axis, "output_tokens_per_s")
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{run['config_name']}: throughput")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_plot(run: dict, x_axis: Optional[str], path: pathlib.Path) -> pathlib.Path:
    """TTFT and ITL at p50/p90/p99 against the sweep axis (two panels, log scale)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, name in zip(axes, ("ttft", "itl")):
        for percentile, style in ((50, "-o"), (90, "--s"), (99, ":^")):
            if x_axis is None:
                continue
            _plot_metric(ax, run, x_axis, f"{name}_ms_p{percentile}", f" p{percentile}", style)
        if x_axis is None:
            _plot_metric(ax, run, None, f"{name}_ms_p50")
        ax.set_yscale("log")
        ax.set_ylabel(f"{name.upper()} ms")
        ax.set_title(f"{name.upper()} percentiles")
        ax.grid(alpha=0.3, which="both")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(f"{run['config_name']}: latency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def kv_plot(run: dict, path: pathlib.Path) -> Optional[pathlib.Path]:
    """Paged vs contiguous reservations: most concurrent requests and KV utilization, per sweep point."""
    rows = [r for r in run["rows"] if r["kind"] == "jaxpaged" and r["metrics"].get("kv_utilization_mean") is not None]
    if not rows:
        return None
    labels = [", ".join(f"{k.split('.', 1)[1]}={fmt(v)}" for k, v in r["point"].items()) or r["system"] for r in rows]
    systems = (("paged (jaxpaged)", "max_concurrent_requests", "kv_utilization_mean"),
               ("contiguous, max_model_len", "contiguous_max_model_len_max_concurrent",
                "contiguous_max_model_len_kv_utilization"),
               ("contiguous, prompt+max_tokens", "contiguous_request_max_concurrent",
                "contiguous_request_kv_utilization"))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(systems)
    for index, (name, concurrent_key, utilization_key) in enumerate(systems):
        xs = [i + (index - 1) * width for i in range(len(rows))]
        axes[0].bar(xs, [r["metrics"].get(concurrent_key) or 0 for r in rows], width, label=name)
        axes[1].bar(xs, [100 * (r["metrics"].get(utilization_key) or 0) for r in rows], width, label=name)
    for ax, ylabel in zip(axes, ("most concurrent requests", "KV utilization (% live tokens)")):
        ax.set_xticks(range(len(rows)), labels)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    axes[1].axhline(95, linestyle=":", color="gray")
    fig.suptitle(f"{run['config_name']}: KV cache at a fixed KV memory")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(run: dict, out_dir: pathlib.Path, x_axis: Optional[str]) -> list[pathlib.Path]:
    """Every plot that applies to the run; their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    name = run["config_name"]
    paths = [throughput_plot(run, x_axis, out_dir / f"{name}_throughput.png"),
             latency_plot(run, x_axis, out_dir / f"{name}_latency.png")]
    kv = kv_plot(run, out_dir / f"{name}_kv.png")
    return paths + ([kv] if kv else [])
