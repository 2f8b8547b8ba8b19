"""Which columns of a per-cell frame are axes: the five fixed ones, then the extra axes.

An extra axis is None where it leaves a cell alone.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
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


def grouped_rows(rows: Sequence[dict], keys: Sequence[str]) -> Iterator[tuple[tuple, list[dict]]]:
    """:func:`grouped` over plain rows (a :class:`PerCell`'s): ``(values, rows)`` per combination of
    ``keys``, in the same order and with the same values. For tables of many small groups (seeds,
    comparisons), where a DataFrame per group costs a millisecond."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(repr(row[key]) for key in keys), []).append(row)
    for group in groups.values():
        yield tuple(_value(group[0][key]) for key in keys), group


def typed(frame: pd.DataFrame, dtypes: dict[str, str]) -> pd.DataFrame:
    """``frame.astype(dtypes)``, converting those columns only: ``DataFrame.astype`` rebuilds
    every column, which costs more than the rest of building a table."""
    out = frame.copy(deep=False)
    for column, dtype in dtypes.items():
        if out[column].dtype != dtype:
            out[column] = out[column].astype(dtype)
    return out


def missing(value) -> bool:
    """Whether one value of a per-cell column is missing (None, NaN, NA), as ``notna`` tells."""
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


@dataclass(frozen=True)
class PerCell:
    """The per-cell frame (``analysis.cell_record.records_frame``) as plain rows: what every table is computed from.

    ``rows``: one dict per cell; ``dtypes``: every column's dtype in that frame. A table builds
    its frame once, column by column (:meth:`frame`), pandas' cost being per operation.
    """

    rows: list[dict]
    dtypes: dict[str, Any]

    @property
    def columns(self) -> list[str]:
        return list(self.dtypes)

    @classmethod
    def of(cls, per_cell: PerCell | pd.DataFrame) -> PerCell:
        """``per_cell`` itself, or the rows of a per-cell DataFrame."""
        if isinstance(per_cell, PerCell):
            return per_cell
        columns = list(per_cell.columns)
        rows = [dict(zip(columns, values)) for values in zip(*(per_cell[c].tolist() for c in columns))]
        return cls(rows, dict(per_cell.dtypes.items()))

    def where(self, keep) -> PerCell:
        """The rows for which ``keep(row)`` holds."""
        return PerCell([row for row in self.rows if keep(row)], self.dtypes)

    def frame(self, columns: Sequence[str] | None = None, dtypes: Mapping[str, str] = {}) -> pd.DataFrame:
        """These rows as a DataFrame of ``columns`` (all), each column of its dtype (or of ``dtypes``')."""
        data = {}
        for column in self.columns if columns is None else columns:
            values = [row.get(column) for row in self.rows]
            dtype = _dtype(dtypes.get(column, self.dtypes[column]))
            if dtype == object:
                data[column] = pd.Series(values, dtype=object)
            elif isinstance(dtype, np.dtype):
                data[column] = np.array(values, dtype=dtype)
            else:
                data[column] = pd.array(values, dtype=dtype)
        return pd.DataFrame(data, index=pd.RangeIndex(len(self.rows)), columns=list(data), copy=False)


@functools.cache
def _dtype(name) -> Any:
    """``pandas_dtype(name)``, once per name (it costs more than building a column of a few cells)."""
    return pd.api.types.pandas_dtype(name)
