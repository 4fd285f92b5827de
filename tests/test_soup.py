"""training.soup: the weight-by-weight average of two fine-tunings."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from training import soup


def _model(folder, weight: float):
    folder.mkdir()
    save_file(
        {"w": torch.full((2, 3), weight), "steps": torch.tensor([7], dtype=torch.long)},
        str(folder / soup.WEIGHTS),
    )
    (folder / "config.json").write_text(f'{{"weight": {weight}}}')
    return folder


def test_the_soup_is_the_weighted_mean_and_a_copy_of_the_other_folder(tmp_path):
    base, other = _model(tmp_path / "base", 1.0), _model(tmp_path / "other", 3.0)
    out = soup.soup(base, other, 0.25, tmp_path / "out")
    weights = load_file(str(out / soup.WEIGHTS))
    assert torch.equal(weights["w"], torch.full((2, 3), 1.5))  # 0.75 * 1 + 0.25 * 3
    assert weights["steps"].dtype == torch.long and weights["steps"].tolist() == [7]
    assert (out / "config.json").read_text() == '{"weight": 3.0}'
    for share, value in ((0.0, 1.0), (1.0, 3.0)):
        ends = soup.average(load_file(str(base / soup.WEIGHTS)), load_file(str(other / soup.WEIGHTS)), share)
        assert torch.equal(ends["w"], torch.full((2, 3), value))


def test_models_that_do_not_match_are_refused(tmp_path):
    one = {"w": torch.zeros(2, 3)}
    with pytest.raises(ValueError, match="different tensors"):
        soup.average(one, {"v": torch.zeros(2, 3)}, 0.5)
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        soup.average(one, {"w": torch.zeros(3, 2)}, 0.5)
    with pytest.raises(ValueError, match="share"):
        soup.average(one, one, 1.5)
    with pytest.raises(SystemExit):  # the CLI says what is missing instead of a traceback
        soup.main(
            [
                "--base",
                str(tmp_path),
                "--other",
                str(tmp_path),
                "--share",
                "0.5",
                "--out",
                str(tmp_path / "x"),
            ]
        )
