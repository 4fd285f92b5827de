"""scripts.near_ties perturbs a tree pass's logits by the relative noise it is given, and only by it."""

from __future__ import annotations

import pytest
import torch

from scripts import near_ties


def test_the_perturbed_pass_moves_the_logits_by_the_relative_noise_only():
    logits = torch.linspace(-8.0, 8.0, 64).reshape(4, 16)

    def forward(self, state, pending, tree):
        return logits.clone()

    assert torch.equal(near_ties.perturbed(forward, 0.0)(None, None, [], None), logits)
    moved = near_ties.perturbed(forward, 1e-6)(None, None, [], None)
    relative = ((moved - logits).abs() / logits.abs().clamp_min(1e-12)).max().item()
    assert 0 < relative < 1e-5
    again = near_ties.perturbed(forward, 1e-6)(None, None, [], None)
    assert torch.equal(moved, again)  # seeded: every run of the script perturbs alike


def test_absurd_settings_are_refused():
    for argv in (["--noise", "0"], ["--noise", "2"], ["--samples", "0"]):
        with pytest.raises(SystemExit):
            near_ties.main(argv)
