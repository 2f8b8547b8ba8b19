"""The report: tables built from the store (``tables``) and rendered (``formats``).

This module stays light (no pandas) so that the CLI can offer the names at start-up.
"""

TABLE_NAMES = ("summary", "seeds", "compare", "diagnostics", "mechanism", "memory")
"""Every table of ``matrixrl report --table NAME`` (``matrixrl.report.tables.TABLES``)."""

FORMATS = ("table", "csv", "markdown", "latex", "json")
"""Every ``--format`` of ``matrixrl report`` (``matrixrl.report.formats.render``)."""
