"""`matrixrl report --html`: one self-contained page, opened in a real headless Chromium.

The browser must load it with no console error and no request beyond the file,
decode every image, and show tables holding the numbers of `--format json`.
The checker itself is tested on pages broken on purpose.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from browser import chromium, inspect_page
from PIL import Image
from test_cli_errors import assert_user_error
from test_plots import CLIFF_CELL, ONLY, png_size, study  # noqa: F401  (study is a fixture)

from conftest import run_cli
from matrixrl.report import TABLE_NAMES
from matrixrl.report.formats import cell_text, to_json
from matrixrl.report.html import CSP, TableSection, report_page, table_html

DATA_URI = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def embedded_pngs(page: Path) -> list[bytes]:
    return [base64.b64decode(data) for data in DATA_URI.findall(page.read_text())]


# --- the page in a browser -------------------------------------------------------------------


def test_report_html_in_a_headless_browser(study, tmp_path: Path) -> None:
    executable = chromium()
    _, experiment = study
    page = tmp_path / "out" / "report.html"  # its folder does not exist yet
    plots_dir = tmp_path / "plots"
    result = run_cli("report", "-c", experiment, *ONLY, "--html", page, "--plots", plots_dir)
    assert result.exit_code == 0, result.output
    plot_names = ["curves-arith", f"diagnostics-{CLIFF_CELL}"]  # curves, then the one cell with a cliff
    assert result.stdout.splitlines() == [str(plots_dir / f"{n}.png") for n in plot_names] + [str(page)]
    assert sorted(p.name for p in page.parent.iterdir()) == ["report.html"]  # no temporary file left

    seen = inspect_page(page, executable)
    assert seen.console_errors == []
    assert seen.requests == []
    assert seen.title == "matrixrl report"
    assert [img["alt"] for img in seen.images] == plot_names
    assert seen.broken_images == []
    for img in seen.images:
        assert (img["width"], img["height"]) == png_size(plots_dir / f"{img['alt']}.png")
    # the very bytes of the PNG files, each a complete image (a truncated PNG still "decodes" in a browser)
    assert embedded_pngs(page) == [(plots_dir / f"{n}.png").read_bytes() for n in plot_names]
    for png in embedded_pngs(page):
        Image.open(io.BytesIO(png)).load()

    assert sorted([*seen.tables, *seen.empty_tables]) == sorted(TABLE_NAMES)
    for name in TABLE_NAMES:
        printed = run_cli("report", "-c", experiment, *ONLY, "--table", name, "--format", "json")
        if printed.exit_code != 0:  # a table without rows for this grid: the page says so instead
            assert name in seen.empty_tables, (name, printed.output)
            continue
        records = json.loads(printed.stdout)
        table = seen.tables[name]
        assert table["columns"] == table["headers"] == list(records[0]), name
        assert len(table["rows"]) == len(records), name
        for row, record in zip(table["rows"], records):
            assert [json.loads(c["value"]) for c in row] == list(record.values()), name
            assert [c["text"] for c in row] == [cell_text(v) for v in record.values()], name
    assert {"summary", "seeds", "compare", "diagnostics", "mechanism"} <= set(seen.tables)  # this study fills them all


def test_the_browser_check_catches_broken_images_errors_and_requests(study, tmp_path: Path) -> None:
    """The same page, broken three ways, must fail each check the test above relies on."""
    executable = chromium()
    _, experiment = study
    page = tmp_path / "report.html"
    assert run_cli("report", "-c", experiment, *ONLY, "--html", page).exit_code == 0
    text = page.read_text()
    first = DATA_URI.search(text)
    garbage = base64.b64encode(b"this is not a PNG" * 8).decode()
    broken = text[: first.start(1)] + garbage + text[first.end(1) :]
    # an image from elsewhere: the page's Content-Security-Policy blocks it, and says so on the console
    broken = broken.replace("</body>", '<img alt="remote" src="https://example.invalid/plot.png"></body>')
    page.write_text(broken)
    seen = inspect_page(page, executable)
    assert seen.broken_images == ["curves-arith", "remote"]
    assert seen.requests == ["https://example.invalid/plot.png"]
    assert len(seen.console_errors) == 1 and "Content Security Policy" in seen.console_errors[0]

    # an uncaught error and a console.error on a page without the policy
    scripted = tmp_path / "scripted.html"
    scripted.write_text('<!DOCTYPE html><html><body><script>console.error("boom"); null.x;</script></body></html>')
    seen = inspect_page(scripted, executable)
    assert seen.console_errors[0] == "boom"
    assert seen.console_errors[1].startswith("uncaught: ") and len(seen.console_errors) == 2


# --- the page's text, without a browser ------------------------------------------------------


def test_table_cells_carry_the_json_value_and_show_the_reading_text() -> None:
    frame = pd.DataFrame(
        {
            "workflow": ["voting", "a<b&c"],
            "peak": [0.1 + 0.2, float("nan")],
            "cliff_onset": pd.array([30, None], dtype="Int64"),
            "cliff": [True, False],
        }
    )
    markup = table_html(TableSection("summary", "per-cell summary", frame))
    records = json.loads(to_json(frame))
    values = [json.loads(html.unescape(v)) for v in re.findall(r'data-value="([^"]*)"', markup)]
    assert values == [v for record in records for v in record.values()]
    assert values[1] == 0.30000000000000004  # full precision, as --format json prints it
    texts = re.findall(r"<td[^>]*>([^<]*)</td>", markup)
    assert texts == ["voting", "0.300", "30", "yes", "a&lt;b&amp;c", "—", "—", "no"]
    assert re.findall(r'<th data-column="([^"]*)"( class="num")?>', markup) == [
        ("workflow", ""), ("peak", ' class="num"'), ("cliff_onset", ' class="num"'), ("cliff", "")]


def test_an_empty_table_is_a_note_and_the_page_loads_nothing_from_elsewhere() -> None:
    empty = TableSection("compare", "comparisons", pd.DataFrame(columns=["workflow", "peak"]), empty="No rows: nothing to compare.")
    page = report_page("matrixrl report", "meta", [empty], [])
    assert '<p class="empty" data-table="compare">No rows: nothing to compare.</p>' in page
    assert "<table" not in page
    assert f'<meta http-equiv="Content-Security-Policy" content="{CSP.replace(chr(39), "&#x27;")}">' in page
    assert not re.search(r'(src|href)="(?!#|data:)', page)  # only in-page anchors and data: URIs


# --- user errors -----------------------------------------------------------------------------


def test_report_html_user_errors(study, tmp_path: Path) -> None:
    _, experiment = study
    assert_user_error(run_cli("report", "-c", experiment, *ONLY, "--html", tmp_path),
                      f"--html {tmp_path}: is a folder; pass a file name such as report.html")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert_user_error(run_cli("report", "-c", experiment, *ONLY, "--plots", a_file, "--html", tmp_path / "r.html"),
                      f"--plots {a_file}: is a file; pass a folder for the PNG files")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "experiments.yaml", "results"]


def test_report_html_before_any_run(experiment: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    assert_user_error(run_cli("report", "-c", experiment, "--html", page),
                      f"{experiment.parent / 'results'}: no results yet; run `matrixrl run` first")
    assert not page.exists()


def test_group_by_sorts_the_tables_that_have_those_axes(study) -> None:
    """--group-by seed: per-cell tables list seed 0 before seed 1; the seeds table (no seed column) is still there."""
    from matrixrl.report.html import build_report
    from matrixrl.report.tables import build_tables
    from matrixrl.store import store_path

    config, _ = study
    page, _ = build_report(config, group_by="seed")
    summary = re.search(r'<table data-table="summary">(.*?)</table>', page).group(1)
    seed_column = re.findall(r"<th [^>]*>([^<]*)</th>", summary).index("seed")
    seeds = [re.findall(r'<td data-value="([^"]*)"', row)[seed_column] for row in re.findall(r"<tr>(.*?)</tr>", summary)[1:]]
    assert seeds == ["0"] * 4 + ["1"] * 4
    assert '<table data-table="seeds">' in page
    caption = build_tables(store_path(config.results_dir), config, ["mechanism"])["mechanism"].attrs["caption"]
    assert f'<p class="caption">{html.escape(caption, quote=False)}</p>' in page
