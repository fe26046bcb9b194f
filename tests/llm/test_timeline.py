"""kforge.agents.timeline: a deterministic PNG of a profile."""

from __future__ import annotations

import base64

from kforge.agents.timeline import render_timeline_png, timeline_png_b64
from kforge.schema import KernelStat, Profile

from .helpers import profile


def test_the_picture_is_a_png_and_deterministic() -> None:
    png = render_timeline_png(profile())
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png == render_timeline_png(profile())
    assert base64.b64decode(timeline_png_b64(profile())) == png


def test_the_picture_changes_with_the_profile() -> None:
    other = profile().model_copy(
        update={"kernels": [KernelStat(name="fused", calls=20, total_us=500.0)]}
    )
    assert render_timeline_png(other) != render_timeline_png(profile())


def test_an_empty_or_long_profile_still_renders() -> None:
    assert render_timeline_png(Profile(ok=False)).startswith(b"\x89PNG")
    many = [
        KernelStat(name=f"kernel_{i}_with_a_long_name", calls=10, total_us=10.0 + i)
        for i in range(40)
    ]
    assert render_timeline_png(profile().model_copy(update={"kernels": many})).startswith(
        b"\x89PNG"
    )
