"""RECAP Studio: the Gradio app that shows every step of speculative decoding, in two parts.

- `recap.studio.ui`, the teaching: the components of each tab (`layout`), one handler per event
  (`handlers`, `traces`, `compare`, `sensitivity_tab`, `examples`), and the pure renderers they call
  (`render`, `figures`, `tables`, `explain`, `story`, `measure`, bounded by `drawing`).
- `recap.studio.guard`, the public Space's guard: who a request comes from (`clients`), the decode line
  and its waiting line (`decode_line`), jobs and their paced display (`jobs`), tickets for displays and
  drawings (`tickets`), sessions kept within a memory budget (`sessions`), untrusted values checked
  (`validation`), request bodies bounded (`bodylimit`) and uploaded traces checked (`trace_files`).
  The teaching does not depend on it to draw; the handlers call it where a request is admitted.

Beside them: `environment` (what the operator sets), `serving` (`Studio`: the model cache, each
visitor's memories, and the guard's objects every request shares) and `demo` (`build_demo`: the Blocks
laid out and wired). ``app.py`` at the repository root builds the demo and launches it.
"""
