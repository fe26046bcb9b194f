"""Candidates that launch a real C++ kernel (the cpu platform's runtime, as refs/cpu does) and
cheat only where the timing loop calls them again and again: the offenders of the checked
timing path (test_checked_timing.py), and the honest control. Problem: refs/cpu/problem.py."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBLEM = REPO / "refs" / "cpu" / "problem.py"
_SOLUTION = (REPO / "refs" / "cpu" / "solution.py").read_text()
PRELUDE = _SOLUTION[: _SOLUTION.index("class ModelNew")]  # imports, CPP_SOURCE, lib, BIAS_RELU

_CLASS = '''
class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim))

    def _run(self, x, y, rows):
        bias = cpu_runtime.as_input(self.bias.detach())
        cpu_runtime.launch(BIAS_RELU, "bias_relu", x.data_ptr(), bias.data_ptr(), y.data_ptr(),
                           rows, x.shape[-1], cpu_runtime.threads())

    def forward(self, x):
        x = cpu_runtime.as_input(x)
{body}
'''


def candidate(body: str, header: str = "", prelude: str = PRELUDE) -> str:
    return prelude + header + _CLASS.format(body=body)


_HONEST_BODY = """        y = torch.empty_like(x)
        self._run(x, y, x.shape[0])
        return y"""
HONEST = candidate(_HONEST_BODY)

# Correct for its first six calls on an instance, then the last output (one row recomputed).
STALE_AFTER_N = candidate("""        self.calls = getattr(self, "calls", 0) + 1
        if self.calls > 6:
            self._run(x, self.last, 1)
            return self.last
        y = torch.empty_like(x)
        self._run(x, y, x.shape[0])
        self.last = y
        return y""")

# A cache keyed on the input's address, shape and version counter.
CACHE_BY_KEY = candidate("""        if not hasattr(self, "memo"):
            self.memo = {}
        key = (x.data_ptr(), tuple(x.shape), x._version)
        if key in self.memo:
            hit = self.memo[key]
            self._run(x, hit, 1)
            return hit
        y = torch.empty_like(x)
        self._run(x, y, x.shape[0])
        self.memo[key] = y
        return y""")

# Same input address as the last call: recompute only the first half of the rows.
PARTIAL_ON_REPEAT = candidate("""        if getattr(self, "last_ptr", None) == x.data_ptr():
            self._run(x, self.last, x.shape[0] // 2)
            return self.last
        y = torch.empty_like(x)
        self._run(x, y, x.shape[0])
        self.last, self.last_ptr = y, x.data_ptr()
        return y""")

_ASYNC_CPP = r'''
#include <chrono>
#include <cstdint>
#include <thread>

// Returns at once; a detached thread writes y a moment later.
extern "C" void bias_relu(const float* x, const float* bias, float* y, int64_t rows, int64_t cols,
                          int64_t nthreads) {
    std::thread([=] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) {
                float v = x[r * cols + c] + bias[c];
                y[r * cols + c] = v > 0.0f ? v : 0.0f;
            }
    }).detach();
}
'''
_ASYNC_PRELUDE = PRELUDE[: PRELUDE.index("CPP_SOURCE")] + f'CPP_SOURCE = r"""{_ASYNC_CPP}"""\n' + \
    PRELUDE[PRELUDE.index("lib = "):]
# Output written by a C++ thread after the call returned (outputs kept alive so it never
# writes freed memory).
WRITES_AFTER_RETURN = candidate("""        y = torch.empty_like(x)
        self._run(x, y, x.shape[0])
        self.keep = ([y] + getattr(self, "keep", []))[:8]
        return y""", prelude=_ASYNC_PRELUDE)

# A slow honest kernel (the launch repeated 20 times) whose process rewrites the worker's
# clock: the timing closure's ``now`` cell becomes a clock that divides the call by 20.
_FORGE = '''
import gc
import sys

ONLY_CANDIDATE = {only}
_STATE = {{}}


def _install():
    f = sys._getframe(1)
    while f is not None and f.f_code.co_name != "clock":
        f = f.f_back
    if f is None or "now" not in f.f_code.co_freevars:
        return
    fn = next(g for g in gc.get_referrers(f.f_code) if getattr(g, "__code__", None) is f.f_code)
    cell = fn.__closure__[fn.__code__.co_freevars.index("now")]
    real = cell.cell_contents

    def fake():
        t = real()
        caller = sys._getframe(1).f_locals
        if "t0" not in caller or (ONLY_CANDIDATE and caller.get("name") != "candidate"):
            return t
        return caller["t0"] + (t - caller["t0"]) // 20

    cell.cell_contents = fake
    _STATE["done"] = True
'''
_SLOW = """        if not _STATE:
            _install()
        y = torch.empty_like(x)
        for _ in range(20):
            self._run(x, y, x.shape[0])
        return y"""
FORGED_CLOCK_CANDIDATE_ONLY = candidate(_SLOW, header=_FORGE.format(only=True))
FORGED_CLOCK_ALL = candidate(_SLOW, header=_FORGE.format(only=False))
SLOW_HONEST = candidate(_SLOW.replace("        if not _STATE:\n            _install()\n", ""))

# ----------------------------------------------------------------------------------------------
# The judge issue's classes (issue 30): each launches the real kernel, so every static check and
# the "a kernel ran" check pass; each reaches past its own process's calls another way.

# At import, a global forward pre-hook slows every module call but its own: with the baselines
# timed in the candidate's process it shipped at 7.96x (eager and torch.compile each ran it).
GLOBAL_HOOK = candidate(_HONEST_BODY, header='''

def _slow_others(module, args):
    if type(module).__name__ != "ModelNew":
        spin = 0
        for i in range(200000):
            spin += i


_HOOK = torch.nn.modules.module.register_module_forward_pre_hook(_slow_others)
''')

# Reaches the verifier through a module path built from strings (past the static checks),
# replaces its repeat phase with a no-op, and recomputes a quarter of its rows on a repeated input.
HARNESS_PATCH = candidate("""        if getattr(self, "last_ptr", None) == x.data_ptr():
            self._run(x, self.last, x.shape[0] // 4)
            return self.last
        y = torch.empty_like(x)
        self._run(x, y, x.shape[0])
        self.last, self.last_ptr = y, x.data_ptr()
        return y""", header='''

def _quiet(*args, **kwargs):
    return None


_repeats = getattr(torch, "s" + "ys").modules.get("kforge.verifier." + "repeats")
if _repeats is not None:
    _repeats.repeat_phase = _quiet
''')


def reference_cache_reader(cache_dir: str) -> str:
    """Computes nothing: copies the answer for its input out of the reference cache's files
    (verified with max error 0 while the sandbox showed the whole host read-only). Where it
    finds none, its answer is one computed row and zeros: always a wrong answer, never the
    uninitialised memory that read as NaN in one CI run (``nonfinite``, not the reason the
    tests name)."""
    return candidate(f"""        y = torch.zeros_like(x)
        self._run(x, y, 1)
        raw_x = ctypes.string_at(x.data_ptr(), x.numel() * x.element_size())
        want = hashlib.sha256(f"{{tuple(x.shape)}}{{x.dtype}}".encode() + raw_x).hexdigest()
        for path in glob.glob({cache_dir!r} + "/*.json"):
            for frame in json.load(open(path)):
                h = frame["header"]
                if h.get("kind") == "case" and h.get("input_digests", [None])[0] == want and h.get("outputs"):
                    raw = bytes.fromhex(frame["blobs"][0])
                    return torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(h["outputs"][0]["shape"])
        return y""", header="\nimport ctypes\nimport glob\nimport hashlib\nimport json\n")


# A cache keyed on a few sampled input elements: it survives any fixed set of input contents.
SAMPLED_CACHE = candidate("""        if not hasattr(self, "memo"):
            self.memo = {}
        flat = x.reshape(-1)
        key = (tuple(x.shape), float(flat[0]), float(flat[1]), float(flat[flat.numel() // 2]), float(flat[-1]))
        if key in self.memo:
            hit = self.memo[key]
            self._run(x, hit, 1)
            return hit
        y = torch.empty_like(x)
        self._run(x, y, x.shape[0])
        self.memo[key] = y
        return y""")

# numpy does the work beside a trivial kernel of its own (one row).
NUMPY_BLAS = candidate("""        y = torch.empty_like(x)
        self._run(x, y, 1)
        out = np.maximum(x.detach().numpy() + self.bias.detach().numpy(), 0.0)
        return torch.from_numpy(out.astype(np.float32))""", header="\nimport numpy as np\n")
