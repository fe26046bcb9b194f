"""``digest`` covers every tensor the harness hashes, including a loss's 0-d output; the
heavy-tailed draw is Cauchy-like and made of arithmetic that rounds the same everywhere."""

from __future__ import annotations

import torch

from kforge.verifier.inputs import _redraw, combine, digest, input_digests


def test_digest_of_scalar_and_empty_tensors() -> None:
    loss = torch.tensor(1.5)
    assert digest([loss]) == digest([torch.tensor(1.5)])
    assert digest([loss]) != digest([torch.tensor(2.5)])
    assert digest([torch.empty(0, 3)]) != digest([torch.empty(3, 0)])  # shapes count too


def test_per_input_digests_name_the_input_and_combine_into_the_digest() -> None:
    a, b = torch.ones(3), torch.zeros(2, 2)
    each = input_digests([a, b, 7])
    assert combine(each) == digest([a, b, 7])
    other = input_digests([a, b + 1, 7])
    assert [x == y for x, y in zip(each, other, strict=True)] == [True, False, True]


def test_heavy_draw_is_cauchy_like_clipped_and_thread_count_independent() -> None:
    def draw(threads: int) -> torch.Tensor:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return _redraw(torch.zeros(400_000), "heavy", torch.Generator().manual_seed(5))
        finally:
            torch.set_num_threads(before)

    x = draw(1)
    assert torch.equal(x, draw(2)) and x.dtype == torch.float32
    mag = x.abs()
    assert 0.9 < float(mag.median()) < 1.2  # Cauchy: 1.0
    assert 0.05 < float((mag > 10).float().mean()) < 0.1  # Cauchy: 0.063; a normal: 0
    assert float(mag.max()) == 1000.0 and float(x.min()) < 0 < float(x.max())
