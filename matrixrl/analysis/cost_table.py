"""The cost table: what the jobs of a study took, per kind of job and scale (``report --table cost``)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

COLUMNS = [  # the scale first, as every table puts its axes (report.formats.row_keys)
    "scale", "rule", "jobs", "seconds_total", "seconds_mean", "seconds_max", "peak_rss_gb", "peak_gpu_gb",
    "tokens", "tokens_per_s", "device",
]  # fmt: skip
GB = 1e9


def cost_table(costs: pd.DataFrame, kinds: Sequence[str] = ()) -> pd.DataFrame:
    """One row per (rule, scale) of ``costs`` (one row per job: ``rule, scale, seconds, device,
    peak_rss_bytes, peak_gpu_bytes, tokens``): how many jobs, their total, mean and longest
    wall time, the largest peak memory (process RSS; torch's on a GPU), tokens generated and
    tokens per second of the jobs' time, and the devices they ran on. Rows in the order of
    ``kinds`` (the job graph's), then by scale as first seen."""
    if costs.empty:
        return pd.DataFrame(columns=COLUMNS)
    rows = []
    for (rule, scale), group in costs.groupby(["rule", "scale"], sort=False):
        seconds = group["seconds"].astype(float)
        gpu = group["peak_gpu_bytes"].dropna()
        tokens = int(group["tokens"].sum())
        rows.append({
            "rule": rule, "scale": scale, "jobs": len(group), "seconds_total": float(seconds.sum()),
            "seconds_mean": float(seconds.mean()), "seconds_max": float(seconds.max()),
            "peak_rss_gb": float(group["peak_rss_bytes"].max()) / GB,
            "peak_gpu_gb": float(gpu.max()) / GB if len(gpu) else None, "tokens": tokens,
            "tokens_per_s": tokens / float(seconds.sum()) if tokens and seconds.sum() > 0 else None,
            "device": ", ".join(sorted(set(group["device"]))),
        })  # fmt: skip
    table = pd.DataFrame(rows, columns=COLUMNS)
    order = {rule: n for n, rule in enumerate(kinds)}
    table["_order"] = table["rule"].map(lambda rule: order.get(rule, len(order)))
    return table.sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)
