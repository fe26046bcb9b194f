"""Provenance: the chain of artifacts and digests that led to a shipped kernel, checked link by
link. Every record names what it used by sha256; a link is broken when the bytes behind a
digest no longer hash to it (in the store or in the run folder), and the walk says which.

Every blob a link names is re-hashed from the store (:meth:`kforge.store.Store.check_blob`):
read-only, so the walk quarantines nothing and reports the same broken link each time."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kforge.store import Store


@dataclass
class Link:
    role: str
    digest: str
    ok: bool
    note: str = ""
    children: list[Link] = field(default_factory=list)

    def render(self, depth: int = 0) -> list[str]:
        mark = "ok  " if self.ok else "BROKEN"
        lines = [f"{'  ' * depth}{mark} {self.role:<12} {self.digest[:16]}  {self.note}"]
        for child in self.children:
            lines.extend(child.render(depth + 1))
        return lines

    def broken(self) -> list[Link]:
        found = [] if self.ok else [self]
        for child in self.children:
            found.extend(child.broken())
        return found


class ProvenanceError(LookupError):
    pass


def _blob(store: Store, role: str, digest: str | None, note: str = "") -> Link | None:
    if not digest:
        return None
    problem = store.check_blob(digest)
    return Link(role, digest, True, note) if problem is None else Link(role, digest, False, problem)


# the ``kind`` each record file of the walk holds (kforge.stages.records)
RECORD_KINDS = {"selection": "selection", "verification": "verify", "candidate": "candidate"}


def _record(store: Store, role: str, path: Path) -> tuple[Link, dict[str, Any] | None]:
    """A run-folder record: its file must hash to a digest whose store copy still hashes to it,
    and hold the kind of record its name says."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        return Link(role, "-" * 16, False, f"missing file {path}" if not path.exists() else f"{path}: {err}"), None
    digest = hashlib.sha256(raw).hexdigest()
    if not store.has(digest):
        return Link(role, digest, False, f"{path} was changed after it was written (no such record in the store)"), None
    problem = store.check_blob(digest)
    if problem is not None:
        return Link(role, digest, False, problem), None
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict) or data.get("kind") != RECORD_KINDS[role]:
        return Link(role, digest, False, f"{path} is not a {RECORD_KINDS[role]} record"), None
    return Link(role, digest, True, str(path)), data


def _candidate_chain(store: Store, round_dir: Path, depth_left: int = 32) -> Link:
    link, data = _record(store, "candidate", round_dir / "candidate.json")
    if data is None:
        return link
    link.note = f"r{data['round']} {data['mode']} by {data['agent']} ({data['model']})"
    kernel = round_dir / "kernel.py"
    if data.get("source"):
        src = _blob(store, "source", data["source"], str(kernel))
        if src is not None and kernel.is_file() and hashlib.sha256(kernel.read_bytes()).hexdigest() != data["source"]:
            src = Link("source", data["source"], False, f"{kernel} differs from the recorded source digest")
        link.children.append(src)  # type: ignore[arg-type]
    for role in ("transcript", "plan"):
        child = _blob(store, role, data.get(role))
        if child:
            link.children.append(child)
    for role, digest in sorted(data.get("used", {}).items()):
        child = _blob(store, role, digest, "record used")
        if child:
            link.children.append(child)
    if data.get("parent") and depth_left > 0:
        prev = round_dir.parent / f"r{data['round'] - 1}"
        parent = _candidate_chain(store, prev, depth_left - 1)
        if parent.digest != data["parent"] and parent.ok:
            parent = Link("parent", data["parent"], False, f"{prev}/candidate.json does not match the recorded parent")
        link.children.append(parent)
    return link


def trace_selection(store: Store, best: Path) -> Link:
    """The whole chain behind one ``best.json``: selection -> verification -> candidate -> ..."""
    link, data = _record(store, "selection", best)
    if data is None:
        return link
    link.note = f"{data['agent']}/{data['platform']}/{data['suite']}/{data['problem']} status={data['status']}"
    if data.get("best_round") is None:
        return link
    round_dir = best.parent / f"r{data['best_round']}"
    verify, vdata = _record(store, "verification", round_dir / "verify.json")
    if vdata is not None:
        verdict = vdata["verdict"]
        verify.note = f"{verdict['reason']} ({verdict['policy']}, sandbox={verdict['sandbox']})"
        if not verdict["ok"] or vdata.get("source") != data.get("best_source"):
            verify.ok = False
            verify.note += ": no passing verification of this exact source, cannot be shipped"
    link.children.append(verify)
    cand = _candidate_chain(store, round_dir)
    if cand.ok and data.get("best_candidate") and cand.digest != data["best_candidate"]:
        cand.ok, cand.note = False, "candidate record differs from the one selected"
    link.children.append(cand)
    timing = _blob(store, "timing", data.get("selection_profile"), "same-run timing vs eager and torch.compile")
    if timing:
        link.children.append(timing)
    return link


def find_selections(root: Path, query: str) -> list[Path]:
    """``best.json`` files for a problem name, or whose record, candidate or source digest
    starts with ``query``."""
    runs = root / "runs"
    found = []
    for best in sorted(runs.glob("*/*/*/*/best.json")):
        if best.parent.name == query:
            found.append(best)
            continue
        raw = best.read_bytes()
        try:
            data = json.loads(raw)
        except ValueError:
            data = None  # a damaged record: still found by its own digest, and the walk says so
        named = [data.get("best_candidate"), data.get("best_source")] if isinstance(data, dict) else []
        digests = [hashlib.sha256(raw).hexdigest(), *(d for d in named if isinstance(d, str))]
        if len(query) >= 6 and any(d.startswith(query) for d in digests):
            found.append(best)
    if not found:
        raise ProvenanceError(f"no shipped kernel matches {query!r} under {runs} (give a problem name or a digest prefix)")
    return found
