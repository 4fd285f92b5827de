"""Summarise training runs of the embedded model as one Markdown page (what training/train_v2_gpu.sh writes).

Usage::

    python -m training.summary WORK_DIR NAME [NAME ...] > summary.md

For each NAME it reads ``WORK_DIR/NAME.train.json`` (the last line ``train_embedded --out`` prints),
``WORK_DIR/NAME.eval.json`` (``train_embedded --eval`` output) and ``WORK_DIR/NAME.args`` (the command
line options), any of which may be missing when a run failed or timed out; that is said in the page.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: The issue's goals: held-out accuracy per question type (training / held-out phrasings).
GOAL_REAL, GOAL_REPHRASED, GOAL_DETAIL = 0.95, 0.90, 0.90
GOAL_TOKENS_PER_S, GOAL_MB = 300.0, 20.0


def _read_json(path: Path) -> dict | None:
    """The JSON object in ``path`` (whole file, else its last line), or None."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for candidate in (text, text.strip().splitlines()[-1] if text.strip() else ""):
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    return None


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def run_section(name: str, args: str, trained: dict | None, report: dict | None) -> list[str]:
    """Markdown lines for one run: its options, training outcome, accuracy table and goal checks."""
    lines = [f"## {name}", "", f"options: `{args.strip() or '?'}`", ""]
    if trained is None:
        lines += ["**training did not finish** (no train summary; see logs.tar)", ""]
    else:
        losses = " ".join(f"{k} {v:.4f}" for k, v in trained.get("losses", {}).items())
        lines += [
            f"trained {trained['steps_done']} of {trained['steps']} steps in {trained['seconds']:.0f} s; "
            f"last logged losses: {losses}",
            "",
        ]
    if report is None:
        return [*lines, "**no evaluation** (failed or timed out; see logs.tar)", ""]
    real, shuffled = report.get("real", {}), report.get("shuffled", {})
    rephrased = report.get("rephrased", {})
    lines += [
        f"held-out set {report['heldout_seed']} (rephrased: set {report['heldout_seed'] + 1}), "
        f"{report['n_per_type']} questions per type, greedy, exact facts:",
        "",
        "| type | training phrasings | held-out phrasings | shuffled images |",
        "|---|---|---|---|",
    ]
    for qtype in real:
        lines.append(
            f"| {qtype} | {_cell(real.get(qtype))} | {_cell(rephrased.get(qtype))} "
            f"| {_cell(shuffled.get(qtype))} |"
        )
    tps = report.get("tokens_per_s_1_thread", 0.0)
    tps_detail = report.get("tokens_per_s_1_thread_detail")
    checks = {
        f"every type >= {GOAL_REAL} (training phrasings)": all(v >= GOAL_REAL for v in real.values()),
        f"every type >= {GOAL_REPHRASED} (held-out phrasings)": bool(rephrased)
        and all(v >= GOAL_REPHRASED for v in rephrased.values()),
        f"detail >= {GOAL_DETAIL}": real.get("detail", 0.0) >= GOAL_DETAIL,
        f"size <= {GOAL_MB} MB": report.get("folder_mb", 1e9) <= GOAL_MB,
    }
    lines += [
        "",
        f"greedy speed, one CPU thread of this machine: {tps:.0f} tokens/s (60 tokens)"
        + (f", {tps_detail:.0f} tokens/s (150 tokens)" if tps_detail else "")
        + f" (goal >= {GOAL_TOKENS_PER_S:.0f} on the dev CPU: measure there); "
        f"folder {report['folder_mb']:.2f} MB",
        "",
        "goals: " + ", ".join(f"{k}: {'yes' if ok else 'NO'}" for k, ok in checks.items()),
        "",
    ]
    for key, wrong in report.get("failures", {}).items():
        for w in wrong:
            lines.append(f"- wrong ({key}): Q: {w['q']!r} → {w['got']!r}")
    return [*lines, ""]


def summary_markdown(work: Path, names: list[str]) -> str:
    """The whole page for the runs ``names`` under ``work``."""
    lines = ["# Embedded model v2: training runs", ""]
    env = work / "env.txt"
    if env.exists():
        lines += ["```", env.read_text().strip(), "```", ""]
    for name in names:
        args_file = work / f"{name}.args"
        args = args_file.read_text() if args_file.exists() else ""
        lines += run_section(
            name, args, _read_json(work / f"{name}.train.json"), _read_json(work / f"{name}.eval.json")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        raise SystemExit("usage: python -m training.summary WORK_DIR NAME [NAME ...]")
    print(summary_markdown(Path(argv[0]), argv[1:]))


if __name__ == "__main__":
    main()
