"""Targets a sweep must show, checked against its result rows. A miss is reported with its figure, never hidden.

A selection is a mapping: "system" matches a row's system name or kind ("hf_batched" matches
"hf_batched(bs=16)"); every other key is a sweep parameter the row's point must have at that value, either an
axis of its own ("engine.block_size") or one parameter of a joint axis ("engine.enable_prefix_caching" of
"engine.(enable_prefix_caching, prefix_caching_granularity)", or of one across sections); "dtype" matches the
precision a row ran in. A ratio target may count only its best numerator row (numerator_best) and pair rows that
agree on some keys (pair_by), e.g. jaxpaged's faster dtype against the peers in that dtype.
"""

from typing import Any, Optional

from jaxpaged.bench.bench_config import TargetConfig, axis_parameters
from jaxpaged.checks import is_number

_ABSENT = object()


def _point_value(point: dict, key: str) -> Any:
    """The value of sweep parameter `key` at a row's point, looking inside joint axes; _ABSENT if none sets it."""
    if key in point:
        return point[key]
    section, _, name = key.partition(".")
    wanted = (section, name)
    for axis, values in point.items():
        if "(" in axis:
            parameters = axis_parameters(axis)
            if wanted in parameters:
                return values[parameters.index(wanted)]
    return _ABSENT


def _row_value(row: dict, key: str) -> Any:
    if key == "dtype":  # the precision a row ran in (jaxpaged's engine dtype, a peer's dtype option)
        return row.get("metrics", {}).get("dtype", "float32")
    return _point_value(row["point"], key)


def row_matches(row: dict, selection: dict) -> bool:
    """Whether a result row is in the selection."""
    for key, wanted in selection.items():
        if key == "system":
            if wanted not in (row["system"], row["kind"]):
                return False
        elif _row_value(row, key) != wanted:
            return False
    return True


def _metric(row: dict, metric: str) -> Optional[float]:
    value = row.get("metrics", {}).get(metric)
    return float(value) if is_number(value) else None


def _within(value: float, target: TargetConfig) -> bool:
    return (target.min is None or value >= target.min) and (target.max is None or value <= target.max)


def _bound_text(target: TargetConfig) -> str:
    parts = []
    if target.min is not None:
        parts.append(f">= {target.min:g}")
    if target.max is not None:
        parts.append(f"<= {target.max:g}")
    return " and ".join(parts)


def _worst(values: list[float], target: TargetConfig) -> float:
    # With a lower bound the smallest value is the least favourable; with only an upper bound, the largest.
    return min(values) if target.min is not None else max(values)


def evaluate_target(target: TargetConfig, rows: list[dict]) -> dict:
    """{name, metric, value, bound, passed (None: not measured), detail}."""
    ok_rows = [row for row in rows if row.get("status") == "ok"]
    if target.is_ratio:
        assert target.numerator is not None and target.denominator is not None  # is_ratio; checked together
        ratios = []
        tops = [(r, value) for r in ok_rows if row_matches(r, target.numerator)
                and (value := _metric(r, target.metric)) is not None]
        if target.numerator_best and tops:
            tops = [max(tops, key=lambda top_and_value: top_and_value[1])]
        for top, top_value in tops:
            for bottom in (r for r in ok_rows if row_matches(r, target.denominator)):
                bottom_value = _metric(bottom, target.metric)
                paired = all(_row_value(top, key) == _row_value(bottom, key) for key in target.pair_by)
                if top["workload_key"] == bottom["workload_key"] and paired and bottom_value:
                    ratios.append((top_value / bottom_value, top, bottom))
        values = [ratio for ratio, _, _ in ratios]
        detail = "ratio of " + target.metric
        if ratios:
            worst = _worst(values, target)
            _, top, bottom = next(item for item in ratios if item[0] == worst)
            detail = (f"{target.metric}: {_metric(top, target.metric):.4g} ({top['system']} {top['point']}) / "
                      f"{_metric(bottom, target.metric):.4g} ({bottom['system']} {bottom['point']})")
    else:
        values = [v for v in (_metric(r, target.metric) for r in ok_rows if row_matches(r, target.select))
                  if v is not None]
        detail = f"{target.metric} over {len(values)} row(s)"
    if not values:
        return {"name": target.name, "metric": target.metric, "value": None, "bound": _bound_text(target),
                "passed": None, "detail": "not measured (no matching rows)"}
    value = _worst(values, target)
    return {"name": target.name, "metric": target.metric, "value": value, "bound": _bound_text(target),
            "passed": all(_within(v, target) for v in values), "detail": detail}


def evaluate_targets(targets, rows: list[dict]) -> list[dict]:
    """Every target of the config, in order."""
    return [evaluate_target(target, rows) for target in targets]
