(async function () {
  "use strict";
  const b64 = document.getElementById("plotly-gz").textContent.trim();
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  const source = await new Response(stream).text();
  (0, eval)(source);
  const Plotly = window.Plotly;
  const config = {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"]};
  const darkQuery = window.matchMedia("(prefers-color-scheme: dark)");

  // The page's theme for every figure (figures come without one): light or dark like the page.
  function theme(dark) {
    const ink = dark ? "#d0d5dd" : "#344054";
    const grid = dark ? "#2b303b" : "#eaecf0";
    const paper = dark ? "#161b26" : "#ffffff";
    const axis = {gridcolor: grid, linecolor: grid, zerolinecolor: grid, automargin: true};
    return {layout: {
      font: {color: ink, family: "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size: 12},
      paper_bgcolor: paper, plot_bgcolor: paper,
      colorway: ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"],
      xaxis: axis, yaxis: axis, title: {x: 0.01, xanchor: "left"},
      hoverlabel: {font: {family: "ui-monospace, monospace", size: 11}},
    }};
  }
  function themed(layout) {
    return Object.assign({}, layout, {template: theme(darkQuery.matches), autosize: true});
  }
  const drawn = [];
  async function draw(el, data, layout) {
    await Plotly.newPlot(el, data, themed(layout), config);
    drawn.push(el);
  }

  const figures = JSON.parse(document.getElementById("figure-data").textContent);
  for (const fig of figures) {
    const el = document.getElementById("plot-" + fig.id);
    if (el) { await draw(el, fig.json.data, fig.json.layout || {}); }
  }
  darkQuery.addEventListener("change", () => {
    for (const el of drawn) { Plotly.relayout(el, {template: theme(darkQuery.matches)}); }
  });

  // The series picker: every logged series by name; each one picked is drawn below it.
  const dataNode = document.getElementById("series-data");
  const list = document.getElementById("series-list");
  if (dataNode && list) {
    const catalogue = JSON.parse(dataNode.textContent).metrics;
    const input = document.getElementById("series-filter");
    const count = document.getElementById("series-count");
    const chosen = document.getElementById("series-chosen");
    const buttons = Array.from(list.querySelectorAll("button[data-series]"));
    function filter() {
      const words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
      let shown = 0;
      for (const b of buttons) {
        const keep = words.every(w => b.textContent.toLowerCase().includes(w));
        b.parentElement.hidden = !keep;
        shown += keep ? 1 : 0;
      }
      count.textContent = words.length ? `${shown} of ${buttons.length}` : "";
    }
    function figureOf(m) {
      const time = m.x === "time";
      const data = m.traces.map(t => ({
        type: "scatter", mode: t.x.length <= 120 ? "lines+markers" : "lines", name: t.name,
        x: t.x, y: t.y, marker: {size: 4},
      }));
      const many = data.length > 1;
      const layout = {
        title: {text: m.name, font: {size: 13}}, height: many ? 300 : 270,
        margin: {l: 56, r: 16, t: 44, b: many ? 70 : 36}, showlegend: many,
        legend: {orientation: "h", y: -0.22, x: 0, font: {size: 11}},
        xaxis: time ? {type: "date"} : {title: {text: "step"}},
        yaxis: Object.assign({}, m.axis, m.axis.type === "log" ? {title: {text: "log scale"}} : {}),
      };
      return {data, layout};
    }
    async function toggle(button) {
      const index = Number(button.dataset.series);
      const id = "plot-series-" + index;
      const existing = document.getElementById(id);
      if (existing) {
        Plotly.purge(existing);
        existing.remove();
        button.setAttribute("aria-pressed", "false");
        return;
      }
      const m = catalogue[index];
      const el = document.createElement("div");
      el.className = "plot";
      el.id = id;
      el.dataset.metric = button.textContent;
      chosen.appendChild(el);
      button.setAttribute("aria-pressed", "true");
      const fig = figureOf(m);
      await draw(el, fig.data, fig.layout);
    }
    input.addEventListener("input", filter);
    input.addEventListener("keydown", event => {
      if (event.key !== "Enter") { return; }
      const first = buttons.find(b => !b.parentElement.hidden);
      if (first) { event.preventDefault(); toggle(first); }
    });
    list.addEventListener("click", event => {
      const button = event.target.closest("button[data-series]");
      if (button) { toggle(button); }
    });
  }
  document.body.dataset.plotsReady = "1";
})();
