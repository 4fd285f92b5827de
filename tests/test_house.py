"""The repository's own papers: licence, citation and README agree with each other."""

from __future__ import annotations

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
