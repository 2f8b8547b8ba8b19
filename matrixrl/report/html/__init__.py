"""One self-contained HTML page of the study (``matrixrl report --html``): the answer first.

The claims table, then the study as a matrix of squares with a card per cell, the figures
and the tables (docs/report.md, "Plots and the HTML report"). ``build`` makes and writes the
page, ``page`` assembles its sections, ``matrix`` draws the matrix and cards, ``assets``
holds the inline CSS, script and Content-Security-Policy.
"""

from matrixrl.report.html.build import build_report, write_report

__all__ = ["build_report", "write_report"]
