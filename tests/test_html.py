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
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from browser import chromium, inspect_page, opened
from PIL import Image
from test_cli_errors import assert_user_error
from test_plots import CLIFF_CELL, ONLY, png_size, study  # noqa: F401  (study is a fixture)

from conftest import run_cli
from matrixrl.report import TABLE_NAMES, TABLES
from matrixrl.report.formats import to_json, value_text
from matrixrl.report.html.assets import CSP
from matrixrl.report.html.page import TableSection, report_page, table_html

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

    assert seen.empty_tables == []  # a table without rows is left out, not an empty section
    for name in (name for name in TABLE_NAMES if TABLES[name].page):
        printed = run_cli("report", "-c", experiment, *ONLY, "--table", name, "--format", "json")
        if printed.exit_code != 0:  # a table without rows for this grid (memory: no memory axis): left out
            assert name not in seen.tables, (name, printed.output)
            continue
        # single's isolated rows repeat its shared runs: the page leaves them out (and says so)
        records = [r for r in json.loads(printed.stdout) if (r.get("workflow"), r.get("policy")) != ("single", "isolated")]
        table = seen.tables[name]
        assert table["columns"] == table["headers"] == list(records[0]), name
        assert len(table["rows"]) == len(records), name
        for row, record in zip(table["rows"], records):
            assert [json.loads(c["value"]) for c in row] == list(record.values()), name
            assert [c["text"] for c in row] == [value_text(v, c) for c, v in record.items()], name
    assert {"summary", "seeds", "compare", "diagnostics", "mechanism", "claims"} <= set(seen.tables)  # this study fills them all


# The default grid's study, one run (voting, arith, tiny-s, shared) collapsing at step 30.
CLIFF_RUN = 4


@pytest.mark.slow  # the default grid's page: 32 cells, their curves drawn (10-30 s on 2 shared cores)
def test_the_page_opens_with_the_matrix_on_a_laptop_screen(experiment: Path, tmp_path: Path) -> None:
    """The default grid at 1366×768: the whole matrix on the first screen, a square per cell that
    links to its card, and tables that sort by a click."""
    from test_report_fit import default_study

    executable = chromium()
    config = default_study(experiment, "[0]", cliff=lambda i: i == CLIFF_RUN)
    page_file = tmp_path / "report.html"
    assert run_cli("report", "-c", experiment, "--html", page_file).exit_code == 0
    summary = {r["cell"]: r for r in json.loads(to_json(build_tables_of(config)["summary"]))}
    cliff_cell = "voting-arith-tiny-s-shared-s0"
    assert [c for c, r in summary.items() if r["cliff"]] == [cliff_cell]

    with opened(page_file, executable) as (page, errors):
        page.screenshot(path=tmp_path / "first-screen.png")
        # The claims first, then the matrix: both on the first screen.
        claims = page.locator("#table-claims").bounding_box()
        box = page.locator("#matrix").bounding_box()
        assert claims["y"] + claims["height"] <= box["y"]
        assert box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["width"] <= 1366 and box["y"] + box["height"] <= 768, box
        squares = page.eval_on_selector_all("td.square[data-square]", """(tds) => tds.map((td) => ({
            anchor: td.dataset.square, classes: td.className, href: td.querySelector("a").getAttribute("href"),
            peak: JSON.parse(td.querySelector("span.peak").dataset.value),
            final: JSON.parse(td.querySelector("span.final").dataset.value)}))""")
        # A square per cell, in the grid's order by row: workflow, then task × scale × policy.
        order = sorted(summary, key=lambda c: [config.grid.workflow.index(summary[c]["workflow"]), config.grid.task.index(summary[c]["task"]),
                                               config.grid.scale.index(summary[c]["scale"]), config.grid.policy.index(summary[c]["policy"])])  # fmt: skip
        assert len(squares) == 32 and [sq["anchor"] for sq in squares] == [f"cell-{c.removesuffix('-s0')}" for c in order]
        for square, cell in zip(squares, order):
            row = summary[cell]
            assert square["href"] == f"#{square['anchor']}"
            assert square["peak"] == pytest.approx(row["peak"] - row["base"]) and square["final"] == pytest.approx(row["gain"])
            assert ("cliff" in square["classes"].split()) == (cell == cliff_cell)
            assert ("same" in square["classes"].split()) == (row["workflow"] == "single" and row["policy"] == "isolated")
        assert page.inner_text(f'td[data-square="cell-{cliff_cell.removesuffix("-s0")}"] span.cliff') == "▼ cliff @30"

        # The cliff square leads to its card: its curve, its numbers and its diagnostics plot.
        page.click(f'td[data-square="cell-{cliff_cell.removesuffix("-s0")}"] a')
        card = page.locator(f"article#cell-{cliff_cell.removesuffix('-s0')}")
        assert page.evaluate("location.hash") == f"#cell-{cliff_cell.removesuffix('-s0')}"
        assert abs(card.bounding_box()["y"]) < 1  # scrolled to its top
        assert card.locator("svg polyline").count() == 1 and card.locator(f'img[alt="diagnostics-{cliff_cell}"]').count() == 1
        assert "yes@30" in card.inner_text()

        # One seed: the across-seeds table is left out, with the reason.
        assert "one seed" in page.inner_text('p.omitted[data-table="seeds"]')

        # Sorting: a click on gain sorts the summary by it, a second the other way; nothing else changes.
        table = page.locator('table[data-table="summary"]')
        column = list(summary[order[0]]).index("gain") - 1  # the page has no cell column

        def gains() -> list[float]:
            return [json.loads(v) for v in table.locator(f"tbody tr td:nth-child({column + 1})").evaluate_all("(tds) => tds.map((td) => td.dataset.value)")]

        before = gains()
        table.locator('th[data-column="gain"]').click()
        assert gains() == sorted(before) and table.locator('th[data-column="gain"]').get_attribute("aria-sort") == "ascending"
        table.locator('th[data-column="gain"]').click()
        assert gains() == sorted(before, reverse=True)
        signs = table.locator(f"tbody tr td:nth-child({column + 1})").evaluate_all("(tds) => tds.map((td) => td.className)")
        assert [("pos" in c) - ("neg" in c) for c in signs] == [(g > 0) - (g < 0) for g in gains()]
        assert errors == []
    assert png_size(tmp_path / "first-screen.png") == (1366, 768)


def build_tables_of(config):
    from matrixrl.report.tables import build_tables
    from matrixrl.store import store_path

    return build_tables(store_path(config.results_dir), config, ["summary"])


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


def page_links(page: str) -> tuple[list[str], list[str], set[str]]:
    """(the navigation's links, the sections' ids, every in-page link of the page)."""
    nav = re.findall(r'href="#([^"]*)"', re.search(r"<nav>(.*?)</nav>", page).group(1))
    return nav, re.findall(r'<section id="([^"]*)"', page), set(re.findall(r'href="#([^"]*)"', page))


def test_a_table_without_rows_is_left_out_with_its_links(study, tmp_path: Path) -> None:
    """No memory axis: no memory section and no link to one; every link of the page lands."""
    _, experiment = study
    result = run_cli("report", "-c", experiment, *ONLY, "--html", tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "r.html").read_text()
    nav, sections, links = page_links(page)
    tables = ["summary", "seeds", "compare", "diagnostics", "mechanism"]
    # The claims answer first, above the matrix.
    assert nav == sections == ["table-claims", "matrix", "figures-0", "cells", *(f"table-{t}" for t in tables)]
    assert 'data-table="memory"' not in page and "No rows" not in page
    anchors = set(re.findall(r'id="([^"]*)"', page))
    assert links <= anchors, links - anchors


def test_a_study_without_diagnostics_links_no_diagnostics(experiment: Path, tmp_path: Path) -> None:
    """One cell, evaluations only: no compare (nothing to pair), diagnostics or memory section; the
    cell's card links to its curves, the summary and the mechanism table only."""
    from test_cli_errors import ONE_CELL, results_of, write_cell

    write_cell(results_of(experiment), steps=(0, 10))
    result = run_cli("report", "-c", experiment, *ONE_CELL, "--html", tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "r.html").read_text()
    nav, sections, links = page_links(page)
    assert nav == sections == ["table-claims", "matrix", "figures-0", "cells", "table-summary", "table-seeds", "table-mechanism"]
    card = re.search(r'<article class="card" id="cell-single-arith-tiny-s-shared">.*?</article>', page).group(0)
    assert re.findall(r'<p class="caption">(<a .*?)</p>', card) == [
        '<a href="#plot-curves-arith">all arith curves</a> · <a href="#table-summary">summary</a> · '
        '<a href="#table-mechanism">mechanism</a>'
    ]
    assert links <= set(re.findall(r'id="([^"]*)"', page))


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
    from matrixrl.report.html.build import build_report
    from matrixrl.report.tables import build_tables
    from matrixrl.store import store_path

    config, _ = study
    page, _ = build_report(config, group_by="seed")
    summary = re.search(r'<table data-table="summary">(.*?)</table>', page).group(1)
    seed_column = re.findall(r"<th [^>]*>([^<]*)</th>", summary).index("seed")
    seeds = [re.findall(r'<td data-value="([^"]*)"', row)[seed_column] for row in re.findall(r"<tr>(.*?)</tr>", summary)[1:]]
    assert seeds == ["0"] * 3 + ["1"] * 3  # single's isolated rows (its shared runs again) are left out
    assert '<table data-table="seeds">' in page
    caption = build_tables(store_path(config.results_dir), config, ["mechanism"])["mechanism"].attrs["caption"]
    assert f'<p class="caption">{html.escape(caption, quote=False)}</p>' in page


def test_one_matrix_per_value_of_an_extra_axis_with_the_cells_it_leaves_alone_in_each() -> None:
    """workflows.voting.n_votes [3, 5] changes voting's cells only: two matrices, single's squares in both."""
    from matrixrl.analysis.axes import cells_frame
    from matrixrl.report.html.matrix import matrix_html, squares_of

    axis = "workflows.voting.n_votes"
    rows, summary = [], []
    for workflow, values in (("single", [None]), ("voting", [3, 5])):
        for policy in ("shared", "isolated"):
            for votes in values:
                cell = f"{workflow}-arith-tiny-s-{policy}-s0" + ("" if votes is None else f"-v{votes}")
                rows.append({"cell": cell, "workflow": workflow, "task": "arith", "scale": "tiny-s", "policy": policy, "seed": 0, axis: votes})
                gain = {None: 0.05, 3: -0.02, 5: 0.1}[votes]
                summary.append({"cell": cell, "seed": 0, "base": 0.3, "peak": 0.3 + max(gain, 0), "peak_step": 10, "final": 0.3 + gain,
                                "gain": gain, "cliff": votes == 5 and policy == "isolated", "cliff_onset": 30 if votes == 5 else None})  # fmt: skip
    cells = cells_frame(rows, ["cell", "workflow", "task", "scale", "policy", "seed", axis])
    summary = pd.DataFrame(summary).assign(peak_gain=lambda f: f["peak"] - f["base"])
    runs = {c: c.replace("isolated", "shared") if c.startswith("single") else c for c in cells["cell"]}
    markup = matrix_html(cells, squares_of(cells, summary, runs), 1)
    matrices = re.findall(r'<table class="matrix" data-matrix="([^"]*)">(.*?)</table>', markup)
    assert [caption for caption, _ in matrices] == [f"{axis}=3", f"{axis}=5"]
    for (_, body), votes in zip(matrices, (3, 5)):
        squares = re.findall(r'<td class="([^"]*)" data-square="([^"]*)"><a href="#([^"]*)"', body)
        assert [(anchor, href) for _, anchor, href in squares] == [(a, a) for a in [
            "cell-single-arith-tiny-s-shared", "cell-single-arith-tiny-s-isolated",
            f"cell-voting-arith-tiny-s-shared-{votes}", f"cell-voting-arith-tiny-s-isolated-{votes}"]]  # fmt: skip
        classes = [set(c.split()) for c, _, _ in squares]
        assert ["same" in c for c in classes] == [False, True, False, False]  # single's isolated cell is its shared run
        assert ["cliff" in c for c in classes] == [False, False, False, votes == 5]
        finals = [json.loads(html.unescape(v)) for v in re.findall(r'<span class="final"[^>]*data-value="([^"]*)"', body)]
        assert finals == pytest.approx([0.05, 0.05, {3: -0.02, 5: 0.1}[votes], {3: -0.02, 5: 0.1}[votes]])


def test_a_collapse_is_marked_apart_from_a_cliff_in_the_matrix_and_its_card() -> None:
    """Voting's shared runs collapse (fell from their base with no real peak) in 1 of 2 seeds, its isolated
    runs fall off a cliff in both: each square says which, and a card names each seed's ending."""
    from matrixrl.analysis.axes import cells_frame
    from matrixrl.report.html.matrix import card_rows, matrix_html, squares_of

    rows, summary = [], []
    endings = {("shared", 0): "collapse", ("shared", 1): "gain", ("isolated", 0): "cliff", ("isolated", 1): "cliff"}
    for (policy, seed), ending in endings.items():
        cell = f"voting-arith-tiny-s-{policy}-s{seed}"
        rows.append({"cell": cell, "workflow": "voting", "task": "arith", "scale": "tiny-s", "policy": policy, "seed": seed})
        peak, final = {"collapse": (0.3, 0.15), "gain": (0.4, 0.4), "cliff": (0.5, 0.2)}[ending]
        summary.append({"cell": cell, "seed": seed, "base": 0.3, "peak": peak, "peak_step": 0 if ending == "collapse" else 10,
                        "final": final, "gain": final - 0.3, "cliff": ending == "cliff", "cliff_onset": 20 if ending == "cliff" else None,
                        "signature": ending})  # fmt: skip
    cells = cells_frame(rows, ["cell", "workflow", "task", "scale", "policy", "seed"])
    summary = pd.DataFrame(summary).assign(peak_gain=lambda f: f["peak"] - f["base"])
    squares = squares_of(cells, summary, {c: c for c in cells["cell"]})
    markup = matrix_html(cells, squares, 2)
    found = re.findall(r'<td class="([^"]*)" data-square="cell-voting-arith-tiny-s-(\w+)">(.*?)</td>', markup)
    marks = {policy: (set(classes.split()), re.findall(r'<span class="(cliff|collapse)">([^<]*)</span>', body)) for classes, policy, body in found}
    assert marks == {"shared": ({"square", "task-edge", "collapse"}, [("collapse", "▽ collapse 1/2")]),
                     "isolated": ({"square", "cliff"}, [("cliff", "▼ cliff 2/2")])}  # fmt: skip
    assert "▽ a collapse: far below its base, with no real peak before" in markup
    shared = next(square for square in squares.values() if square.axes["policy"] == "shared")
    empty = pd.DataFrame().set_index(pd.Index([], name="cell"))
    assert dict(card_rows(shared, empty, empty))["signature"] == ["collapse", "gain"]


@pytest.mark.slow  # five figures drawn (10 s on 2 shared cores)
def test_the_page_draws_again_only_the_figures_whose_data_changed(study, tmp_path: Path, monkeypatch) -> None:
    """Drawn figures are kept in the store: a page with nothing new draws none, a new evaluation
    draws its task's curves again (not the diagnostics of a cell it leaves alone), and the page
    is the one a store without any drawn figure gives."""
    import matrixrl.report.plots as plots_module
    from matrixrl.layout import eval_result
    from matrixrl.results import EvalResult, write_result

    config, experiment = study
    drawn = []
    real = plots_module.png_bytes
    monkeypatch.setattr(plots_module, "png_bytes", lambda fig, *args: drawn.append(fig._suptitle.get_text().split(":")[0]) or real(fig, *args))

    def page(name: str) -> bytes:
        result = run_cli("report", "-c", experiment, *ONLY, "--html", tmp_path / name)
        assert result.exit_code == 0, result.output
        return (tmp_path / name).read_bytes()

    first = page("first.html")
    assert drawn == ["arith", CLIFF_CELL]
    drawn.clear()
    assert page("again.html") == first and drawn == []

    calm = "voting-arith-tiny-s-isolated-s1"
    write_result(Path(config.results_dir) / eval_result(calm, 40),
                 EvalResult(cell=calm, step=40, accuracy=0.5, n=256, n_correct=128, seconds=0.1))  # fmt: skip
    changed = page("changed.html")
    assert drawn == ["arith"] and changed != first
    with sqlite3.connect(Path(config.results_dir) / "matrixrl.sqlite") as db:
        db.execute("delete from figures")
    drawn.clear()
    assert page("from-nothing.html") == changed and drawn == ["arith", CLIFF_CELL]
