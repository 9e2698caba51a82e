(function () {
  "use strict";
  // Tables: a click on a header sorts by that column (numbers as numbers, `data-sort` where a cell has one).
  function cellKey(row, index) {
    const cell = row.cells[index];
    if (!cell) { return ""; }
    const raw = cell.dataset.sort !== undefined ? cell.dataset.sort : cell.textContent.trim();
    const number = Number(raw.replace(/[,\s%]/g, ""));
    return raw !== "" && raw !== "–" && !Number.isNaN(number) ? number : raw.toLowerCase();
  }
  function compare(a, b) {
    if (typeof a === typeof b) { return a < b ? -1 : a > b ? 1 : 0; }
    return typeof a === "number" ? -1 : 1;  // numbers before words and dashes
  }
  function sortBy(table, th) {
    const index = Array.prototype.indexOf.call(th.parentNode.children, th);
    const ascending = th.getAttribute("aria-sort") !== "ascending";
    for (const other of th.parentNode.children) { other.removeAttribute("aria-sort"); }
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    for (const body of table.tBodies) {
      const rows = Array.from(body.rows);
      rows.sort((a, b) => compare(cellKey(a, index), cellKey(b, index)) * (ascending ? 1 : -1));
      for (const row of rows) { body.appendChild(row); }
    }
    if (table.dataset.fold && !table.dataset.filtered) { fold(table); }  // the first rows of the new order
  }
  for (const table of document.querySelectorAll("table.sortable")) {
    if (!table.tHead) { continue; }
    for (const th of table.tHead.rows[0].cells) {
      th.tabIndex = 0;
      th.title = "Sort by this column";
      th.addEventListener("click", () => sortBy(table, th));
      th.addEventListener("keydown", (event) => {
        if (event.key === "Enter" || event.key === " ") { event.preventDefault(); sortBy(table, th); }
      });
    }
  }
  // Long tables: rows past `data-fold` wait behind a button (without this script, every row shows).
  function rowsOf(table) { return Array.from(table.tBodies).flatMap((body) => Array.from(body.rows)); }
  function fold(table) {
    const limit = Number(table.dataset.fold);
    rowsOf(table).forEach((row, i) => { row.hidden = table.dataset.unfolded !== "1" && i >= limit; });
  }
  for (const table of document.querySelectorAll("table[data-fold]")) {
    const total = rowsOf(table).length;
    if (total <= Number(table.dataset.fold)) { continue; }
    const button = document.createElement("button");
    button.type = "button";
    button.className = "unfold";
    button.textContent = `Show all ${total.toLocaleString("en")} rows`;
    button.addEventListener("click", () => { table.dataset.unfolded = "1"; fold(table); button.remove(); });
    (table.closest(".table-wrap") || table).after(button);
    fold(table);
  }
  // Filters: rows stay whose text holds every word typed; an empty filter folds a long table again.
  for (const input of document.querySelectorAll("input.filter[data-filter]")) {
    const table = document.getElementById(input.dataset.filter);
    const count = document.querySelector(`[data-count-for="${input.dataset.filter}"]`);
    if (!table) { continue; }
    const rows = rowsOf(table);
    input.addEventListener("input", () => {
      const words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
      table.dataset.filtered = words.length ? "1" : "";
      if (!words.length && table.dataset.fold) { fold(table); if (count) { count.textContent = ""; } return; }
      let shown = 0;
      for (const row of rows) {
        const text = row.textContent.toLowerCase();
        const keep = words.every((w) => text.includes(w));
        row.hidden = !keep;
        shown += keep ? 1 : 0;
      }
      if (count) { count.textContent = words.length ? `${shown} of ${rows.length}` : ""; }
    });
  }
  // Copy buttons: the command or path in `data-copy`, to the clipboard (or selected, where it is refused).
  function select(node) {
    const range = document.createRange();
    range.selectNodeContents(node);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }
  document.addEventListener("click", (event) => {
    const button = event.target.closest("button.copy");
    if (!button) { return; }
    const text = button.dataset.copy;
    const label = button.dataset.label || "copy";
    const done = () => { button.textContent = "copied"; setTimeout(() => { button.textContent = label; }, 1500); };
    const target = button.closest(".cmds, .runpath, li, td") || button;
    const shown = target.querySelector("code") || button;
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, () => select(shown));
    } else {
      select(shown);
    }
  });
  // A link to an anchor inside a folded section unfolds it; printing unfolds everything.
  function reveal() {
    const target = location.hash && document.getElementById(decodeURIComponent(location.hash.slice(1)));
    for (let node = target; node; node = node.parentElement) {
      if (node.tagName === "DETAILS") { node.open = true; }
      if (node.tagName === "TR") { node.hidden = false; }
    }
    if (target) { target.scrollIntoView(); }
  }
  window.addEventListener("hashchange", reveal);
  reveal();
  const folded = [];
  window.addEventListener("beforeprint", () => {
    for (const d of document.querySelectorAll("details:not([open])")) { d.open = true; folded.push(d); }
    for (const table of document.querySelectorAll("table[data-fold]")) { table.dataset.unfolded = "1"; fold(table); }
  });
  window.addEventListener("afterprint", () => { while (folded.length) { folded.pop().open = false; } });
  document.body.dataset.reportReady = "1";
})();
