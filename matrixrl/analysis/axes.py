"""Which columns of a per-cell frame are axes: the five fixed ones, then the extra axes.

An extra axis (``grid:``'s dotted keys, e.g. ``train.lr``) is a column named by its
dotted key; no other column has a dot in its name. A cell the axis does not affect
has no value there (None).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pandas as pd

from matrixrl.config import AXES


def extra_axes(columns: Iterable) -> list[str]:
    return [str(c) for c in columns if "." in str(c)]


def axes_of(columns: Iterable) -> list[str]:
    """The axis columns among ``columns``: the fixed axes, then the extra ones in their order."""
    return [*AXES, *extra_axes(columns)]


def cells_frame(rows: Sequence[dict], columns: Sequence[str]) -> pd.DataFrame:
    """``rows`` (one dict per cell) as a frame whose extra axes keep their values as given
    (3, not 3.0 beside a None) and None where an axis leaves a cell alone."""
    frame = pd.DataFrame(list(rows), columns=list(columns))
    for axis in extra_axes(columns):
        frame[axis] = pd.Series([row.get(axis) for row in rows], index=frame.index, dtype=object)
    return frame


def grouped(frame: pd.DataFrame, keys: Sequence[str]):
    """``(values, rows)`` per combination of ``keys`` in order of first appearance, with each
    value as the cells have it (3 stays 3 beside a None, which pandas' own group keys make
    3.0 and NaN) and None for a missing one."""
    if frame.empty:
        return
    texts = [frame[key].map(repr) for key in keys]
    for _, rows in frame.groupby(texts, sort=False):
        yield tuple(_value(rows[key].iloc[0]) for key in keys), rows


def _value(value):
    if value is None or (isinstance(value, float) and value != value):
        return None
    return value.item() if hasattr(value, "item") else value
