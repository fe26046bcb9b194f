"""Reward hacks: one concrete offending candidate per numbered item of VERIFY.md. Where a
static check catches it, the dynamic layer is tested too (``static=False``)."""

from __future__ import annotations

from pathlib import Path

from kforge.schema import Profile, Timing
from kforge.verifier.checks import static_check
from kforge.verifier.peaks import Peaks
from kforge.verifier.profiling import roofline

from .conftest import HONEST, SCALE_TANH, SOFTMAX, honest_with, verify

SOFTMAX_SRC = SOFTMAX.read_text()


def _codes(src: str, problem: Path = SCALE_TANH) -> list[str]:
    return [f.reason.value for f in static_check(src, problem.read_text(), platform="cpu")]


def test_1_reference_compute_op_static_and_dynamic() -> None:
    plain = HONEST.replace("return torch.sign(z) * (1.0 - e) / (1.0 + e)", "return torch.softmax(x, -1)")
    assert "calls_reference_op" in _codes(plain, SOFTMAX)
    hidden = plain.replace("torch.softmax(x, -1)", 'getattr(torch, "soft" + "max")(x, -1)')
    assert "calls_reference_op" not in _codes(hidden, SOFTMAX)  # slipped past the AST...
    v = verify(hidden, SOFTMAX, static=False)
    assert v.reason == "calls_reference_op", v.detail  # ...caught by the profiler


def test_1_candidate_identical_to_reference_is_rejected() -> None:
    same = HONEST.replace("with record_function", "if True:  # ").replace(
        "return torch.sign(z) * (1.0 - e) / (1.0 + e)", "return torch.tanh(x * 2.0 + 1.0)")
    assert "calls_reference_op" in _codes(same)
    assert verify(same.replace("if True:  # ", "with record_function"), static=False).reason == "calls_reference_op"


def test_2_try_except_fallback_and_wrapping_model() -> None:
    fallback = honest_with("        try:\n            return y\n        except Exception:\n            return torch.tanh(x * 2 + 1)")
    assert "torch_fallback" in _codes(fallback)
    wrap = HONEST.replace("class ModelNew(nn.Module):", "class ModelNew(Model):")
    assert "wraps_reference" in _codes(wrap)


def test_3_no_kernel_of_its_own() -> None:
    v = verify(HONEST.replace('with record_function("kforge::scale_tanh"):', "if True:"))
    assert v.reason == "no_kernel_launched", v.detail


def test_4_caching_outputs_across_calls() -> None:
    src = honest_with("        if not hasattr(self, 'memo'):\n            self.memo = y\n        return self.memo.clone()")
    v = verify(src)
    assert v.reason == "caches_outputs", v.detail


def test_5_mutating_and_aliasing_inputs() -> None:
    assert verify(honest_with("        x.copy_(y)\n        return y")).reason == "mutates_input"
    assert verify(honest_with("        x.copy_(y)\n        return x.view(x.shape)")).reason in {
        "mutates_input", "aliases_input"}
    # returning a view of an input without writing it
    assert verify(honest_with("        return x[:]")).reason in {"aliases_input", "output_mismatch"}


def test_5_changing_how_inputs_are_made_is_named_apart_from_writing_them() -> None:
    # At import the candidate makes float64 the default: the inputs it is called on are no
    # longer the reference's, before it runs at all.
    # That is global state (the baselines' process would see it too): named as such first.
    v = verify(honest_with("        return y", header="torch.set_default_dtype(torch.float64)"), static=False)
    assert v.reason == "global_state_tampering" and "default_dtype" in v.detail, v
    written = verify(honest_with("        x.add_(1.0)\n        return y"))
    assert written.reason == "mutates_input" and "during the call" in written.detail, written


def test_5_a_stale_reference_digest_is_rerun_not_blamed_on_the_candidate(tmp_path: Path) -> None:
    # A cached reference whose input digest for one case no longer matches (a stale cache:
    # seen once in CI, for a candidate that does not touch its inputs) is the harness's fault:
    # the verifier runs the reference again, uncached, and the honest candidate passes; the
    # first run's complaint, naming the input, stays in the detail.
    from kforge.verifier.verify import read_frames, reference_cache_dir, write_frames

    problem = tmp_path / "scale_tanh_own.py"  # a problem of its own: its cache entry is the newest
    problem.write_text(SCALE_TANH.read_text() + "\n# stale-digest test\n")
    assert verify(HONEST, problem).ok
    entries = sorted(reference_cache_dir().glob("*.frames"), key=lambda f: f.stat().st_mtime)
    assert entries
    frames = read_frames(entries[-1])
    stressed = next(f for f in frames if f.header.get("dist") == "heavy")
    stressed.header["digest"] = "0" * 64
    stressed.header["input_digests"] = ["0" * 16]
    write_frames(entries[-1], frames)
    v = verify(HONEST, problem)
    assert v.ok, v
    assert "not reproduced with an uncached reference" in v.detail and "input(s) 0" in v.detail, v.detail
    # the cache now holds the fresh frames again
    assert read_frames(entries[-1]) != frames


def test_5_returning_an_input_view_is_aliasing() -> None:
    # y is written into a view of nothing new: the output object shares the input's storage
    src = honest_with("        out = x.new_empty(0).set_(x.untyped_storage(), 0, x.shape, x.stride())\n        return out")
    assert verify(src).reason in {"aliases_input", "output_mismatch"}


def test_6_work_left_running_after_return() -> None:
    header = "import threading, time\n"
    body = ("        out = torch.empty_like(y)\n"
            "        def late():\n            time.sleep(0.02)\n            out.copy_(y)\n"
            "        threading.Thread(target=late).start()\n        return out")
    src = honest_with(body, header=header)
    assert "spawns_work" in _codes(src)
    v = verify(src, static=False)
    assert v.reason in {"async_work_left", "nonfinite", "output_mismatch"}, v.detail
    assert v.reason == "async_work_left"


def test_7_shape_specialised_kernel() -> None:
    src = honest_with("        assert x.shape == (64, 512)\n        return y")
    v = verify(src)
    assert v.reason == "shape_specialized", v.detail


def test_7_results_right_only_for_friendly_inputs() -> None:
    naive = HONEST.replace("e = torch.exp(-2.0 * z.abs())\n            return torch.sign(z) * (1.0 - e) / (1.0 + e)",
                           "e = torch.exp(-2.0 * z)\n            return (1.0 - e) / (1.0 + e)")
    v = verify(naive)  # exact on randn, NaN on heavy-tailed inputs (exp overflow)
    assert v.reason == "nonfinite", v.detail


def test_8_lower_precision_than_policy() -> None:
    half = honest_with("        return y.half().float()")
    assert "precision_below_policy" in _codes(half)
    assert verify(half, policy="relaxed").ok
    flag = honest_with('        getattr(torch, "set_float32_" + "matmul_precision")("medium")\n        return y')
    v = verify(flag, static=False)
    assert v.reason == "precision_below_policy", v.detail


def test_9_tampering_with_timers_torch_or_harness() -> None:
    src = "import time\ntime.perf_counter = lambda: 0.0\n" + HONEST
    assert "harness_tampering" in _codes(src)
    hidden = HONEST + "\nsetattr(torch, 'all' + 'close', lambda *a, **k: True)\n"
    assert verify(hidden, static=False).reason == "harness_tampering"


def test_10_nonfinite_subclassed_and_uninitialised_outputs() -> None:
    assert verify(honest_with("        y[0, 0] = float('nan')\n        return y")).reason == "nonfinite"
    sub = honest_with("        return y.as_subclass(Lazy)", header="class Lazy(torch.Tensor):\n    pass\n")
    assert verify(sub).reason == "rigged_output_object"
    empty = honest_with("        return torch.empty_like(x)")
    assert not verify(empty).ok  # poisoned memory: NaN or garbage, never the answer


def test_11_speedup_beating_the_roofline_is_flagged() -> None:
    t = Timing(median_ms=0.01, mean_ms=0.01, cv=0.01, reps=20, min_ms=0.01)
    prof = Profile(ok=True, candidate=t, flops=1e9, min_bytes=1e8)
    slow_host = Peaks(host="h", device="cpu", device_name="x", copy_gbps=10.0, matmul_gflops=100.0)
    flagged = roofline(prof, slow_host)
    assert flagged.extra["beats_roofline"] is True and flagged.reason == "beats_roofline"
    fast_host = Peaks(host="h", device="cpu", device_name="x", copy_gbps=1e5, matmul_gflops=1e6)
    honest = roofline(Profile(ok=True, candidate=t, flops=1e9, min_bytes=1e8), fast_host)
    assert honest.ok and honest.extra["beats_roofline"] is False


def test_8b_split_bf16_products_are_left_to_the_numbers_under_strict() -> None:
    from kforge.verifier.checks import splits_into_half_parts

    split = honest_with("        hi = y.to(torch.bfloat16)\n        lo = (y - hi.to(torch.float32)).to(torch.bfloat16)\n"
                        "        return hi.to(torch.float32) + lo.to(torch.float32)")
    assert "precision_below_policy" not in _codes(split)  # bf16x3-style split: the numbers decide
    plain = honest_with("        return y.to(torch.bfloat16).to(torch.float32)")
    assert "precision_below_policy" in _codes(plain)
    assert verify(plain).reason == "precision_below_policy"
    import ast
    assert not splits_into_half_parts(ast.parse("y = x - z.to(torch.float32)"))  # no bf16 anywhere
    fp16 = honest_with("        hi = y.to(torch.float16)\n        lo = (y - hi.to(torch.float32)).to(torch.float16)\n"
                       "        return hi.to(torch.float32) + lo.to(torch.float32)")
    assert "precision_below_policy" not in _codes(fp16)  # fp16x3-style split, likewise
    assert "precision_below_policy" in _codes(honest_with("        return y.half().float()"))
