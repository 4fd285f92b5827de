() => {
  // RECAP Studio's one script (loaded by recap.studio.environment.launch_kwargs).
  // The candidate tree names the width its depth columns need (layout.meta.min_width, set by
  // recap.studio.ui.figures.tree_figure): the plot is given at least that width, and its panel scrolls
  // sideways where it is narrower (a deep tree on a phone), instead of the labels running together.
  const fit = (plot) => {
    const meta = plot.layout && plot.layout.meta;
    const width = meta && Number.isFinite(meta.min_width) ? `${meta.min_width}px` : "";
    if (plot.style.minWidth !== width) {
      plot.style.minWidth = width;
      window.dispatchEvent(new Event("resize"));  // plotly's responsive handler re-measures the plot
    }
    // a tree taller than its panel (studio.css bounds it) opens on its middle rows, where the root is
    const panel = plot.closest("#tree-plot");
    if (panel && panel.scrollHeight > panel.clientHeight) {
      panel.scrollTop = (panel.scrollHeight - panel.clientHeight) / 2;
    }
  };
  // A node's hover label stays inside what the panel shows: plotly places it beside the node within
  // the whole plot, which on a phone is wider (and a tall tree taller) than its scrolling panel.
  const keepHover = (plot) => {
    const label = plot.querySelector(".hoverlayer .hovertext");
    const panel = plot.closest("#tree-plot");
    if (!label || !panel) return;
    const box = label.getBoundingClientRect(), seen = panel.getBoundingClientRect();
    const left = Math.max(seen.left, 0), right = Math.min(seen.right, window.innerWidth);
    const top = Math.max(seen.top, 0), bottom = Math.min(seen.bottom, window.innerHeight);
    const shift = (low, high, from, to) =>
      from < low ? low - from + 2 : to > high ? Math.max(high - to - 2, low - from + 2) : 0;
    const dx = shift(left, right, box.left, box.right), dy = shift(top, bottom, box.top, box.bottom);
    const at = /translate\(([-\d.e]+)[ ,]+([-\d.e]+)\)/.exec(label.getAttribute("transform") || "");
    if ((dx || dy) && at) {
      label.setAttribute("transform", `translate(${Number(at[1]) + dx},${Number(at[2]) + dy})`);
    }
  };
  const watch = () => {
    const plot = document.querySelector("#tree-plot .js-plotly-plot");
    if (plot && typeof plot.on === "function" && !plot.dataset.recapFit) {
      plot.dataset.recapFit = "1";
      plot.on("plotly_afterplot", () => fit(plot));
      plot.on("plotly_hover", () => requestAnimationFrame(() => keepHover(plot)));
      fit(plot);
    }
  };
  new MutationObserver(watch).observe(document.body, { childList: true, subtree: true });
  watch();

  // Stop cancels the run's event, and gradio sometimes marks that event's status line with its red
  // "Error" badge over the Stopped text: from Stop to the next Run the page is marked stopped, and
  // studio.css hides the status line's progress badge meanwhile (a refusal keeps its badge and toast).
  document.addEventListener("click", (event) => {
    if (event.target.closest("#stop-button")) document.body.dataset.recapStopped = "1";
    else if (event.target.closest("#run-button")) delete document.body.dataset.recapStopped;
  }, true);
}
