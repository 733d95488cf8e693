"""The host-path benchmark's output: the console table, the markdown table, a stacked-bar plot of the phases,
and the issue's targets checked against the run."""

import pathlib
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

COLUMNS = ("schedule_s", "prepare_s", "launch_s", "readback_s", "process_s", "deliver_s", "host_s", "exposed_s",
           "device_wait_s")
"""Shown per case: the host phases in step order (process_s includes the scheduler's update), the hand-over to
the streams (server cases), their total, what the device waited for, and the device wait itself."""

STACKED = ("schedule_s", "prepare_s", "launch_s", "readback_s", "process_s", "deliver_s")


def console_header() -> str:
    return f"{'median (p90) ms per step':<40}" + "".join(f"{name[:-2]:>18}" for name in COLUMNS)


def console_row(label: str, summary: dict[str, tuple[float, float]]) -> str:
    cells = [f"{summary[name][0]:>9.3f} ({summary[name][1]:>5.2f})" if name in summary else f"{'-':>18}"
             for name in COLUMNS]
    return f"{label:<40}" + "".join(cells)


def markdown_table(results: Sequence[dict[str, Any]]) -> str:
    """Median ms per step of each phase, and the host total's p90, one row per case."""
    lines = ["| case | " + " | ".join(name[:-2] for name in COLUMNS) + " | host p90 |",
             "|---|" + "---|" * (len(COLUMNS) + 1)]
    for result in results:
        summary = result["summary_ms"]
        cells = [f"{summary[name][0]:.2f}" if name in summary else "-" for name in COLUMNS]
        lines.append(f"| {result['label']} | " + " | ".join(cells) + f" | {summary['host_s'][1]:.2f} |")
    return "\n".join(lines) + "\n"


def plot(results: Sequence[dict[str, Any]], path: pathlib.Path, title: str) -> None:
    """Stacked bars of the median host phases per case, with the device's step time as a line."""
    labels = [result["label"] for result in results]
    figure, axes = plt.subplots(figsize=(max(6.0, 0.6 * len(labels) + 2), 4.5))
    bottoms = [0.0] * len(labels)
    for name in STACKED:
        heights = [result["summary_ms"].get(name, (0.0, 0.0))[0] for result in results]
        axes.bar(labels, heights, bottom=bottoms, label=name[:-2])
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    device_ms = results[0]["device_step_ms"] if results else 0.0
    axes.axhline(device_ms, color="black", linestyle="--", linewidth=1, label=f"device step ({device_ms:g} ms)")
    axes.set_ylabel("host ms per step (median)")
    axes.set_title(title)
    axes.tick_params(axis="x", labelrotation=60)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def check_targets(results: Sequence[dict[str, Any]], targets: dict[str, float]) -> list[str]:
    """PASS / FAIL lines for the targets the config names (decode_N: the sync host median at N requests;
    exposed_async_N: the async exposed median; json_N_vs_decode: the ratio of the 10%-JSON host median to the
    plain one, at most 2)."""
    by_label = {result["label"]: result["summary_ms"] for result in results}
    lines = []
    for name, limit in targets.items():
        kind, _, size = name.rpartition("_")
        if kind == "decode":
            value = by_label.get(f"sync {size}", {}).get("host_s", (None,))[0]
        elif kind == "exposed_async":
            value = by_label.get(f"async {size}", {}).get("exposed_s", (None,))[0]
        else:
            raise ValueError(f"targets: unknown target {name!r} (decode_N or exposed_async_N)")
        if value is None:
            lines.append(f"SKIP {name}: the run has no such case")
            continue
        lines.append(f"{'PASS' if value <= limit else 'FAIL'} {name}: {value:.3f} ms (target <= {limit:g} ms)")
    for size in sorted({label.split()[1] for label in by_label if label.startswith("sync ")}):
        plain, constrained = by_label.get(f"sync {size}"), by_label.get(f"sync {size} json 0.1")
        if plain and constrained:
            ratio = constrained["host_s"][0] / plain["host_s"][0]
            lines.append(f"{'PASS' if ratio <= 2 else 'FAIL'} json_{size}_vs_decode: {ratio:.2f}x (target <= 2x)")
    return lines
