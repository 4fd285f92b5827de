"""The studio's teaching: what a visitor sees and the events that fill it.

One concern per module (imports point down the list):

- `layout`: the components of each tab, nothing else;
- `handlers`: the Run tab's events (run, stop, scrub, reset); `traces`: a run's trace file, downloaded
  and replayed; `compare`, `sensitivity_tab`: the other tabs' events; `examples`: the example inputs;
- `measure`, `story`: what Compare measures and the paper's story it tells;
- `render`, `figures`, `tables`: pure renderers of step records into HTML, plotly figures, table rows;
- `explain`: one step in plain words; `drawing`: the bound on what any panel draws from a trace.
"""
