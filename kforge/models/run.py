"""``kforge model MODEL.py``: capture, partition, the regions' pipeline, stitch, end to end.

The result is ``OUT/model.json`` (one record: the model, its regions and the end-to-end rows)
and ``OUT/regions.parquet`` (one row per region: share of the model's ops, status, speedup),
beside ``OUT/regions/`` (the region problems) and ``OUT/pipeline/`` (the regions' pipeline run:
its store, report and records, queryable like any run).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kforge.models.graph import ModelCaptureError, capture_model
from kforge.models.partition import Partition, partition
from kforge.models.pipeline import PipelineError, region_results, run_pipeline, write_config
from kforge.models.region_problem import region_source
from kforge.models.share import largest, region_times
from kforge.models.stitch import stitched_source


@dataclass
class RegionRow:
    region: str
    problem: str  # the region problem's stem (one per distinct region)
    label: str
    ops: int
    heavy: int
    status: str
    shipped: bool
    speedup: float | None
    low: float | None
    detail: str
    share: float | None = None  # of the reference forward's time, the regions' sum (kforge.models.share)


@dataclass
class EndToEnd:
    verified: bool
    reason: str
    detail: str
    max_margin: float | None = None
    candidate_ms: float | None = None
    eager_ms: float | None = None
    compile_ms: float | None = None
    speedup: float | None = None  # the paired median against the faster baseline
    low: float | None = None
    high: float | None = None
    status: str = ""  # the ship rule on the whole model


@dataclass
class ModelRecord:
    model: str
    platform: str
    policy: str
    preset: str
    stage: str  # how far it got: capture, partition, pipeline, stitch, verified, timed
    error: str = ""
    regions: list[RegionRow] = field(default_factory=list)
    distinct_regions: int = 0
    shipped_regions: int = 0
    e2e: EndToEnd | None = None
    seconds: dict[str, float] = field(default_factory=dict)


def _problem_stem(index: int, digest: str) -> str:
    return f"r{index:03d}_{digest[:10]}"


def write_regions(part: Partition, folder: Path, model_file: Path,
                  taken: set[str] | None = None) -> dict[str, str]:
    """One problem file per distinct region (of the digests ``taken``, all when None);
    region name -> its problem's stem."""
    folder.mkdir(parents=True, exist_ok=True)
    stems: dict[str, str] = {}
    by_digest: dict[str, str] = {}
    for i, region in enumerate(part.regions):
        if taken is not None and region.digest not in taken:
            continue
        stem = by_digest.get(region.digest)
        if stem is None:
            stem = by_digest[region.digest] = _problem_stem(i, region.digest)
            (folder / f"{stem}.py").write_text(region_source(region, part.seen[region.name][0], model_file.name))
        stems[region.name] = stem
    return stems


def run_model(model_file: Path, out: Path, *, platform: str = "cpu", policy: str = "strict", preset: str = "ci",
              sizes: dict[str, int] | None = None, rounds: dict[str, int] | None = None,
              profile: dict[str, Any] | None = None, cores: int = 4, e2e_reps: int = 30,
              kernels: str = "shipped", max_regions: int | None = None) -> ModelRecord:
    """The whole of ``kforge model`` (module docstring); never raises for what the model does.
    ``kernels``: which regions get their kernel in the stitched forward, ``shipped`` (the ship
    rule's answer) or ``verified`` (every verified region, faster or not: the stitch and the
    end-to-end check exercised on every kernel the pipeline made). ``max_regions``: how many
    distinct regions go through the pipeline, those with the largest share of the forward's time
    (``kforge.models.share``); the others keep their own ops (all when None)."""
    out = Path(out).resolve()  # the pipeline runs in a folder of its own: a relative name would not reach it
    record = ModelRecord(Path(model_file).name, platform, policy, preset, stage="capture")
    t = time.monotonic()

    def lap(name: str) -> None:
        nonlocal t
        record.seconds[name] = round(time.monotonic() - t, 2)
        t = time.monotonic()

    try:
        graph = capture_model(model_file, preset=preset, sizes=sizes)
        lap("capture")
        record.stage = "partition"
        part = partition(graph.gm, graph.model, graph.inputs)
        lap("partition")
    except (ModelCaptureError, ValueError, RuntimeError) as err:
        record.error = f"{record.stage}: {err}"[:1000]
        return _finish(record, out)
    times = region_times(part)
    whole = sum(times.values()) or 1.0
    distinct = {r.digest for r in part.regions}
    taken = largest(part, times, max_regions) if max_regions is not None and len(distinct) > max_regions else None
    stems = write_regions(part, out / "regions", Path(model_file), taken)
    record.distinct_regions = len(distinct)
    record.stage = "pipeline"
    write_config(out / "pipeline", out / "regions", platform=platform, policy=policy,
                 rounds=rounds or {"functional": 1, "optimization": 0},
                 profile=profile or {"warmup": 2, "reps": 20})
    try:
        run_pipeline(out / "pipeline", cores=cores)
        results = region_results(out / "pipeline")
    except (PipelineError, OSError) as err:
        record.error = f"pipeline: {err}"[:1000]
        return _finish(record, out)
    lap("pipeline")
    chosen = {}
    for region in part.regions:
        share = times[region.name] / whole
        if region.name not in stems:
            record.regions.append(RegionRow(region.name, "", region.label, region.ops, len(region.heavy), "not_tried",
                                            False, None, None, f"{share:.1%} of the forward: not among the "
                                            f"{max_regions} largest distinct regions (--regions)", share))
            continue
        res = results.get(stems[region.name])
        if res is not None and res.source and (res.shipped or kernels == "verified"):
            chosen[region.name] = res.source
        record.regions.append(RegionRow(region.name, stems[region.name], region.label, region.ops, len(region.heavy),
                                        res.status if res else "missing", bool(res and res.shipped),
                                        res.speedup if res else None, res.low if res else None,
                                        (res.detail if res else "no row in the regions' report")[:300], share))
    record.shipped_regions = sum(r.shipped for r in record.regions)
    record.stage = "stitch"
    source = stitched_source(Path(model_file), preset, sizes, part, chosen)
    (out / "stitched.py").write_text(source)
    record.e2e = end_to_end(source, Path(model_file), out / "pipeline" / "artifacts" / "build", platform=platform,
                            policy=policy, preset=preset, sizes=sizes, reps=e2e_reps)
    record.stage = "timed" if record.e2e.candidate_ms else ("verified" if record.e2e.verified else "stitch")
    lap("end_to_end")
    return _finish(record, out)


def end_to_end(source: str, model_file: Path, build_dir: Path, *, platform: str, policy: str, preset: str,
               sizes: dict[str, int] | None, reps: int) -> EndToEnd:
    """The stitched forward verified against the model file's reference, then timed against
    eager and torch.compile (each in a process of its own) with the ship rule's bound."""
    from kforge.platforms import get_platform
    from kforge.verifier.paired import faster_baseline, paired_ratio
    from kforge.verifier.profiling import time_against_baselines
    from kforge.verifier.verify import verify_candidate

    build_dir.mkdir(parents=True, exist_ok=True)
    if "# region " in source:  # a kernel of a region in it: build as the compile stage does
        built = get_platform(platform).build(source, build_dir / platform)
        if not built.ok:
            return EndToEnd(False, "import_error", f"the stitched model did not build: {built.log[-500:]}")
    verdict = verify_candidate(source, model_file, platform=platform, policy=policy, preset=preset, sizes=sizes,
                               build_dir=build_dir / platform, timeout_s=600, whole_model=True)
    e2e = EndToEnd(verdict.ok, verdict.reason, verdict.detail[:500], max_margin=verdict.max_margin)
    if not verdict.ok:
        return e2e
    prof = time_against_baselines(source, model_file, platform=platform, policy=policy, preset=preset, sizes=sizes,
                                  build_dir=build_dir / platform, reps=reps, timeout_s=1200, whole_model=True)
    if not prof.ok or prof.candidate is None:
        e2e.detail = f"timing: {prof.reason}: {prof.detail}"[:500]
        return e2e
    e2e.candidate_ms = prof.candidate.median_ms
    e2e.eager_ms = prof.eager.median_ms if prof.eager else None
    e2e.compile_ms = prof.compiled.median_ms if prof.compiled else None
    faster = faster_baseline(prof)
    if faster is not None:
        bound = paired_ratio(prof.candidate, faster[1], faster[0])
        if bound is not None:
            e2e.speedup, e2e.low, e2e.high = bound.median, bound.low, bound.high
            from kforge.stages.select import SHIP_FLOOR

            e2e.status = "shipped" if bound.low > SHIP_FLOOR else "no_gain"
    return e2e


def _finish(record: ModelRecord, out: Path) -> ModelRecord:
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.json").write_text(json.dumps(asdict(record), indent=1))
    if record.regions:
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = [dict(asdict(r), model=record.model, platform=record.platform, policy=record.policy)
                for r in record.regions]
        pq.write_table(pa.Table.from_pylist(rows), out / "regions.parquet")
    return record
