"""Triton candidates for fixtures/softmax_gpu.py that cheat only where a GPU verifier at the
small size, or an in-process clock, would not look: the rows of test_gpu_verify.py and
benchmarks/verify_gpu_check.py, and the honest control. Every one launches a real kernel."""

from __future__ import annotations

from pathlib import Path

PROBLEM = Path(__file__).parent / "fixtures" / "softmax_gpu.py"

_KERNEL = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, stride, WRAP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    if WRAP > 0:
        row = row % WRAP  # the bug: rows past WRAP are never written (no ci size has that many)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, axis=0), mask=mask)


def softmax(x, rows=None, wrap=0, out=None):
    x = x.contiguous()
    y = torch.empty_like(x) if out is None else out
    n_rows, n_cols = x.shape
    softmax_kernel[(n_rows if rows is None else rows,)](
        x, y, n_cols, x.stride(0), WRAP=wrap, BLOCK=triton.next_power_of_2(n_cols), num_warps=8)
    return y
'''


def candidate(forward: str, header: str = "") -> str:
    return _KERNEL + header + f'''

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
{forward}
'''


HONEST = candidate("        return softmax(x)")

# Correct at every size up to 4096 rows (ci: 256); at the timed 8192 rows half is never written.
INDEX_BUG = candidate("        return softmax(x, wrap=4096)")

# Right for six calls on an instance, then the last output again (one row recomputed).
STALE_AFTER_N = candidate("""        self.calls = getattr(self, "calls", 0) + 1
        if self.calls > 6:
            return softmax(x, rows=1, out=self.last)
        self.last = softmax(x)
        return self.last""")

# A cache keyed on the input's address and shape (one row recomputed on a hit).
CACHE_BY_PTR = candidate("""        if not hasattr(self, "memo"):
            self.memo = {}
        key = (x.data_ptr(), tuple(x.shape))
        if key in self.memo:
            return softmax(x, rows=1, out=self.memo[key])
        self.memo[key] = softmax(x)
        return self.memo[key]""")

# An honest but slow kernel (20 launches a call) whose module, at import, makes CUDA events
# report a twentieth of their time (a method of a class the harness watches by identity only):
# its claims shrink, the parent's clock around each window does not.
_FORGE = '''
_real_elapsed = torch.cuda.Event.elapsed_time


def _forged(self, end):
    return _real_elapsed(self, end) / 20


torch.cuda.Event.elapsed_time = _forged
'''
CLOCK_FORGE = candidate("""        y = torch.empty_like(x)
        for _ in range(20):
            softmax(x, out=y)
        return y""", header=_FORGE)
SLOW_HONEST = candidate("""        y = torch.empty_like(x)
        for _ in range(20):
            softmax(x, out=y)
        return y""")
