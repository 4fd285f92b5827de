"""RECAP Studio: the Gradio app that shows every step of speculative decoding, as a package.

One concern per module (imports point down the list):

- `render`: pure renderers of `StepRecord`s into HTML, table rows and Gradio values (answer, stats,
  passes, step table, Compare and sensitivity tables);
- `figures`: the step panel's plotly figures (candidate tree, fused distribution);
- `environment`: what the operator sets (environment variables, offered models, launch options);
- `validation`: every value a request carries, checked against the UI's bounds (`RunSettings`);
- `examples`: the example inputs and the sensitivity tab's replacement images;
- `slots`: the decode slots and their bounded line, one run per session, paced displays;
- `sessions`: what the sessions hold, kept within a memory budget (the least recently used dropped);
- `serving`: the shared runtime cache, the per-pass lock, per-visitor drafting state (`Studio`);
- `exports`: trace files written on Download and removed with the session;
- `layout`: the components of each tab, nothing else;
- `explain`: one step in plain words (the teacher's line beside the tree);
- `handlers`, `compare`, `sensitivity_tab`: one handler per event, wired in `demo.build_demo`.

``app.py`` at the repository root builds the demo with `build_demo` and launches it.
"""
