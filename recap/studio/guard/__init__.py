"""The public Space's guard: every request is a stranger's, and the server keeps serving the others.

- `clients`: who a request comes from (its address behind the configured proxies), for every
  per-client bound;
- `decode_line`: the decode slots, fair across clients and bounded per client, and the waiting line a
  handler shows while its work waits;
- `jobs`: a piece of decoding work, one per session and event, and a display paced outside the slots;
- `tickets`: how many paced displays and drawings from traces run at once, with a rest per client;
- `sessions`: what the sessions keep, within a memory budget;
- `validation`: every value a request carries, checked against the UI's bounds; refusals in one line;
- `bodylimit`: request bodies bounded before gradio reads them;
- `trace_files`: an uploaded trace, bounded by size and work and checked in full before it is read;
- `offload`: drawing from a trace in a worker process at a low priority, off the server's interpreter;
- `wrapper`: `Guard`, the one wrapper that puts the bounds of a handler's kind around the studio's
  plain handlers where the page is wired.

docs/reliability.md lists every bound with the test that shows it.
"""
