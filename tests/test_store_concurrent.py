"""The store under concurrent writers: processes over one folder (what jobs on several nodes
over one shared filesystem are), and two real Snakemake processes over one store at once.

No lost or torn artifacts: every blob hashes to its name, readers see a whole blob or none,
no temp file is left, a reader quarantining a bad blob never takes a good one with it, and
what both pipelines recorded reads back from the store."""

from __future__ import annotations

import json
import multiprocessing as mp
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kforge.store import BlobNotFound, CorruptBlob, Store, canonical_json, digest_of, sha256_bytes
from tests.pipeline_helpers import REPO, write_config

FORK = mp.get_context("fork")


def _run_all(targets: list[tuple[Callable[..., None], tuple[Any, ...]]], timeout: float = 120) -> None:
    procs = [FORK.Process(target=fn, args=args) for fn, args in targets]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    codes = [p.exitcode for p in procs]
    assert codes == [0] * len(procs), f"worker exit codes {codes}"


def assert_store_whole(root: Path) -> int:
    """Every blob hashes to its name, every action entry is whole and names blobs that exist,
    nothing half-written is left; returns the number of blobs."""
    store = Store(root)
    blobs = [p for p in store.blobs.rglob("*") if p.is_file()]
    stray = [p for p in (store.root / "cas").rglob("*") if p.is_file() and p.name.startswith(".")]
    assert stray == [], f"temp or aside files left behind: {stray[:5]}"
    for path in blobs:
        assert sha256_bytes(path.read_bytes()) == path.parent.name + path.name, f"torn or wrong blob {path}"
    for path in store.actions.rglob("*.json"):
        entry = json.loads(path.read_bytes())
        assert entry["key"] == path.parent.name + path.stem
        for digest in entry["blobs"]:
            assert store.has(digest), f"action {path.name} names missing blob {digest}"
    quarantined = list(store.quarantine.iterdir()) if store.quarantine.exists() else []
    assert quarantined == [], f"good blobs quarantined: {quarantined}"
    return len(blobs)


# ---------------------------------------------------------------- processes over one folder
def _writer(root: str, payloads: list[bytes], seed: int, barrier: Any) -> None:
    store, order = Store(root), list(range(len(payloads)))
    random.Random(seed).shuffle(order)
    barrier.wait()
    for _ in range(3):
        for i in order:
            store.put_bytes(payloads[i])


def _reader(root: str, digests: list[str], barrier: Any, bad: Any) -> None:
    store = Store(root)
    barrier.wait()
    for _ in range(40):
        for d in digests:
            try:
                store.get_bytes(d)  # verifies: a torn read would raise CorruptBlob
            except BlobNotFound:
                pass
            except CorruptBlob:
                bad.value += 1


def test_processes_writing_the_same_blobs_leave_whole_files(tmp_path: Path) -> None:
    rng = random.Random(7)
    payloads = [rng.randbytes(rng.choice((1 << 10, 1 << 18, 3 << 20))) for _ in range(12)]
    digests = [sha256_bytes(p) for p in payloads]
    barrier, bad = FORK.Barrier(8), FORK.Value("i", 0)
    _run_all([(_writer, (str(tmp_path), payloads, s, barrier)) for s in range(5)]
             + [(_reader, (str(tmp_path), digests, barrier, bad)) for _ in range(3)])
    assert bad.value == 0, "a reader saw a torn or wrong blob"
    assert assert_store_whole(tmp_path) == len(payloads)
    assert [Store(tmp_path).get_bytes(d) for d in digests] == payloads


def _heal(root: str, payload: bytes, barrier: Any) -> None:
    barrier.wait()
    Store(root).put_bytes(payload)


def _check(root: str, digest: str, barrier: Any, delay: float) -> None:
    barrier.wait()
    time.sleep(delay)  # readers spread over the writer's check-write-rename
    try:
        Store(root).get_bytes(digest)
    except (CorruptBlob, BlobNotFound):
        pass


def test_a_reader_quarantining_a_bad_blob_never_takes_the_good_one(tmp_path: Path) -> None:
    # A reader reads a bad blob and, before it moves that aside, a writer renames the good blob
    # into place. Moving the path blindly then quarantined the GOOD blob: lost until rewritten.
    payload = random.Random(3).randbytes(8 << 20)  # hashing takes long enough to hit the window
    digest = sha256_bytes(payload)
    rng = random.Random(5)
    for trial in range(16):
        root = tmp_path / f"t{trial}"
        store = Store(root)
        path = store.blob_path(digest)
        path.parent.mkdir(parents=True)
        path.write_bytes(payload[:-1] + b"\0")  # bad bytes under the good name
        barrier = FORK.Barrier(7)
        _run_all([(_heal, (str(root), payload, barrier))]
                 + [(_check, (str(root), digest, barrier, rng.uniform(0, 0.1))) for _ in range(6)])
        assert path.is_file(), f"trial {trial}: the good blob was quarantined by a racing reader"
        assert store.get_bytes(digest) == payload
        for moved in store.quarantine.glob("*"):
            assert sha256_bytes(moved.read_bytes()) != digest, "a good copy sits in quarantine"


def _actions(root: str, key: str, worker: int, barrier: Any, bad: Any) -> None:
    store = Store(root)
    blob = store.put_text(f"log of worker {worker}")
    barrier.wait()
    for i in range(200):
        store.action_put(key, {"ok": True, "worker": worker, "i": i, "log": blob}, [blob])
        hit = store.action_get(key)
        if hit is not None and (hit.get("ok") is not True or store.get_text(hit["log"]) != f"log of worker {hit['worker']}"):
            bad.value += 1


def test_action_entries_are_replaced_whole(tmp_path: Path) -> None:
    key = digest_of({"stage": "verify", "source": "abc"})
    barrier, bad = FORK.Barrier(4), FORK.Value("i", 0)
    _run_all([(_actions, (str(tmp_path), key, w, barrier, bad)) for w in range(4)])
    assert bad.value == 0
    hit = Store(tmp_path).action_get(key)
    assert hit is not None and hit["ok"] is True
    assert_store_whole(tmp_path)


def test_a_corrupt_action_entry_is_a_miss_and_is_removed(tmp_path: Path) -> None:
    store = Store(tmp_path)
    key = digest_of({"stage": "compile"})
    store.action_put(key, {"ok": True})
    path = store._action_path(key)
    path.write_bytes(canonical_json({"key": "0" * 64, "result": {}}))  # an entry for another key
    assert store.action_get(key) is None
    assert not path.exists()
    path.write_bytes(b"{not json")
    assert store.action_get(key) is None and not path.exists()
    store.action_put(key, {"ok": True})
    assert store.action_get(key) == {"ok": True}


# ---------------------------------------------------------------- two Snakemake processes
PROBLEMS = ("softmax_rows",)


def _snakemake(workdir: Path) -> subprocess.Popen[str]:
    targets = [f"artifacts/runs/expert/cpu/tiny/{p}/r0/verify.json" for p in PROBLEMS]
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(workdir / "kforge.yaml"), "--cores", "1", *targets]
    log = open(workdir / "snakemake.log", "w")  # noqa: SIM115 - closed when the process is reaped
    return subprocess.Popen(cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_two_snakemake_processes_over_one_store(tmp_path: Path) -> None:
    """Two pipelines of one config write one content-addressed store (blobs and action cache)
    at once, as jobs on several nodes do: their action keys and blobs coincide. Each keeps its
    own run folder (``artifacts/cas`` is a link to the shared store): two Snakemake processes
    must not share output paths, since Snakemake deletes a job's old outputs before it runs
    the job, under the feet of the other process (docs/CLUSTER.md)."""
    shared = tmp_path / "shared"
    (shared / "cas").mkdir(parents=True)
    workdirs = []
    for name in ("a", "b"):
        workdir = tmp_path / name
        (workdir / "artifacts").mkdir(parents=True)
        (workdir / "artifacts" / "cas").symlink_to(shared / "cas", target_is_directory=True)
        write_config(workdir, suites={"tiny": {"path": str(REPO / "problems" / "starter"), "preset": "ci",
                                               "include": list(PROBLEMS)}},
                     rounds={"functional": 0, "optimization": 0}, eager_only=True)
        workdirs.append(workdir)
    procs = [_snakemake(w) for w in workdirs]
    codes = [p.wait(timeout=600) for p in procs]
    assert codes == [0, 0], "\n".join((w / "snakemake.log").read_text()[-3000:] for w in workdirs)

    n_blobs = assert_store_whole(shared)
    store = Store(shared)
    for problem in PROBLEMS:
        records = []
        for workdir in workdirs:
            folder = workdir / "artifacts" / "runs" / "expert" / "cpu" / "tiny" / problem / "r0"
            verify = json.loads((folder / "verify.json").read_bytes())
            assert verify["verdict"]["ok"], (workdir.name, problem, verify["verdict"])
            # every record each pipeline wrote is in the one store, whole, with the blobs it names
            for name in ("candidate.json", "compile.json", "verify.json"):
                data = (folder / name).read_bytes()
                assert store.get_bytes(sha256_bytes(data)) == data
            candidate = json.loads((folder / "candidate.json").read_bytes())
            for field in ("source", "plan", "transcript"):
                store.get_bytes(candidate[field])
            assert store.get_text(verify["source"]) == (folder / "kernel.py").read_text()
            records.append((candidate["source"], verify["source"]))
        # the embedded agent is deterministic: both pipelines generated and verified one kernel
        assert records[0] == records[1], records
    assert n_blobs > 10


def test_a_compile_hit_from_a_shared_store_builds_the_library_here_too(tmp_path: Path) -> None:
    """Two workdirs share one CAS (a cluster whose build folders are node-local): a compile
    action-cache hit in the second must still leave the library in its own build folder,
    where its verifier looks (seen as a flaky LibraryNotBuiltError in the two-Snakemake test)."""
    from kforge.config import parse_config
    from kforge.platforms import cpu_runtime
    from kforge.stages.compile import run_compile
    from kforge.stages.context import StageContext

    source = (REPO / "refs" / "cpu" / "solution.py").read_text()
    contexts = []
    for name in ("a", "b"):
        root = tmp_path / name / "artifacts"
        root.mkdir(parents=True)
        if name == "b":
            (root / "cas").symlink_to(tmp_path / "a" / "artifacts" / "cas", target_is_directory=True)
        cfg = parse_config({"store": str(root), "agents": {"expert": {"kind": "expert"}},
                            "suites": {"refs": {"path": str(REPO / "refs" / "cpu")}},
                            "run": {"agents": ["expert"], "platforms": ["cpu"], "suites": ["refs"]}})
        contexts.append(StageContext(config=cfg, store=Store(cfg.store)))
    kernel = tmp_path / "kernel.py"
    kernel.write_text(source)
    records = [run_compile(ctx, platform="cpu", kernel=kernel, out=ctx.root / "compile.json") for ctx in contexts]
    assert records[0].ok and records[1] == records[0]  # the second is the first's cached record
    library = cpu_runtime.library_path(cpu_runtime.extract_cpp_source(source), contexts[1].build_dir.resolve())
    assert library.is_file()
    builds = [json.loads(line) for line in (contexts[1].root / "ledger.jsonl").read_text().splitlines()]
    assert [e["stage"] for e in builds] == ["build"]
