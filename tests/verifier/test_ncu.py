"""Parsing Nsight Compute's CSV: the candidate's kernels only, metrics averaged."""

from __future__ import annotations

from pathlib import Path

from kforge.verifier.ncu import ncu_metrics, parse_ncu_csv

CSV = '''==PROF== Connected to process 123
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Section Name","Metric Name","Metric Unit","Metric Value"
"0","123","python3","h","void at::native::normal_kernel<float>(...)","1","7","","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","91.0"
"1","123","python3","h","_fused_gemm_kernel","1","7","","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","20.0"
"1","123","python3","h","_fused_gemm_kernel","1","7","","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","80.5"
"2","123","python3","h","_fused_gemm_kernel","1","7","","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","30.0"
"2","123","python3","h","_fused_gemm_kernel","1","7","","sm__warps_active.avg.pct_of_peak_sustained_active","%","1,000.0"
'''


def test_torch_kernels_are_left_out_and_metrics_averaged() -> None:
    out = parse_ncu_csv(CSV)
    assert out["ncu"] == "ok"
    assert out["ncu_dram_pct"] == 25.0  # (20 + 30) / 2: PyTorch's normal_kernel is not ours
    assert out["ncu_sm_pct"] == 80.5
    assert out["ncu_occupancy_pct"] == 1000.0
    assert "normal_kernel" not in str(out["ncu_kernels"])


def test_no_table_or_no_own_kernel_is_said_plainly() -> None:
    assert parse_ncu_csv("==PROF== nothing profiled\n")["ncu"] == "no metrics in ncu output"
    only_torch = CSV.split("\n")[0:3]
    assert parse_ncu_csv("\n".join(only_torch))["ncu"] == "no candidate kernel was profiled"


def test_cpu_platform_reports_ncu_unavailable(tmp_path: Path) -> None:
    problem = Path(__file__).resolve().parents[2] / "refs" / "cpu" / "problem.py"
    out = ncu_metrics("", problem, platform="cpu", preset="ci", sizes=None, build_dir=tmp_path)
    assert out["ncu"].startswith("unavailable")

