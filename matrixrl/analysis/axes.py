"""Which columns of a per-cell frame are axes: the five fixed ones, then the extra axes.

An extra axis (``grid:``'s dotted keys, e.g. ``train.lr``) is a column named by its
dotted key; no other column has a dot in its name. A cell the axis does not affect
has no value there (None).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

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


def grouped_lists(frame: pd.DataFrame, keys: Sequence[str], columns: Sequence[str]) -> Iterator[tuple[tuple, dict[str, list]]]:
    """:func:`grouped` as plain lists: ``(values, {column: its values in the group's rows})`` per
    combination of ``keys``, in the same order and with the same values. For tables of
    many small groups (seeds, comparisons), where a DataFrame per group costs a millisecond."""
    if frame.empty:
        return
    keyed = [frame[key].tolist() for key in keys]
    wanted = {column: frame[column].tolist() for column in columns}
    groups: dict[tuple, list[int]] = {}
    for position, texts in enumerate(zip(*(map(repr, values) for values in keyed))):
        groups.setdefault(texts, []).append(position)
    for positions in groups.values():
        first = positions[0]
        yield (
            tuple(_value(values[first]) for values in keyed),
            {column: [values[i] for i in positions] for column, values in wanted.items()},
        )


def typed(frame: pd.DataFrame, dtypes: dict[str, str]) -> pd.DataFrame:
    """``frame.astype(dtypes)``, converting those columns only: ``DataFrame.astype`` rebuilds
    every column, which costs more than the rest of building a table."""
    out = frame.copy(deep=False)
    for column, dtype in dtypes.items():
        if out[column].dtype != dtype:
            out[column] = out[column].astype(dtype)
    return out
