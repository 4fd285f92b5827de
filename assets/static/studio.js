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
  const watch = () => {
    const plot = document.querySelector("#tree-plot .js-plotly-plot");
    if (plot && typeof plot.on === "function" && !plot.dataset.recapFit) {
      plot.dataset.recapFit = "1";
      plot.on("plotly_afterplot", () => fit(plot));
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
