
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
