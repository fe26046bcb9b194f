"""``digest`` covers every tensor the harness hashes, including a loss's 0-d output."""

from __future__ import annotations

import torch

from kforge.verifier.inputs import digest


def test_digest_of_scalar_and_empty_tensors() -> None:
    loss = torch.tensor(1.5)
    assert digest([loss]) == digest([torch.tensor(1.5)])
    assert digest([loss]) != digest([torch.tensor(2.5)])
    assert digest([torch.empty(0, 3)]) != digest([torch.empty(3, 0)])  # shapes count too
