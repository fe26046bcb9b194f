"""Input contents (``content.py``): the candidate's in-place refill and the judge's rebuild
agree bit for bit, contents never repeat, domains and zero patterns hold, and undo is exact."""

from __future__ import annotations

import random

import torch

from kforge.verifier.content import Content, LiveSet, capabilities, draw, rebuild, swaps


def _base() -> list:
    torch.manual_seed(0)
    return [torch.randn(40, 30), torch.rand(500), torch.tril(torch.randn(16, 16)), torch.tensor([3, 1, 2]), 7]


def test_the_live_set_and_the_rebuild_agree_bit_for_bit_over_a_long_run() -> None:
    base = _base()
    caps = capabilities(base)
    live = LiveSet(base, caps)
    pointers = [v.data_ptr() for v in live.values if isinstance(v, torch.Tensor)]
    rng = random.Random(5)
    seen = set()
    for _ in range(60):
        content = draw(rng)
        got = live.load(content)
        want = rebuild(base, content, caps)
        for g, w in zip(got, want, strict=True):
            if isinstance(g, torch.Tensor):
                assert torch.equal(g.view(torch.int32) if g.dtype == torch.float32 else g,
                                   w.view(torch.int32) if w.dtype == torch.float32 else w)
            else:
                assert g == w
        seen.add(got[0].sum().item())
    assert [v.data_ptr() for v in live.values if isinstance(v, torch.Tensor)] == pointers  # in place
    assert len(seen) == 60  # every call saw contents no earlier call saw
    assert live.values[0]._version == 0  # through .data: the version counter never moved
    back = live.load(Content(1, exp=0, sign=1))
    assert torch.equal(rebuild(base, Content(1, exp=0, sign=1), caps)[0], back[0])


def test_domains_zeros_and_integers_hold() -> None:
    base = _base()
    caps = capabilities(base)
    assert caps[0].sign and not caps[1].sign  # torch.rand's [0, 1) never flips sign
    assert not caps[3].scale and not caps[3].swap  # integers (indices) keep the problem's own
    for seed in range(20):
        out = rebuild(base, Content(seed, exp=1, sign=-1), caps)
        assert bool((out[1] >= 0).all()) and float(out[1].max()) <= 2.0
        assert torch.equal(torch.triu(out[2], diagonal=1), torch.zeros(16, 16))  # triangular stays so
        assert torch.equal(out[3], base[3]) and out[4] == 7
    assert swaps(1) == 0 and swaps(2) == 1 and swaps(40 * 30) == 18


def test_contents_move_elements_a_sampled_key_does_not_see() -> None:
    base = [torch.randn(64, 64)]
    a, b = rebuild(base, Content(1)), rebuild(base, Content(2))
    changed = (a[0] != b[0]).sum().item()
    assert 0 < changed < a[0].numel() // 8  # a few positions: a cache keyed on others stays blind
    assert Content.from_json(Content(9, -1, -1).to_json()) == Content(9, -1, -1)
