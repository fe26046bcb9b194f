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
import json
import re
import threading
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


# CPython 3.11 can raise "AST constructor recursion depth mismatch" (SystemError) when two
# threads parse at once (seen in CI); best-of-n samples are extracted in a thread pool.
_PARSE_LOCK = threading.Lock()


def parse(source: str) -> ast.Module:
    """``ast.parse``, one thread at a time."""
    with _PARSE_LOCK:
        return ast.parse(source)


def _parses(source: str) -> bool:
    try:
        parse(source)
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
        parse(source)
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


# --------------------------------------------------------------------------- recommendations
# An analyst's JSON is read leniently: what a model commonly gets "wrong" without being wrong
# (an extra key, "85%" for 85, "memory-bound" for memory, one action instead of a list) is
# normalised before validation; only a reply with no usable JSON object is a failure.

BOTTLENECKS = ("memory", "compute", "latency", "launch", "other", "unknown")
_SYNONYMS = {
    "bandwidth": "memory", "dram": "memory", "cache": "memory", "memory_bound": "memory",
    "flops": "compute", "math": "compute", "tensor": "compute", "compute_bound": "compute",
    "occupancy": "latency", "stall": "latency", "latency_bound": "latency",
    "overhead": "launch", "kernel_launch": "launch", "launch_overhead": "launch",
}
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


def number(value: object) -> float | None:
    """A number from ``85``, ``"85%"`` (85), ``"1.4x"`` (1.4), ``"12.5 GB/s"``; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        found = _NUMBER.search(value.replace(",", ""))
        return float(found.group(0)) if found else None
    return None


def bottleneck_name(value: object) -> str:
    """One of :data:`BOTTLENECKS`: exact, a synonym or prefix ("memory-bound"), else other."""
    text = re.sub(r"[\s-]+", "_", str(value or "").strip().lower())
    if text in BOTTLENECKS:
        return text
    for word in (text, text.split("_", 1)[0]):
        if word in BOTTLENECKS:
            return word
        if word in _SYNONYMS:
            return _SYNONYMS[word]
    return "other" if text else "unknown"


def _action(raw: object) -> dict[str, object] | None:
    if isinstance(raw, str):
        return {"kind": "other", "rationale": raw}
    if not isinstance(raw, dict):
        return None
    params = raw.get("params", {})
    gain = raw.get("expected_gain", 1.0)
    value = number(gain)
    if isinstance(gain, str) and gain.strip().endswith("%") and value is not None:
        value = 1.0 + value / 100.0  # "+30%" as an x-fold gain
    return {
        "kind": str(raw.get("kind") or "other").strip().lower() or "other",
        "params": params if isinstance(params, dict) else {"value": params},
        "expected_gain": value if value is not None and value > 0 else 1.0,
        "rationale": str(raw.get("rationale") or ""),
    }


def normalise_recommendation(data: dict[str, object]) -> dict[str, object]:
    """The fields of a Recommendation from a model's JSON object, leniently (see above)."""
    inner = data.get("recommendation")
    if "bottleneck" not in data and isinstance(inner, dict):
        data = inner
    evidence = data.get("evidence") or {}
    actions = data.get("actions") or []
    if isinstance(actions, dict):
        actions = [actions]
    return {
        "bottleneck": bottleneck_name(data.get("bottleneck")),
        "evidence": {
            str(k): v
            for k, v in ((k, number(v)) for k, v in (evidence.items() if isinstance(evidence, dict) else []))
            if v is not None
        },
        "actions": [a for a in (_action(x) for x in actions if x is not None) if a is not None]
        if isinstance(actions, list)
        else [],
        "summary": str(data.get("summary") or ""),
    }


def json_object(reply: str) -> tuple[dict[str, object] | None, str | None]:
    """The first JSON object in ``reply`` (bare, or in a fence), or None and why not."""
    body = reply.strip()
    blocks = [b for b in fenced_blocks(body) if "{" in b.text]
    if blocks:
        body = blocks[0].text
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end <= start:
        return None, "no JSON object in the reply"
    text = body[start : end + 1]
    for attempt in (text, _TRAILING_COMMA.sub(r"\1", text)):
        try:
            data = json.loads(attempt)
        except ValueError as err:
            problem = f"the JSON does not parse ({err})"
            continue
        if isinstance(data, dict):
            return data, None
        problem = "the JSON is not an object"
    return None, problem
