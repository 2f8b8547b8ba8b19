"""One self-contained HTML page of the study (``matrixrl report --html``): the answer first.

docs/report.md, "Plots and the HTML report".
"""

from matrixrl.report.html.build import build_report, write_report

__all__ = ["build_report", "write_report"]
