(async function () {
  const b64 = document.getElementById("plotly-gz").textContent.trim();
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  const source = await new Response(stream).text();
  (0, eval)(source);
  const figures = JSON.parse(document.getElementById("figure-data").textContent);
  for (const fig of figures) {
    const el = document.getElementById("plot-" + fig.id);
    if (el) { await window.Plotly.newPlot(el, fig.json.data, fig.json.layout, {displaylogo: false, responsive: true}); }
  }
  document.body.dataset.plotsReady = "1";
})();
