"""One self-contained HTML page of the study (``matrixrl report --html``): the answer first.

The page opens with the study's findings tested on it (the claims table: each
finding's evidence and verdict), then the study as a matrix: a row per workflow, a
column per task × scale with shared beside isolated, one matrix per combination of
the extra axes' values. Each square is coloured by the cell's gain at its peak and at its final
checkpoint (mean over seeds), marks a terminal cliff, and links to the cell's card
further down: its learning curve (inline SVG), its numbers and, for a cell with a
cliff, its gradient diagnostics. Then the learning-curve figures, the cards, and
every table whose registry entry says so (``matrixrl.report.TABLES``: ``page``), sortable by any column (a small inline script) with signed numbers
coloured by sign; a table without rows (memory without a memory axis) is left out
with its links, one that says nothing for this study (the across-seeds table with one
seed) with a line saying why, and so are the rows of a one-role workflow's isolated
cells, which repeat its shared runs.

One module per concern:

- ``build``: the page of a study: its tables, its plots (drawn again only when what they
  are drawn from changes), its matrix and cards (:func:`build_report`), written
  atomically with its PNGs (:func:`write_report`);
- ``page``: the page assembled from its sections, each table sortable and holding the
  exact JSON values (:func:`report_page`);
- ``matrix``: the study as a matrix of squares and a card per square (:func:`matrix_html`,
  :func:`cards_html`);
- ``assets``: the inline CSS and script, the Content-Security-Policy that admits only
  them, and the colours.
"""

from matrixrl.report.html.build import build_report, write_report

__all__ = ["build_report", "write_report"]
