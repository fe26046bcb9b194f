"""Pull the candidate module out of a model's reply.

Replies come in every shape: one fenced block (the asked-for case), several blocks (a CUDA
source, then the Python module; a draft, then a fix), a block cut off by ``max_tokens``, bare
code with no fences at all, or prose only. :func:`extract_code` answers ``(source, reason)``:

=====================  =======================================================================
reason                 meaning
=====================  =======================================================================
``ok``                 exactly one fenced block, and it defines ``ModelNew``
``multiple_blocks``    several blocks; the (last) one defining ``ModelNew`` was picked
``unfenced``           no fences; the reply (from its first line of code on) is a module
``truncated``          a fence was opened and never closed and no complete block defines
                       ``ModelNew``: the reply was cut off (raise ``max_tokens``)
``no_model_new``       code was found but none of it defines ``class ModelNew``
``no_code_block``      no code at all
=====================  =======================================================================

``source`` is None unless the reason is ``ok``, ``multiple_blocks`` or ``unfenced``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

OK_REASONS = frozenset({"ok", "multiple_blocks", "unfenced"})

_FENCE = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+#.-]*)[^\n`]*$")
_MODEL_NEW = re.compile(r"^[ \t]*class[ \t]+ModelNew\b", re.MULTILINE)
_CODE_START = re.compile(r"^(import |from \S+ import |class |def |@|#!|\"\"\"|''')", re.MULTILINE)


@dataclass
class Block:
    lang: str
    text: str
    closed: bool

    @property
    def defines_model_new(self) -> bool:
        return bool(_MODEL_NEW.search(self.text))


@dataclass
class Extraction:
    source: str | None
    reason: str
    blocks: list[Block] = field(default_factory=list)
    picked: int | None = None  # index into blocks of the block returned

    def record(self) -> dict[str, object]:
        """A small summary for the agent's plan and transcripts."""
        return {
            "reason": self.reason,
            "blocks": len(self.blocks),
            "picked": self.picked,
            "langs": [b.lang for b in self.blocks],
            "closed": [b.closed for b in self.blocks],
        }


def fenced_blocks(reply: str) -> list[Block]:
    """Every fenced block in order; an unterminated last block has ``closed=False``."""
    blocks: list[Block] = []
    lines = reply.splitlines()
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        fence = opened.group("fence")
        body: list[str] = []
        i += 1
        closed = False
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                closed = True
                i += 1
                break
            body.append(lines[i])
            i += 1
        blocks.append(
            Block(opened.group("lang").lower(), "\n".join(body).strip("\n") + "\n", closed)
        )
    return blocks


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


def _unfenced(reply: str) -> Extraction:
    start = _CODE_START.search(reply)
    if start is None:
        return Extraction(None, "no_code_block")
    source = reply[start.start() :].strip("\n") + "\n"
    if not _MODEL_NEW.search(source):
        return Extraction(None, "no_model_new")
    if _parses(source):
        return Extraction(source, "unfenced")
    # Prose after the code: keep the longest prefix that parses and still defines ModelNew.
    lines = source.splitlines()
    for end in range(len(lines) - 1, 0, -1):
        prefix = "\n".join(lines[:end]) + "\n"
        if _MODEL_NEW.search(prefix) and _parses(prefix):
            return Extraction(prefix, "unfenced")
    return Extraction(None, "truncated" if _looks_cut(source) else "no_model_new")


def _looks_cut(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError as err:
        return (
            "EOF" in str(err)
            or "was never closed" in str(err)
            or "expected an indented" in str(err)
        )
    return False


def extract(reply: str) -> Extraction:
    """The full account of what was found; see the module docstring for the reasons."""
    blocks = fenced_blocks(reply)
    if not blocks:
        return _unfenced(reply)
    complete = [i for i, b in enumerate(blocks) if b.closed and b.defines_model_new]
    if complete:
        picked = complete[-1]
        reason = "ok" if len(blocks) == 1 else "multiple_blocks"
        return Extraction(blocks[picked].text, reason, blocks, picked)
    if any(not b.closed for b in blocks):
        return Extraction(None, "truncated", blocks)
    return Extraction(None, "no_model_new", blocks)


def extract_code(reply: str) -> tuple[str | None, str]:
    """``(source, reason)``: the candidate module in ``reply``, or None and why not."""
    found = extract(reply)
    return found.source, found.reason
