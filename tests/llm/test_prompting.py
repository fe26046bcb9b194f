"""kforge.agents.prompting: scrubbing, truncation, images, digests."""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge.agents import prompting
from kforge.agents.prompting import (
    attach_image,
    feedback_text,
    prompt_digest,
    render_analysis_messages,
    render_generation_messages,
    scrub_paths,
    truncate,
)

from .helpers import analysis_request, feedback, generation_request

GCC = """In file included from /etc/shadow:1,
/etc/shadow:1:5: error: expected ';' before ':' token
    1 | root:x:0:0:root:/root:/bin/bash
      |     ^
/tmp/build-1/kernel.cpp:7:3: error: 'y' was not declared in this scope
    7 |   y = 1;
      |   ^"""


def test_compiler_excerpts_of_other_files_are_dropped() -> None:
    text = scrub_paths(GCC)
    assert "root:x:0:0" not in text and "/tmp/build-1" not in text
    assert "<external>/etc/shadow:1:5: error" in text and "\n/etc" not in text
    assert "kernel.cpp:7:3: error: 'y' was not declared" in text
    assert "    7 |   y = 1;" in text  # the candidate's own excerpt stays


def test_python_frames_outside_the_candidate_lose_their_code_lines() -> None:
    text = scrub_paths(
        "Traceback (most recent call last):\n"
        '  File "/work/x/candidate.py", line 4, in forward\n'
        "    return kernel(x)\n"
        '  File "/opt/venv/lib/site-packages/torch/functional.py", line 9, in kernel\n'
        "    private = 1\n"
        "RuntimeError: boom in /opt/venv/lib/site-packages/torch/functional.py"
    )
    assert 'File "candidate.py", line 4' in text and "return kernel(x)" in text
    assert "private = 1" not in text and "/opt/venv" not in text
    assert "RuntimeError: boom in <external>/torch/functional.py" in text


def test_urls_and_relative_paths_are_left_alone() -> None:
    text = "see https://docs.python.org/3/library and ./kernel.cpp:3"
    assert scrub_paths(text) == text


def test_feedback_is_scrubbed_then_truncated() -> None:
    detail = "/usr/include/x.h:1:1: error\n" + "y" * 10000
    shown = feedback_text(detail)
    assert "/usr/include" not in shown and "characters cut" in shown
    assert len(shown) < prompting.FEEDBACK_CHARS + 200
    assert truncate("short") == "short"


def test_generation_messages_carry_the_feedback() -> None:
    request = generation_request(round=1, feedback=[feedback("error: frobnicate")])
    system, user = render_generation_messages(request)
    assert system["role"] == "system" and "error: frobnicate" in user["content"]


def test_attach_image_turns_the_user_message_into_parts() -> None:
    messages = render_analysis_messages(analysis_request())
    with_image = attach_image(messages, "QUJD", "a picture")
    assert isinstance(messages[-1]["content"], str)  # the input is not modified
    parts = with_image[-1]["content"]
    assert [p["type"] for p in parts] == ["text", "text", "image_url"]
    assert parts[2]["image_url"]["url"] == "data:image/png;base64,QUJD"
    with pytest.raises(ValueError):
        attach_image([{"role": "system", "content": "x"}], "QUJD", "c")


def test_prompt_digest_follows_the_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = prompt_digest("system", "generate")
    names = ("system", "generate", "analyze", "contract", "device", "progress")
    for name in names:
        (tmp_path / f"{name}.md").write_text(prompting.prompt_text(name))
    monkeypatch.setattr(prompting, "PROMPTS_DIR", tmp_path)
    assert prompt_digest("system", "generate") == before
    (tmp_path / "generate.md").write_text(prompting.prompt_text("generate") + "\nBe brief.\n")
    assert prompt_digest("system", "generate") != before
    assert prompt_digest("system", "analyze") != prompt_digest("system", "generate")
    # a section a template includes is part of its digest
    analyze_before = prompt_digest("system", "analyze")
    (tmp_path / "contract.md").write_text(prompting.prompt_text("contract") + "\nMore.\n")
    assert prompt_digest("system", "analyze") != analyze_before


def test_measurement_noise_stays_out_of_the_profile_summary() -> None:
    profile = analysis_request().profile.model_copy(
        update={"extra": {"sandbox": "bwrap", "clock": "x", "seconds": 3.0, "occupancy": 0.5}}
    )
    summary = prompting.profile_summary(profile)
    assert "occupancy: 0.5" in summary and "bwrap" not in summary and "seconds" not in summary
