"""What every backend's analysis reports of a profile: times, roofline position, intensity."""

from __future__ import annotations

from kforge.schema import Profile


def evidence(profile: Profile) -> dict[str, float]:
    ev: dict[str, float] = {}
    if profile.candidate is not None:
        ev["median_ms"] = profile.candidate.median_ms
        ev["cv"] = profile.candidate.cv
    if profile.eager is not None:
        ev["eager_ms"] = profile.eager.median_ms
    if profile.peak_gbps > 0:
        ev["bw_util"] = profile.achieved_gbps / profile.peak_gbps
    if profile.peak_gflops > 0:
        ev["flop_util"] = profile.achieved_gflops / profile.peak_gflops
        # a CPU profile times on fewer cores than the peak was measured on (every core but one):
        # its rate against the peak of the cores it had
        cores, threads = profile.extra.get("peak_cores"), (profile.extra.get("pin") or {}).get("threads")
        if isinstance(cores, int) and isinstance(threads, int) and 0 < threads < cores:
            ev["flop_util_threads"] = ev["flop_util"] * cores / threads
    if profile.roofline_ms > 0 and profile.candidate is not None and profile.candidate.median_ms > 0:
        ev["roofline_frac"] = profile.roofline_ms / profile.candidate.median_ms
    ours = [k for k in profile.kernels if k.name.startswith("kforge::")]
    ev["kforge_kernels"] = float(len(ours))
    if profile.flops > 0 and profile.min_bytes > 0:
        ev["intensity_flop_per_byte"] = profile.flops / profile.min_bytes
    if profile.peak_gflops > 0 and profile.peak_gbps > 0:
        ev["ridge_flop_per_byte"] = profile.peak_gflops / profile.peak_gbps
    return ev
