"""GPU clocks and throttle reasons, when this host lets us read them (``nvidia-smi``)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

QUERY = "clocks.sm,clocks.mem,clocks_throttle_reasons.active,temperature.gpu,power.draw"


def read_clocks(which: str = "nvidia-smi") -> dict[str, Any]:
    """``{"clock_telemetry": "nvidia-smi", "gpus": [...]}`` or ``{"clock_telemetry": "unavailable"}``."""
    exe = shutil.which(which)
    if exe is None:
        return {"clock_telemetry": "unavailable", "why": f"{which} not found"}
    try:
        proc = subprocess.run([exe, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as err:
        return {"clock_telemetry": "unavailable", "why": str(err)[:200]}
    if proc.returncode != 0:
        return {"clock_telemetry": "unavailable", "why": proc.stderr.strip()[:200]}
    gpus = []
    for line in proc.stdout.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) == 5:
            gpus.append(dict(zip(["sm_mhz", "mem_mhz", "throttle_reasons", "temp_c", "power_w"],
                                 values, strict=True)))
    if not gpus:
        return {"clock_telemetry": "unavailable", "why": "no GPU rows from nvidia-smi"}
    return {"clock_telemetry": "nvidia-smi", "gpus": gpus}
