"""`kforge provenance` re-hashes every blob and record copy its chain names (read-only): a store
blob whose bytes no longer match its sha256 is a broken link, named on stderr, exit 1."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.report_fixtures import Cell, build_run


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_run(tmp_path_factory.mktemp("prov"), [Cell("softmax_rows")]).root


def provenance(root: Path, query: str = "softmax_rows") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kforge.cli", "provenance", query, "--store", str(root)],
                          capture_output=True, text=True)


def _digests(root: Path) -> dict[str, str]:
    """One digest per role of the chain, as the run folder names them."""
    run = root / "runs" / "expert" / "cpu" / "starter" / "softmax_rows"
    best = run / "best.json"
    sel = json.loads(best.read_bytes())
    rdir = run / f"r{sel['best_round']}"
    cand = json.loads((rdir / "candidate.json").read_bytes())
    return {
        "selection": hashlib.sha256(best.read_bytes()).hexdigest(),
        "verification": hashlib.sha256((rdir / "verify.json").read_bytes()).hexdigest(),
        "candidate": hashlib.sha256((rdir / "candidate.json").read_bytes()).hexdigest(),
        "source": cand["source"],
        "transcript": cand["transcript"],
        "timing": sel["selection_profile"],
    }


def _flip_one_byte(root: Path, digest: str) -> Path:
    blob = root / "cas" / "sha256" / digest[:2] / digest[2:]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    blob.write_bytes(bytes(data))
    return blob


def test_untouched_store_holds(store: Path) -> None:
    proc = provenance(store)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and "BROKEN" not in proc.stdout


@pytest.mark.parametrize("role", ["selection", "verification", "candidate", "source", "transcript", "timing"])
def test_a_flipped_byte_in_a_blob_is_a_broken_link(store: Path, tmp_path: Path, role: str) -> None:
    root = tmp_path / "artifacts"
    shutil.copytree(store, root)  # tamper with a copy
    digest = _digests(root)[role]
    blob = _flip_one_byte(root, digest)
    tampered = blob.read_bytes()
    proc = provenance(root)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert lines == [f"broken link: {role} {digest[:16]}: store copy hashes to "
                     f"{hashlib.sha256(tampered).hexdigest()[:16]}, not {digest[:16]}: tampered"], proc.stderr
    assert "Traceback" not in proc.stderr and "BROKEN" in proc.stdout
    # read-only: nothing was quarantined, and a second look says the same
    assert blob.read_bytes() == tampered and not (root / "cas" / "quarantine").exists()
    assert provenance(root).stderr == proc.stderr


def test_a_damaged_selection_file_is_named_not_a_traceback(store: Path, tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    shutil.copytree(store, root)
    best = root / "runs" / "expert" / "cpu" / "starter" / "softmax_rows" / "best.json"
    best.write_bytes(b"{not json")
    proc = provenance(root, hashlib.sha256(best.read_bytes()).hexdigest()[:12])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("broken link: selection ") and "was changed after it was written" in proc.stderr
