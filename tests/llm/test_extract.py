"""kforge.agents.extract: every shape of reply a model sends."""

from __future__ import annotations

import pytest

from kforge.agents.extract import extract, extract_code, fenced_blocks

MODULE = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def test_one_fenced_block() -> None:
    assert extract_code(f"Sure.\n```python\n{MODULE}```\nThat is all.") == (MODULE, "ok")


def test_tilde_fences_and_longer_fences() -> None:
    assert extract_code(f"~~~py\n{MODULE}~~~") == (MODULE, "ok")
    inner = MODULE + '\nDOC = """\n```\n"""\n'
    assert extract_code(f"````python\n{inner}````") == (inner, "ok")


def test_two_blocks_pick_the_one_defining_model_new() -> None:
    reply = f'```cpp\nextern "C" void k();\n```\nand\n```python\n{MODULE}```\n'
    found = extract(reply)
    assert (found.source, found.reason, found.picked) == (MODULE, "multiple_blocks", 1)
    assert found.record()["langs"] == ["cpp", "python"]


def test_a_draft_and_a_final_version_pick_the_last() -> None:
    final = MODULE.replace("return x", "return x * 1")
    found = extract(f"Draft:\n```python\n{MODULE}```\nBetter:\n```python\n{final}```")
    assert found.source == final and found.picked == 1


def test_an_unterminated_fence_is_truncated() -> None:
    assert extract_code(
        "```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    def f("
    ) == (
        None,
        "truncated",
    )


def test_a_complete_block_wins_over_a_later_cut_one() -> None:
    reply = f"```python\n{MODULE}```\nAlternative:\n```python\nclass ModelNew:\n    def f("
    assert extract_code(reply) == (MODULE, "multiple_blocks")


def test_plain_code_without_fences() -> None:
    assert extract_code(MODULE) == (MODULE, "unfenced")
    source, reason = extract_code("Here you go:\n" + MODULE + "\nThis should be faster.")
    assert reason == "unfenced" and source is not None and "faster" not in source
    assert "class ModelNew" in source


def test_plain_code_cut_off_is_truncated() -> None:
    assert extract_code("import torch\nclass ModelNew:\n    def f(self):\n        return (1,") == (
        None,
        "truncated",
    )


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("I cannot help with that.", "no_code_block"),
        ("```python\nimport torch\nclass Model:\n    pass\n```", "no_model_new"),
        ("import torch\n\ndef helper():\n    return 1\n", "no_model_new"),
        ("", "no_code_block"),
    ],
)
def test_no_usable_code(reply: str, reason: str) -> None:
    assert extract_code(reply) == (None, reason)


def test_fenced_blocks_report_closure() -> None:
    blocks = fenced_blocks("```\na\n```\n```python\nb\n")
    assert [(b.lang, b.text, b.closed) for b in blocks] == [
        ("", "a\n", True),
        ("python", "b\n", False),
    ]
