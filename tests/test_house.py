"""The house: licence, citation and README agree with each other; no module outgrows one concept."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_license_file_is_the_apache_2_licence_the_readme_declares():
    readme = (ROOT / "README.md").read_text()
    assert "license: apache-2.0" in readme.split("---")[1]  # the Space's front matter
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_citation_cites_the_paper_and_this_implementation():
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["license"] == "Apache-2.0"
    assert citation["type"] == "software" and "RECAP Studio" in citation["title"]
    paper = citation["preferred-citation"]
    assert "arXiv:2611.05894" in [identifier["value"] for identifier in paper["identifiers"]]
    assert paper["title"].startswith("RECAP: Context-Aware Prediction Recycling")


#: Lines past which a module under recap/, training/ or scripts/ is reported: a prompt to look at whether
#: it holds one concept, never a reason to split one idea in two (the test warns, it does not fail).
MODULE_LINE_WARNING = 450


def module_lines() -> dict[str, int]:
    return {
        path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
        for folder in ("recap", "training", "scripts")
        for path in sorted((ROOT / folder).rglob("*.py"))
    }


def test_long_modules_are_reported():
    lines = module_lines()
    assert len(lines) > 20  # the walk found the packages
    for path, count in sorted(lines.items()):
        if count > MODULE_LINE_WARNING:
            warnings.warn(f"{path} has {count} lines: does it hold one concept?", stacklevel=1)


# ------------------------------------------------------------------------------------------ layers
#: The library's lower layers: what a user of the method imports. None of them may import the layers
#: above (the benchmark, the studio) or the demo worlds.
LOWER_LAYERS = (
    "recap/models",
    "recap/memory",
    "recap/drafters",
    *(
        f"recap/{name}.py"
        for name in (
            "tree",
            "verify",
            "sampling",
            "trace",
            "decode",
            "inputs",
            "runtime",
            "options",
            "hotstart",
        )
    ),
)
UPPER = ("recap.embedded", "recap.bench", "recap.studio")
IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\s+([\w, ()]+)|import\s+([\w.]+))", re.M)


def imports_of(path: Path) -> set[str]:
    """The modules ``path`` imports (``from recap import x`` counts as ``recap.x``), lazy ones too."""
    found = set()
    for match in IMPORT.finditer(path.read_text()):
        base, names, plain = match.groups()
        if plain:
            found.add(plain)
            continue
        found.add(base)
        found.update(f"{base}.{name.strip()}" for name in names.strip("()").split(",") if name.strip())
    return found


def modules_under(*places: str) -> list[Path]:
    paths = []
    for place in places:
        path = ROOT / place
        paths.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return paths


def test_lower_layers_import_neither_the_demo_worlds_nor_the_bench_nor_the_studio():
    paths = modules_under(*LOWER_LAYERS)
    assert len(paths) > 30
    bad = {
        path.relative_to(ROOT).as_posix(): sorted(m for m in imports_of(path) if m.startswith(UPPER))
        for path in paths
    }
    assert {path: found for path, found in bad.items() if found} == {}


def test_only_training_imports_the_training_code():
    users = {
        path.relative_to(ROOT).as_posix()
        for path in modules_under("recap", "scripts", "app.py")
        if any(m == "training" or m.startswith("training.") for m in imports_of(path))
    }
    assert users == set()


def test_the_library_imports_no_script():
    users = [p for p in modules_under("recap") if any(m.startswith("scripts") for m in imports_of(p))]
    assert users == []


def test_the_package_holds_few_top_level_modules_and_the_method_in_one_place():
    top = sorted(
        p.name for p in (ROOT / "recap").iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()
    )
    assert len(top) <= 20, top
    method = ROOT / "recap" / "drafters" / "recap"
    assert {"drafter.py", "config.py", "fusion.py", "search.py", "kernel.py", "budget.py"} <= {
        p.name for p in method.iterdir()
    }


#: What only RECAP learns: beside the method, not in the memories RECAP shares with Token Recycling.
RECAP_ONLY_MEMORIES = ("context", "backoff", "continuations", "estimates", "recycle", "stream")


def test_the_shared_memories_import_no_drafter_and_recaps_own_live_beside_the_method():
    """`recap.memory` holds what RECAP and Token Recycling share (records, the 1-token memory, the
    recycling keys) and imports no drafter; the memories only RECAP reads live in `recap.drafters.recap`."""
    upward = {
        path.name: sorted(m for m in imports_of(path) if m.startswith("recap.drafters"))
        for path in modules_under("recap/memory")
    }
    assert {name: found for name, found in upward.items() if found} == {}
    shared = {p.stem for p in (ROOT / "recap" / "memory").glob("*.py")}
    method = {p.stem for p in (ROOT / "recap" / "drafters" / "recap").glob("*.py")}
    assert set(RECAP_ONLY_MEMORIES) <= method and not set(RECAP_ONLY_MEMORIES) & shared


def test_importing_the_runtime_imports_no_scene_world():
    upper = "('recap.embedded', 'recap.bench', 'recap.studio')"
    loaded = f"sorted(m for m in sys.modules if m.startswith({upper}))"
    code = f"import sys, recap.runtime, recap.decode, recap.drafters; print({loaded})"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_only_the_vllm_internals_module_imports_vllm():
    """vLLM is optional and moves between releases: one module of the library touches it."""
    users = sorted(
        path.relative_to(ROOT).as_posix()
        for path in modules_under("recap")
        if any(m == "vllm" or m.startswith("vllm.") for m in imports_of(path))
    )
    assert users == ["recap/vllm/internals.py"]


#: The studio's pure renderers: step records in, HTML, figures and rows out.
RENDERERS = ("render", "figures", "tables", "explain", "drawing", "story", "measure")


def test_the_studio_guard_lies_below_its_teaching_and_the_renderers_know_no_guard():
    """`recap.studio.guard` (the public Space's bounds) imports nothing of `recap.studio.ui` (the
    teaching) nor the studio's wiring; the renderers import nothing of the guard nor the serving."""
    studio = ROOT / "recap" / "studio"
    above = ("recap.studio.ui", "recap.studio.serving", "recap.studio.demo")
    upward = {
        path.name: sorted(m for m in imports_of(path) if m.startswith(above))
        for path in sorted((studio / "guard").glob("*.py"))
    }
    assert {name: found for name, found in upward.items() if found} == {}
    guarded = {
        name: sorted(m for m in imports_of(studio / "ui" / f"{name}.py")
                     if m.startswith(("recap.studio.guard", "recap.studio.serving")))
        for name in RENDERERS
    }  # fmt: skip
    assert {name: found for name, found in guarded.items() if found} == {}
