"""``kforge ship PROBLEM [--to DIR]`` and ``kforge audit FILE.intoto.json``.

``ship`` writes a shipped kernel as an importable module (``ModelNew`` under a short comment
header) and beside it ``<name>.intoto.json``: an in-toto Statement v1 whose subject is the module
and whose SLSA provenance v1 predicate names every input by sha256 in
``buildDefinition.resolvedDependencies``: the selection, verification, candidate records of
every round, kernel sources, transcripts, plans, the problem (record and source), the one-shot
example, analyses, the build record, the same-run timing profile, the verifier's code, the
prompt files, the agent settings (model and parameters) and the environment. The materials come
from ``kforge.provenance.trace_selection`` (the same walk as ``kforge provenance``) plus the
selection's inputs manifest. Anything the ship rule did not ship is refused.

``audit`` re-hashes the subject and every material from the store (read-only: nothing is
quarantined), checks that the statement's selection really shipped the listed source and
candidate, and names the first broken link. Statements are unsigned: they pin content, and the
store's digests make any change to it visible; who wrote the statement is out of scope.

``kforge audit`` exit status (:data:`AUDIT_EXIT_CODES`; one line on stderr, never a traceback):
0 the statement holds, 1 a broken link (named), 2 bad usage (argparse), 3 the statement file is
missing or unreadable, 4 it is not JSON, 5 it is JSON but not an in-toto v1 statement with a SLSA
provenance v1 predicate as ``kforge ship`` writes them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kforge.provenance import Link, ProvenanceError, find_selections, trace_selection
from kforge.store import Store, atomic_write, sha256_bytes

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://kforge.dev/ship/v1"
BUILDER_ID = "https://kforge.dev/kforge@0.1.0"
HEADER_MARK = "# --- end of KForge header ---\n"


class ShipError(Exception):
    pass


class AuditError(Exception):
    """A statement ``kforge audit`` cannot check at all; ``code`` is the command's exit status."""

    code = 1


class StatementMissing(AuditError):
    code = 3


class StatementNotJson(AuditError):
    code = 4


class NotAStatement(AuditError):
    code = 5


AUDIT_EXIT_CODES = {0: "the statement holds", 1: "a broken link (named on stderr)", 2: "bad usage",
                    StatementMissing.code: "the statement file is missing or unreadable",
                    StatementNotJson.code: "the statement file is not JSON",
                    NotAStatement.code: "not an in-toto v1 statement with a SLSA provenance v1 predicate"}


class _Shape(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class _Digest(_Shape):
    sha256: str


class _Subject(_Shape):
    name: str
    digest: _Digest


class _Annotations(_Shape):
    kind: str


class _Material(_Shape):
    name: str
    digest: _Digest
    annotations: _Annotations


class _BuildDefinition(_Shape):
    resolvedDependencies: list[_Material]  # the SLSA field names


class _Predicate(_Shape):
    buildDefinition: _BuildDefinition


class Statement(_Shape):
    """The parts of an in-toto v1 statement ``audit`` reads (others are kept, not checked)."""

    type: str = Field(alias="_type")
    subject: list[_Subject] = Field(min_length=1)
    predicateType: str
    predicate: _Predicate


def _flatten(link: Link) -> list[tuple[str, str]]:
    found = [(link.role, link.digest)]
    for child in link.children:
        found.extend(_flatten(child))
    return found


def materials(store: Store, best: Path, chain: Link) -> list[dict[str, Any]]:
    """Every input by digest, in chain order, each listed once."""
    sel = json.loads(best.read_bytes())
    items: list[tuple[str, str, str]] = [(role, digest, "") for role, digest in _flatten(chain)]
    rdir = best.parent / f"r{sel['best_round']}"
    verify = json.loads((rdir / "verify.json").read_bytes())
    items.append(("problem_source", verify["problem_source"], "the problem module"))
    compiled = rdir / "compile.json"
    if compiled.is_file():
        raw = compiled.read_bytes()
        items.append(("build", sha256_bytes(raw), str(compiled)))
        if json.loads(raw).get("log"):
            items.append(("build_log", json.loads(raw)["log"], ""))
    for role, digest, _ in list(items):
        if role == "analysis":  # the analysis agent's transcript behind each optimize round
            transcript = json.loads(store.get_bytes(digest)).get("transcript")
            if transcript:
                items.append(("analysis_transcript", transcript, ""))
    if sel.get("inputs"):
        manifest = store.get_json(sel["inputs"])
        items.append(("inputs_manifest", sel["inputs"], "verifier code, prompts, agent, environment"))
        items += [("verifier_code", d, name) for name, d in sorted(manifest["verifier_code"].items())]
        items += [("prompt", d, name) for name, d in sorted(manifest["prompts"].items())]
        items += [("agent_settings", manifest["agent"], "model and parameters"),
                  ("environment", manifest["environment"], "python, os, torch, build tools, device")]
    seen: set[str] = set()
    out = []
    for role, digest, note in items:
        if digest in seen or len(digest) != 64:
            continue
        seen.add(digest)
        out.append({"name": note or role, "digest": {"sha256": digest},
                    "annotations": {"kind": role, "store": f"cas/sha256/{digest[:2]}/{digest[2:]}"}})
    return out


def _pick(root: Path, problem: str, platform: str | None, agent: str | None) -> Path:
    found = [b for b in find_selections(root, problem)
             if (platform is None or b.parts[-4] == platform) and (agent is None or b.parts[-5] == agent)]
    if not found:
        raise ShipError(f"no selection for {problem!r} matches --platform/--agent")
    shipped = [b for b in found if json.loads(b.read_bytes()).get("shipped")]
    if not shipped:
        lines = []
        for b in found:
            d = json.loads(b.read_bytes())
            lines.append(f"{d['agent']}/{d['platform']}: status {d['status']}: {d.get('detail', '')}")
        raise ShipError(f"{problem} is not shipped; the PyTorch reference is the answer.\n  " + "\n  ".join(lines))
    if len(shipped) > 1:
        names = ", ".join(f"--agent {b.parts[-5]} --platform {b.parts[-4]}" for b in shipped)
        raise ShipError(f"{problem} shipped in {len(shipped)} cells; pick one: {names}")
    return shipped[0]


def header(sel: dict[str, Any], verdict: dict[str, Any], verifier_digest: str, statement: str) -> str:
    return (
        f"# Shipped by KForge: problem {sel['problem']} (suite {sel['suite']}), platform {sel['platform']}, "
        f"agent {sel['agent']}\n"
        f"# policy {sel['policy']} (atol {verdict['atol']:g}, rtol {verdict['rtol']:g}; max abs err "
        f"{verdict.get('max_abs_err')}), device {sel['device']}\n"
        f"# speedup {sel['speedup_vs_best']:.2f}x over the faster of eager and torch.compile "
        f"(paired median; 95% lower bound {sel['speedup_low']:.2f}x > ship floor {sel['ship_floor']:.2f}x); "
        f"{sel['candidate_ms']:.4f} ms\n"
        f"# verifier code {verifier_digest}; kernel source sha256 {sel['best_source']}\n"
        f"# provenance: {statement} (check it: kforge audit {statement})\n"
        + HEADER_MARK
    )


def ship(root: Path, problem: str, to: Path, *, platform: str | None = None, agent: str | None = None) -> Path:
    """Write ``<to>/<problem>.py`` and ``<to>/<problem>.intoto.json``; return the statement path."""
    store = Store(root)
    best = _pick(root, problem, platform, agent)
    chain = trace_selection(store, best)
    broken = chain.broken()
    if broken:
        raise ShipError(f"provenance of {best} is broken at {broken[0].role} {broken[0].digest[:16]}: {broken[0].note}")
    sel = json.loads(best.read_bytes())
    verdict = json.loads((best.parent / f"r{sel['best_round']}" / "verify.json").read_bytes())["verdict"]
    manifest = store.get_json(sel["inputs"]) if sel.get("inputs") else {}
    module_name, statement_name = f"{problem}.py", f"{problem}.intoto.json"
    source = store.get_text(sel["best_source"])
    module = header(sel, verdict, manifest.get("verifier_code_digest", "unknown"), statement_name) + source
    to.mkdir(parents=True, exist_ok=True)
    atomic_write(to / module_name, module.encode())
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": module_name, "digest": {"sha256": sha256_bytes(module.encode())}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {k: sel[k] for k in ("agent", "platform", "suite", "problem", "policy")},
                "internalParameters": {k: sel[k] for k in (
                    "status", "best_round", "candidate_ms", "eager_ms", "compile_ms", "speedup_vs_best",
                    "speedup_low", "speedup_high", "ship_floor", "candidate_cv", "eager_cv", "compile_cv",
                    "device")},
                "resolvedDependencies": materials(store, best, chain),
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID},
                "metadata": {"invocationId": f"sha256:{sha256_bytes(best.read_bytes())}",
                             "finishedOn": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
            },
        },
    }
    path = to / statement_name
    atomic_write(path, (json.dumps(statement, indent=1, sort_keys=False) + "\n").encode())
    return path


def load_statement(path: Path) -> Statement:
    """The statement at ``path``, or :class:`StatementMissing`, :class:`StatementNotJson`,
    :class:`NotAStatement` saying what is wrong in one line."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StatementMissing(f"{path}: no such file (give the .intoto.json that kforge ship wrote)") from None
    except OSError as err:
        raise StatementMissing(f"{path}: cannot read it: {err.strerror or err}") from None
    try:
        data = json.loads(raw)
    except UnicodeDecodeError:
        raise StatementNotJson(f"{path}: not JSON (not even UTF-8 text): is it the .intoto.json kforge ship wrote?") from None
    except json.JSONDecodeError as err:
        raise StatementNotJson(f"{path}: not JSON ({err.msg} at line {err.lineno} column {err.colno}): "
                               "is it the .intoto.json kforge ship wrote?") from None
    what = f"{path}: not an in-toto v1 statement with a SLSA provenance v1 predicate"
    if not isinstance(data, dict):
        raise NotAStatement(f"{what} (a JSON {type(data).__name__}, not an object)")
    try:
        st = Statement.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise NotAStatement(f"{what} ('{where}': {first['msg']})") from None
    if st.type != STATEMENT_TYPE:
        raise NotAStatement(f"{what} (_type is {st.type!r}, not {STATEMENT_TYPE})")
    if st.predicateType != PREDICATE_TYPE:
        raise NotAStatement(f"{what} (predicateType is {st.predicateType!r}, not {PREDICATE_TYPE})")
    return st


def _selection(store: Store, digest: str) -> dict[str, Any] | None:
    """The selection record behind a verified digest (None: that blob is no selection record)."""
    try:
        data = json.loads(store.blob_path(digest).read_bytes())
    except ValueError:
        return None
    return data if isinstance(data, dict) and data.get("kind") == "selection" else None


def audit(statement_path: Path, root: Path) -> list[str]:
    """Every broken link, in statement order (empty: the statement holds). A file that is no
    statement at all raises an :class:`AuditError`."""
    store = Store(root)
    st = load_statement(statement_path)
    broken = []
    deps = st.predicate.buildDefinition.resolvedDependencies
    by_kind = {d.annotations.kind: d.digest.sha256 for d in reversed(deps)}
    for subject in st.subject:
        path = statement_path.parent / subject.name
        want = subject.digest.sha256
        if not path.is_file():
            broken.append(f"subject {subject.name}: missing beside the statement")
        elif (got := sha256_bytes(raw := path.read_bytes())) != want:
            broken.append(f"subject {subject.name}: hashes to {got[:16]}, the statement says {want[:16]}: tampered")
        else:
            body = raw.split(HEADER_MARK.encode(), 1)[-1]
            if sha256_bytes(body) != by_kind.get("source"):
                broken.append(f"subject {subject.name}: its kernel is not the source the statement names")
    for dep in deps:
        kind, digest = dep.annotations.kind, dep.digest.sha256
        problem = store.check_blob(digest)
        if problem:
            broken.append(f"{kind} {dep.name} sha256:{digest[:16]}: {problem}")
    if "selection" in by_kind and not store.check_blob(by_kind["selection"]):
        sel = _selection(store, by_kind["selection"])
        if sel is None:
            broken.append(f"selection sha256:{by_kind['selection'][:16]}: not a selection record")
            return broken
        for field, kind in (("best_source", "source"), ("best_candidate", "candidate")):
            if sel.get(field) != by_kind.get(kind):
                broken.append(f"selection: names {field} {str(sel.get(field))[:16]}, the statement lists {kind} "
                              f"{str(by_kind.get(kind))[:16]}")
        if not sel.get("shipped"):
            broken.append(f"selection: status {sel.get('status')}, not shipped")
    return broken


def cmd_ship(args: argparse.Namespace) -> int:
    try:
        path = ship(Path(args.store), args.problem, Path(args.to), platform=args.platform, agent=args.agent)
    except (ShipError, ProvenanceError) as err:
        print(f"kforge ship: refused: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path.with_name(args.problem + '.py')} and {path}")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    """Exit status: see :data:`AUDIT_EXIT_CODES` (the module docstring)."""
    path = Path(args.statement)
    try:
        st = load_statement(path)
        broken = audit(path, Path(args.store))
    except AuditError as err:
        print(f"kforge audit: {err}", file=sys.stderr)
        return err.code
    if broken:
        print(f"first broken link: {broken[0]}", file=sys.stderr)
        for line in broken[1:]:
            print(f"also broken: {line}", file=sys.stderr)
        return 1
    n = len(st.predicate.buildDefinition.resolvedDependencies)
    print(f"ok: {len(st.subject)} subject(s) and {n} materials re-hashed from {args.store}; nothing changed")
    return 0


def add_ship_parsers(sub: Any) -> None:
    p = sub.add_parser("ship", help="write a shipped kernel as a module plus an in-toto/SLSA provenance statement")
    p.add_argument("problem")
    p.add_argument("--to", default="shipped", help="folder to write into (default: ./shipped)")
    p.add_argument("--platform")
    p.add_argument("--agent")
    p.add_argument("--store", default="artifacts")
    p.set_defaults(func=cmd_ship)
    p = sub.add_parser("audit", help="re-hash every subject and material of a shipped kernel's statement",
                       description="Re-hash every subject and material of a statement kforge ship wrote "
                                   "(read-only).",
                       epilog="exit status: " + "; ".join(f"{c} {why}" for c, why in sorted(AUDIT_EXIT_CODES.items())))
    p.add_argument("statement", help="FILE.intoto.json written by kforge ship")
    p.add_argument("--store", default="artifacts")
    p.set_defaults(func=cmd_audit)
