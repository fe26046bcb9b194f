"""`kforge ship` writes an importable module and an in-toto/SLSA statement for shipped kernels
only; `kforge audit` re-hashes everything and names the first broken link, whatever was tampered."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.ship import ShipError, audit, ship
from tests.report_fixtures import STARTER, build_run


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("ship")
    root = build_run(base).root
    statement = ship(root, "softmax_rows", base / "out", platform="cpu")
    return root, statement


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kforge.cli", *args], capture_output=True, text=True)


def test_module_imports_and_matches_the_reference(shipped: tuple[Path, Path]) -> None:
    import torch

    _, statement = shipped
    module_path = statement.with_name("softmax_rows.py")
    head = module_path.read_text().splitlines()[:6]
    assert head[0].startswith("# Shipped by KForge: problem softmax_rows")
    assert any("speedup 2.00x" in line for line in head) and any("verifier code" in line for line in head)
    spec = importlib.util.spec_from_file_location("shipped_softmax", module_path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = torch.randn(4, 8)
    ref_spec = importlib.util.spec_from_file_location("ref", STARTER / "softmax_rows.py")
    assert ref_spec and ref_spec.loader
    ref = importlib.util.module_from_spec(ref_spec)
    ref_spec.loader.exec_module(ref)
    torch.testing.assert_close(module.ModelNew()(x), ref.Model()(x))


def test_statement_is_in_toto_v1_with_slsa_provenance(shipped: tuple[Path, Path]) -> None:
    _, statement = shipped
    st = json.loads(statement.read_text())
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == "https://slsa.dev/provenance/v1"
    assert st["subject"][0]["name"] == "softmax_rows.py" and len(st["subject"][0]["digest"]["sha256"]) == 64
    deps = st["predicate"]["buildDefinition"]["resolvedDependencies"]
    kinds = {d["annotations"]["kind"] for d in deps}
    assert {"selection", "verification", "candidate", "source", "transcript", "problem", "problem_source",
            "example", "timing", "verifier_code", "prompt", "agent_settings", "environment", "build"} <= kinds
    assert all(len(d["digest"]["sha256"]) == 64 for d in deps)
    assert len({d["digest"]["sha256"] for d in deps}) == len(deps)  # each input once


def test_audit_passes_on_an_untouched_ship(shipped: tuple[Path, Path]) -> None:
    root, statement = shipped
    assert audit(statement, root) == []
    proc = cli("audit", str(statement), "--store", str(root))
    assert proc.returncode == 0 and proc.stdout.startswith("ok:"), proc.stderr


@pytest.mark.parametrize("problem", ["gemm_bias_relu", "layernorm_rows", "elementwise_swish_bias",
                                     "reduce_mean_rows", "logsoftmax_rows"])
def test_ship_refuses_anything_not_shipped(shipped: tuple[Path, Path], tmp_path: Path, problem: str) -> None:
    root, _ = shipped
    with pytest.raises(ShipError, match="is not shipped"):
        ship(root, problem, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_ship_command_says_why_it_refuses(shipped: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = shipped
    proc = cli("ship", "gemm_bias_relu", "--to", str(tmp_path / "o"), "--store", str(root))
    assert proc.returncode == 2 and "refused" in proc.stderr and "no_gain: 0.63x" in proc.stderr


def _kinds(statement: Path) -> dict[str, str]:
    deps = json.loads(statement.read_text())["predicate"]["buildDefinition"]["resolvedDependencies"]
    first: dict[str, str] = {}
    for d in deps:
        first.setdefault(d["annotations"]["kind"], d["digest"]["sha256"])
    return first


KINDS = ["selection", "verification", "candidate", "source", "transcript", "plan", "problem", "example",
         "timing", "problem_source", "build", "inputs_manifest", "verifier_code", "prompt", "agent_settings",
         "environment"]


def _tampered_store(root: Path, tmp_path: Path, digest: str) -> Path:
    store = tmp_path / "artifacts"
    shutil.copytree(root / "cas" / "sha256", store / "cas" / "sha256")  # tamper with a copy
    blob = store / "cas" / "sha256" / digest[:2] / digest[2:]
    blob.write_bytes(blob.read_bytes() + b" ")
    return store


@pytest.mark.parametrize("kind", KINDS)
def test_audit_names_each_tampered_material(shipped: tuple[Path, Path], tmp_path: Path, kind: str) -> None:
    root, statement = shipped
    digest = _kinds(statement)[kind]
    broken = audit(statement, _tampered_store(root, tmp_path, digest))
    assert len(broken) == 1, broken
    assert broken[0].startswith(f"{kind} ") and digest[:16] in broken[0] and "tampered" in broken[0]


def test_audit_command_names_the_first_broken_link(shipped: tuple[Path, Path], tmp_path: Path) -> None:
    root, statement = shipped
    digest = _kinds(statement)["verification"]
    proc = cli("audit", str(statement), "--store", str(_tampered_store(root, tmp_path, digest)))
    assert proc.returncode == 1
    assert proc.stderr.startswith("first broken link: verification ") and digest[:16] in proc.stderr


def test_audit_names_a_missing_material(shipped: tuple[Path, Path], tmp_path: Path) -> None:
    root, statement = shipped
    shutil.copytree(root / "cas", tmp_path / "cas")
    digest = _kinds(statement)["transcript"]
    (tmp_path / "cas" / "sha256" / digest[:2] / digest[2:]).unlink()
    broken = audit(statement, tmp_path)
    assert broken and broken[0].startswith("transcript ") and "not in the store" in broken[0]


def test_audit_catches_an_edited_module_and_an_edited_statement(shipped: tuple[Path, Path], tmp_path: Path) -> None:
    root, statement = shipped
    for name in (statement.name, "softmax_rows.py"):
        shutil.copy(statement.with_name(name), tmp_path / name)
    module = tmp_path / "softmax_rows.py"
    module.write_text(module.read_text().replace("dim=-1", "dim=0"))
    assert audit(tmp_path / statement.name, root)[0].startswith("subject softmax_rows.py: hashes to")
    # re-pin the subject to the edited module: the kernel no longer matches the named source
    st = json.loads((tmp_path / statement.name).read_text())
    from kforge.store import sha256_bytes

    st["subject"][0]["digest"]["sha256"] = sha256_bytes(module.read_bytes())
    (tmp_path / statement.name).write_text(json.dumps(st))
    assert "its kernel is not the source the statement names" in audit(tmp_path / statement.name, root)[0]


def _statement_variants(statement: Path) -> dict[str, object]:
    good = json.loads(statement.read_text())
    no_deps = json.loads(statement.read_text())
    del no_deps["predicate"]["buildDefinition"]["resolvedDependencies"]
    return {
        "an object": {"hello": "world"},
        "a list": [1, 2, 3],
        "another predicate": {**good, "predicateType": "https://example.com/other/v9"},
        "another type": {**good, "_type": "https://in-toto.io/Statement/v0.1"},
        "no materials": no_deps,
        "no subject": {**good, "subject": []},
    }


@pytest.mark.parametrize("variant", ["an object", "a list", "another predicate", "another type", "no materials",
                                     "no subject"])
def test_audit_of_json_that_is_no_statement_is_one_line_exit_5(shipped: tuple[Path, Path], tmp_path: Path,
                                                               variant: str) -> None:
    root, statement = shipped
    path = tmp_path / "x.intoto.json"
    path.write_text(json.dumps(_statement_variants(statement)[variant]))
    proc = cli("audit", str(path), "--store", str(root))
    assert proc.returncode == 5, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"kforge audit: {path}: not an in-toto v1 statement")


@pytest.mark.parametrize(("content", "code"), [(None, 3), (b"{\"_type\": ", 4), (b"\xff\xfe\x00 not text", 4),
                                               (b"", 4)])
def test_audit_of_a_missing_or_non_json_file_is_one_line(shipped: tuple[Path, Path], tmp_path: Path,
                                                         content: bytes | None, code: int) -> None:
    root, _ = shipped
    path = tmp_path / "x.intoto.json"
    if content is not None:
        path.write_bytes(content)
    proc = cli("audit", str(path), "--store", str(root))
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"kforge audit: {path}: ")
    assert ("no such file" if content is None else "not JSON") in proc.stderr


def test_audit_of_a_folder_is_one_line_exit_3(shipped: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = shipped
    proc = cli("audit", str(tmp_path), "--store", str(root))
    assert proc.returncode == 3 and proc.stderr.count("\n") == 1 and "cannot read it" in proc.stderr


def test_audit_names_a_blob_with_one_flipped_byte_and_moves_nothing(shipped: tuple[Path, Path],
                                                                    tmp_path: Path) -> None:
    root, statement = shipped
    digest = _kinds(statement)["transcript"]
    store = tmp_path / "artifacts"
    shutil.copytree(root / "cas" / "sha256", store / "cas" / "sha256")
    blob = store / "cas" / "sha256" / digest[:2] / digest[2:]
    data = bytearray(blob.read_bytes())
    data[0] ^= 0x20
    blob.write_bytes(bytes(data))
    proc = cli("audit", str(statement), "--store", str(store))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"first broken link: transcript transcript sha256:{digest[:16]}: store copy hashes to")
    assert proc.stderr.rstrip().endswith("tampered") and proc.stderr.count("\n") == 1
    assert blob.read_bytes() == bytes(data) and not (store / "cas" / "quarantine").exists()


def test_audit_of_a_statement_naming_a_non_selection_blob_as_its_selection(shipped: tuple[Path, Path],
                                                                           tmp_path: Path) -> None:
    root, statement = shipped
    st = json.loads(statement.read_text())
    source = _kinds(statement)["source"]  # a kernel source: in the store, verifies, but is no record
    for dep in st["predicate"]["buildDefinition"]["resolvedDependencies"]:
        if dep["annotations"]["kind"] == "selection":
            dep["digest"]["sha256"] = source
    shutil.copy(statement.with_name("softmax_rows.py"), tmp_path / "softmax_rows.py")
    (tmp_path / statement.name).write_text(json.dumps(st))
    proc = cli("audit", str(tmp_path / statement.name), "--store", str(root))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "not a selection record" in proc.stderr
