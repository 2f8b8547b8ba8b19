"""The page's inline CSS and sort script, the policy that admits only them, and its colours.

The page makes no request of its own: CSS and the script are inline, every plot is
a PNG in a ``data:`` URI, and a Content-Security-Policy forbids anything else (the
script is allowed by its hash), so it can be opened from disk or mailed as one file.
"""

from __future__ import annotations

import base64
import hashlib

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1rem auto; max-width: 84rem;
       padding: 0 1rem; color: #1a1a1a; line-height: 1.4; }
h1 { font-size: 1.4rem; margin: 0; }
h2 { font-size: 1.25rem; margin-top: 2.5rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; }
h3 { font-size: 1.05rem; margin: 0.2rem 0 0.4rem; }
#table-claims h2 { margin: 0.8rem 0 0.2rem; }
#table-claims td, #table-claims th { padding: 0.08rem 0.6rem; }
p.meta, p.caption, p.empty, p.legend { color: #555; margin: 0.3rem 0; }
p.meta { font-size: 0.9rem; }
nav { font-size: 0.9rem; margin: 0.3rem 0 0.6rem; }
nav a { margin-right: 0.9rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.85rem; font-variant-numeric: tabular-nums; }
th, td { padding: 0.2rem 0.6rem; border-bottom: 1px solid #e5e5e5; white-space: nowrap; }
th { background: #f3f3f3; position: sticky; top: 0; text-align: left; }
td.num, th.num { text-align: right; }
tbody tr:nth-child(even) { background: #fafafa; }
td.pos { color: #1b7837; } td.neg { color: #762a83; }
table[data-table] thead th { cursor: pointer; user-select: none; }
table[data-table] thead th[aria-sort="ascending"]::after { content: " ▲"; }
table[data-table] thead th[aria-sort="descending"]::after { content: " ▼"; }
.brief .more { display: none; }
input.every:checked + label + .scroll .more { display: table-cell; }
label { font-size: 0.85rem; color: #555; }
table.matrix { font-size: 0.85rem; margin: 0.3rem 0; }
table.matrix th { background: none; position: static; text-align: center; border: none; padding: 0.1rem 0.3rem; }
table.matrix th.workflow { text-align: right; padding-right: 0.6rem; }
table.matrix td { padding: 2px; border: none; }
table.matrix tbody tr { background: none; }
table.matrix td.task-edge, table.matrix th.task-edge { border-left: 2px solid #999; }
.square a { display: block; min-width: 7.2rem; border: 2px solid #ddd; text-decoration: none; color: inherit; }
.square a:hover { border-color: #333; }
.square span { display: block; padding: 0.05rem 0.4rem; text-align: right; }
.square span.label { float: left; color: inherit; opacity: 0.75; }
.square.cliff a { border-color: #000; border-width: 3px; }
.square span.cliff { background: #000; color: #fff; text-align: center; font-weight: 600; }
.square span.collapse { border-top: 1px dashed #000; color: #000; text-align: center; font-weight: 600; }
.square.same a { opacity: 0.55; border-style: dashed; }
.square.none a { color: #888; text-align: center; padding: 0.6rem 0.2rem; }
.scale-bar { display: inline-block; width: 9rem; height: 0.8rem; vertical-align: middle; border: 1px solid #ccc; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(36rem, 1fr)); gap: 0.8rem; }
article.card { border: 1px solid #ddd; border-radius: 4px; padding: 0.5rem 0.8rem; }
article.card.cliff { border: 2px solid #000; grid-column: 1 / -1; }
article.card .beside { display: flex; gap: 1rem; align-items: flex-start; flex-wrap: wrap; }
article.card table { font-size: 0.8rem; }
article.card th { background: none; position: static; color: #555; font-weight: normal; }
article.card tr:first-child td { font-weight: 600; }
figure { margin: 1.5rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9rem; }
"""

# Click (or Enter on) a header to sort by its column, again for the other way; missing values last.
SCRIPT = """
document.querySelectorAll("table[data-table]").forEach((table) => {
  const headers = Array.from(table.tHead.rows[0].cells);
  headers.forEach((th, index) => {
    th.tabIndex = 0;
    const sort = () => {
      const descending = th.getAttribute("aria-sort") === "ascending";
      headers.forEach((other) => other.removeAttribute("aria-sort"));
      th.setAttribute("aria-sort", descending ? "descending" : "ascending");
      const value = (row) => JSON.parse(row.cells[index].dataset.value);
      const rows = Array.from(table.tBodies[0].rows);
      rows.sort((a, b) => {
        const x = value(a), y = value(b);
        if (x === null || y === null) return (x === null) - (y === null);
        const order = typeof x === "number" && typeof y === "number" ? x - y
          : String(x).localeCompare(String(y), undefined, {numeric: true});
        return descending ? -order : order;
      });
      table.tBodies[0].append(...rows);
    };
    th.addEventListener("click", sort);
    th.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") { event.preventDefault(); sort(); }
    });
  });
});
"""
# Nothing may load from anywhere: images only from data: URIs, styles inline, the one script by its hash.
SCRIPT_HASH = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
CSP = f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{SCRIPT_HASH}'"

POSITIVE, NEGATIVE = (27, 120, 55), (118, 42, 131)  # green and purple: apart from the policy colours
POLICY_COLOURS = {"shared": "#0072B2", "isolated": "#D55E00"}  # as the plots draw them
