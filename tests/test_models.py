"""kforge.models on the CPU: a model file cut into regions, the regions through the pipeline, the
stitched forward verified and timed end to end; a region that fails keeps its own ops and the
model still verifies; two layers of a stack are one cell; transformers decoders are captured
and cut (their whole run is benchmarks/models_cpu.py's)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from kforge.models.graph import capture_model
from kforge.models.partition import partition, written
from kforge.models.run import run_model
from kforge.models.stitch import prefixed

REPO = Path(__file__).resolve().parents[1]

# Three identical blocks (one cell) and a sort the expert cannot plan (a region that fails).
TINY = '''
import torch
import torch.nn as nn

batch = 8
dim = 32
vocab = 50


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Rank(nn.Module):
    def forward(self, x):
        return torch.sort(x, dim=-1).values


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rank = Rank()
        self.blocks = nn.Sequential(Block(), Block(), Block())
        self.head = nn.Linear(dim, 4)

    def forward(self, ids):
        return self.head(self.blocks(self.rank(self.embed(ids))))


def get_inputs():
    return [torch.randint(0, vocab, (batch,))]


def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.py"
    path.write_text(TINY)
    return path


def test_a_stack_of_identical_blocks_is_one_cell(tiny: Path) -> None:
    graph = capture_model(tiny, preset="full")
    part = partition(graph.gm, graph.model, graph.inputs)
    digests = [r.digest for r in part.regions]
    assert len(digests) > len(set(digests))  # the three blocks share one
    out = part.split(*graph.inputs)
    ref = graph.model(*graph.inputs)
    assert torch.allclose(out[0] if isinstance(out, tuple) else out, ref)


def test_prefixed_keeps_several_candidates_apart() -> None:
    src = 'CPP_SOURCE = "int f() { return 1; }"\nlib = 1\n\n\nclass ModelNew:\n    x = lib\n'
    out = prefixed(src, "r2")
    assert "CPP_SOURCE_r2 = " in out and "_r2_lib = 1" in out and "class _r2_ModelNew" in out and "x = _r2_lib" in out


@pytest.mark.slow
def test_a_model_through_its_regions_is_verified_end_to_end(tiny: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # an output folder named relative to the caller's folder, as users do
    record = run_model(tiny, Path("out"), preset="full", cores=2, e2e_reps=8, kernels="verified",
                       rounds={"functional": 0, "optimization": 0}, profile={"warmup": 1, "reps": 8,
                                                                            "compile_baseline": False})
    assert record.stage == "timed", (record.stage, record.error, record.e2e)
    statuses = {r.problem: r.status for r in record.regions}
    assert len(statuses) < len(record.regions)  # the blocks were one cell
    rank = next(r for r in record.regions if "rank" in r.label)
    assert rank.status == "failed" and rank.detail  # kept as its own ops, and says why
    assert any(r.status != "failed" for r in record.regions)  # a region got a verified kernel
    assert record.e2e is not None and record.e2e.verified and record.e2e.candidate_ms and record.e2e.eager_ms
    assert "# region " in (tmp_path / "out" / "stitched.py").read_text()  # its kernel is in the stitch
    saved = json.loads((tmp_path / "out" / "model.json").read_text())
    assert saved["e2e"]["verified"] and (tmp_path / "out" / "regions.parquet").is_file()


def test_a_region_budget_takes_the_largest_distinct_regions_and_keeps_the_rest_as_their_ops(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--regions N: the N distinct regions with the largest share of the measured forward go
    through the pipeline (a stack's block counted once per call), the others are rows that say
    why they were not tried, and every row carries its share."""
    import kforge.models.run as run_mod
    from kforge.models.share import largest, region_times

    graph = capture_model(tiny, preset="full")
    part = partition(graph.gm, graph.model, graph.inputs)
    times = region_times(part)
    assert set(times) == {r.name for r in part.regions} and all(t > 0 for t in times.values())
    total: dict[str, float] = {}
    for r in part.regions:
        total[r.digest] = total.get(r.digest, 0.0) + times[r.name]
    assert largest(part, times, 1) == {max(total, key=total.__getitem__)}
    assert largest(part, times, 99) == set(total)

    piped: list[Path] = []
    monkeypatch.setattr(run_mod, "run_pipeline", lambda workdir, cores: piped.append(workdir))
    monkeypatch.setattr(run_mod, "region_results", lambda workdir: {})
    monkeypatch.setattr(run_mod, "end_to_end", lambda *a, **k: run_mod.EndToEnd(True, "ok", ""))
    record = run_model(tiny, tmp_path / "budget", preset="full", max_regions=2)
    assert piped and len(list((tmp_path / "budget" / "regions").glob("*.py"))) == 2
    untried = [r for r in record.regions if r.status == "not_tried"]
    assert untried and all("--regions" in r.detail and not r.problem for r in untried)
    assert len({r.problem for r in record.regions if r.problem}) == 2
    assert abs(sum(r.share or 0 for r in record.regions) - 1.0) < 1e-6


def test_kforge_model_refuses_a_region_budget_below_one_in_one_line(tiny: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from kforge.cli import main

    assert main(["model", str(tiny), "--regions", "0", "--out", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "kforge model: --regions takes a count of 1 or more, got 0"
    assert not (tmp_path / "none").exists()  # nothing started


@pytest.mark.parametrize("name", ["llama_dense", "gpt_oss_moe", "llama_dense_decode", "gpt_oss_moe_decode"])
def test_the_decoders_are_captured_and_cut(name: str) -> None:
    """Prefill of both decoders, and a decode step against the static KV cache the model holds
    (its step writes one slot and gives the same logits every call): every region reads an
    activation (the step's position constants and the copies of a sliding window's cache join the
    region after them), writes none of its inputs in place and names no device."""
    pytest.importorskip("transformers")
    from kforge.models.region_problem import region_source

    graph = capture_model(REPO / "models" / f"{name}.py", preset="ci")
    part = partition(graph.gm, graph.model, graph.inputs)
    assert len(part.regions) > 4 and len({r.digest for r in part.regions}) < len(part.regions)
    out = part.split(*graph.inputs)
    assert torch.allclose(out[0] if isinstance(out, tuple) else out, graph.model(*graph.inputs), atol=1e-5)
    custom_ops = set()  # the MoE's expert GEMMs: transformers' own op, which a region file must import
    for region in part.regions:
        activations = {s.name for s in region.inputs if s.kind == "activation"}
        assert activations, region.name
        source = region_source(region, part.seen[region.name][0], name)
        assert "device(type=" not in source
        custom_ops |= {"torch.ops.transformers." in source}
        assert ("torch.ops.transformers." in source) <= ("import transformers.integrations.moe" in source)
        for node in getattr(part.split, region.name).graph.nodes:  # no region writes an input it is given
            assert not any(a.name in activations for a in written(node)), (region.name, node.format_node())
    assert (True in custom_ops) == name.startswith("gpt_oss")


@pytest.mark.parametrize("name", ["llama_dense_decode", "gpt_oss_moe_decode"])
def test_a_decode_step_is_the_last_position_of_the_whole_sequence_and_leaves_its_cache_as_it_was(name: str) -> None:
    """The step against the cache the model holds (gpt-oss: its sliding-window layers full, their
    window rolled on a copy) gives the logits of the prompt and the token run whole, without a
    cache; a second call gives them again and changes no cache buffer."""
    pytest.importorskip("transformers")
    graph = capture_model(REPO / "models" / f"{name}.py", preset="ci")
    model, (token,) = graph.model, graph.inputs
    with torch.no_grad():
        step = model(token)
        before = {k: b.clone() for k, b in model.named_buffers()}  # the step's own slot written
        again = model(token)
        whole = model.lm(torch.cat([model.prompt, token], 1), use_cache=False).logits[:, -1:]
    assert torch.allclose(step, whole, atol=1e-5) and torch.equal(step, again)
    assert all(torch.equal(b, before[k]) for k, b in model.named_buffers())


def test_the_sweep_table_counts_every_file_and_a_file_without_a_faster_forward_at_one(tmp_path: Path,
                                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/models_sweep.py: a file left for later is run by the next sweep (its last row
    counts); the geomean is over every file of the folder, one not verified or not faster at 1.0."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("models_sweep", REPO / "benchmarks" / "models_sweep.py")
    assert spec is not None and spec.loader is not None
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    rows = [
        {"file": "1_a.py", "stage": "timed", "distinct": 1, "verified": True, "status": "shipped", "speedup": 4.0, "low": 3.5},
        {"file": "2_b.py", "stage": "partition", "error": sweep.NOT_RUN + " 9 distinct regions > --max-distinct 5"},
        {"file": "2_b.py", "stage": "timed", "distinct": 9, "verified": True, "status": "no_gain", "speedup": 0.5, "low": 0.4},
        {"file": "3_c.py", "stage": "capture", "error": "ModuleNotFoundError"},
    ]
    jsonl = tmp_path / "sweep.jsonl"
    jsonl.write_text("".join(json.dumps({"platform": "cpu", "policy": "strict", "preset": "ci", **r}) + "\n"
                             for r in rows))
    assert sweep._done(jsonl) == {"1_a.py", "2_b.py", "3_c.py"}
    assert sweep.table(argparse.Namespace(jsonl=jsonl, total=4)) == 0
    out = capsys.readouterr().out
    assert out.count("| 2_b.py |") == 1 and "verified end to end 2" in out and "partitioned 2," in out
    assert "geomean 1.414x" in out  # 4.0 over four files: 4 ** (1 / 4)


def test_a_sweep_file_cut_at_its_timeout_takes_its_whole_process_group(tmp_path: Path) -> None:
    """models_sweep's per-file call: at the timeout the file's pipeline (Snakemake and the jobs
    under it) dies with it, so a sweep cut by its deadline leaves nothing on the device."""
    import importlib.util
    import sys
    import time

    spec = importlib.util.spec_from_file_location("models_sweep", REPO / "benchmarks" / "models_sweep.py")
    assert spec is not None and spec.loader is not None
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    pid_file = tmp_path / "grandchild.pid"
    child = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
             f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    t0 = time.monotonic()
    code, tail = sweep._call([sys.executable, "-c", child], 3.0)
    assert code is None and tail == ["timed out after 3 s"] and time.monotonic() - t0 < 30
    grandchild = int(pid_file.read_text())
    status = Path(f"/proc/{grandchild}/status")
    for _ in range(50):
        try:
            if "zombie" in status.read_text():  # dead, not yet reaped by whoever adopted it
                break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the grandchild outlived the cut file")
    assert sweep._call([sys.executable, "-c", "print('a'); print('b')"], 30.0) == (0, ["a", "b"])


def test_a_plain_tensor_attribute_is_not_lent_to_a_region_kernel() -> None:
    """VanillaRNN keeps its hidden state as a plain tensor attribute it reassigns each call: a
    region's kernel cannot be lent it (it would read a stale state), and the stitch says so."""
    from kforge.models.stitch import StitchError, _lend

    model = torch.nn.Linear(2, 2)
    model.hidden = torch.zeros(2)  # type: ignore[assignment]
    kernel = torch.nn.Module()
    _lend(kernel, {"w0": "weight"}, model)
    assert kernel.w0 is model.weight
    with pytest.raises(StitchError, match="plain tensor attribute"):
        _lend(kernel, {"b1": "hidden"}, model)
