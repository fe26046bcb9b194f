"""Dynamic probes the worker runs around each candidate call (worker side, imports torch).

- ``Integrity``: identities of the timers, torch entry points and every function and class of
  the harness's own modules (``kforge.*`` as loaded before the candidate), taken before the
  candidate is imported; any replacement afterwards is harness tampering.
- ``global_state``: global torch state (module hooks, dispatch and function modes, backend
  flags, thread counts), trace hooks and the environment, before and after: a change is
  ``global_state_tampering``.
- ``precision_flags``: TF32 / matmul-precision switches, read after every call.
- ``LaunchCounter``: our kernels (``kforge::`` profiler regions, Triton JIT launches, CUDA
  kernels not issued by aten) and the aten ops a call ran.
- ``output_report``: exact type, device, aliasing with the inputs; ``encode_tensor`` for the wire.
- ``background_work``: Python threads and child processes still alive after a call returns.
"""

from __future__ import annotations

import builtins
import inspect
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from kforge.verifier.protocol import tensor_bytes, wire_dtype

# Aten ops that are plumbing, not compute: never "the reference's compute" by themselves.
PLUMBING = (
    "empty", "view", "reshape", "_reshape", "as_strided", "detach", "contiguous", "copy_", "to",
    "_to_copy", "clone", "expand", "t", "transpose", "permute", "unsqueeze", "squeeze",
    "select", "slice", "resolve_conj", "resolve_neg", "lift", "alias", "fill_", "zero_",
    "zeros", "ones", "full", "zeros_like", "ones_like", "empty_like", "empty_strided", "flatten",
    "unbind", "split", "chunk", "narrow", "item", "_local_scalar_dense", "numpy_T", "is_nonzero",
    "result_type", "size", "stride", "set_", "record_stream", "_unsafe_view", "cat", "stack",
)
# Compute classes that a candidate may not hand back to PyTorch (item 1 of VERIFY.md).
HEAVY = (
    "mm", "bmm", "addmm", "matmul", "linear", "baddbmm", "addbmm", "dot", "mv", "einsum",
    "convolution", "conv", "_softmax", "softmax", "_log_softmax", "log_softmax", "logsumexp",
    "layer_norm", "native_layer_norm", "group_norm", "native_group_norm", "batch_norm",
    "native_batch_norm", "instance_norm", "rms_norm", "_fused_rms_norm", "scaled_dot_product",
    "sum", "mean", "max", "amax", "min", "amin", "prod", "var", "std", "norm", "cumsum",
    "argmax", "argmin", "sort", "topk",
)


def op_base(name: str) -> str:
    return name.removeprefix("aten::").split(".")[0]


def is_plumbing(name: str) -> bool:
    return op_base(name) in PLUMBING


def is_heavy(name: str) -> bool:
    base = op_base(name)
    return base in HEAVY or base.startswith(("conv", "cudnn_", "mkldnn_", "_convolution"))


class Integrity:
    """Identities of what a candidate must not replace; ``changed()`` names what moved."""

    def __init__(self, harness: list[tuple[Any, str, list[str]]]) -> None:
        self.watch: dict[str, tuple[Any, str, Any]] = {}
        self.cells: dict[str, tuple[int, ...]] = {}
        self._add(time, "time", ["perf_counter", "perf_counter_ns", "time", "monotonic", "sleep"])
        self._add(os, "os", ["_exit", "write", "fork"])
        self._add(builtins, "builtins", ["isinstance", "type", "len", "print", "open", "id"])
        self._add(torch, "torch", ["allclose", "equal", "isclose", "isfinite", "manual_seed",
                                   "empty", "randn", "rand", "matmul", "softmax", "empty_like"])
        self._add(torch.Tensor, "torch.Tensor", ["__eq__", "clone", "cpu", "numpy", "to",
                                                 "data_ptr", "contiguous", "__torch_function__"])
        self._add(torch.nn.Module, "torch.nn.Module", ["__call__", "_call_impl", "load_state_dict"])
        self._add(F, "F", ["linear", "conv2d", "softmax", "layer_norm"])
        self._add(torch.cuda, "torch.cuda", ["synchronize", "Event", "current_stream"])
        self._add(torch.profiler, "torch.profiler", ["profile", "record_function"])
        for owner, label, names in harness:
            self._add(owner, label, names)
        for name, module in sorted(sys.modules.items()):  # every function and class of the harness
            if name.startswith("kforge.") and module is not None and not name.startswith(CANDIDATE_SIDE):
                self._add(module, name, _own_callables(module))

    def _add(self, owner: Any, label: str, names: list[str]) -> None:
        for name in names:
            if hasattr(owner, name):
                value = inspect.getattr_static(owner, name)
                self.watch[f"{label}.{name}"] = (owner, name, value)
                self.cells[f"{label}.{name}"] = _cells(value)

    def changed(self) -> list[str]:
        """What was rebound, and functions whose code, defaults or closure cells changed."""
        moved = []
        for key, (owner, name, original) in self.watch.items():
            if inspect.getattr_static(owner, name, None) is not original:
                moved.append(key)
            elif _cells(original) != self.cells[key]:
                moved.append(f"{key} (code, defaults or closure)")
        return moved


CANDIDATE_SIDE = ("kforge.platforms", "kforge_candidate")  # what candidates call into: theirs to use


def _own_callables(module: Any) -> list[str]:
    """Names of the functions and classes a module defines itself (not what it imported)."""
    out = []
    for name, value in list(vars(module).items()):
        if (inspect.isfunction(value) or inspect.isclass(value)) and getattr(value, "__module__", None) == module.__name__:
            out.append(name)
    return out


MODULE_HOOKS = ("_global_backward_hooks", "_global_backward_pre_hooks", "_global_buffer_registration_hooks",
                "_global_forward_hooks", "_global_forward_hooks_always_called", "_global_forward_hooks_with_kwargs",
                "_global_forward_pre_hooks", "_global_module_registration_hooks",
                "_global_parameter_registration_hooks")
# Precision switches are not here: ``precision_flags`` holds them to the policy.
BACKEND_FLAGS = (("cudnn", "enabled"), ("cudnn", "benchmark"), ("cudnn", "deterministic"), ("mkldnn", "enabled"),
                 ("opt_einsum", "enabled"), ("mha", "get_fastpath_enabled"))
ENV_IGNORED = frozenset({"KFORGE_LINK_FDS", "KFORGE_CLOCK_FDS", "KFORGE_JUDGE_FD", "KFORGE_RESULT_FD"})


def global_state() -> dict[str, Any]:
    """What a candidate could change to reach code outside its own: every entry comparable
    with ``==`` and JSON-safe (``state_changes`` names what differs)."""
    import torch.nn.modules.module as module_mod

    state: dict[str, Any] = {}
    for name in MODULE_HOOKS:
        hooks = getattr(module_mod, name, None)
        state[f"nn.Module.{name}"] = len(hooks) if hasattr(hooks, "__len__") else repr(hooks)
    for name in ("_len_torch_dispatch_stack", "_len_torch_function_stack"):
        fn = getattr(torch._C, name, None)
        state[f"torch.{name.removeprefix('_len_')}"] = int(fn()) if fn is not None else 0
    for group, flag in BACKEND_FLAGS:
        owner = getattr(torch.backends, group, None)
        value = getattr(owner, flag, None) if owner is not None else None
        if callable(value):
            value = value()
        state[f"torch.backends.{group}.{flag}"] = repr(value)
    state["torch.deterministic_algorithms"] = bool(torch.are_deterministic_algorithms_enabled())
    state["torch.default_dtype"] = str(torch.get_default_dtype())
    state["torch.num_threads"] = int(torch.get_num_threads())
    state["torch.num_interop_threads"] = int(torch.get_num_interop_threads())
    state["sys.trace"] = repr(sys.gettrace())
    state["sys.profile"] = repr(sys.getprofile())
    state["threading.trace"] = repr(getattr(threading, "gettrace", lambda: None)())
    state["sys.switch_interval"] = sys.getswitchinterval()
    state["env"] = {k: v for k, v in os.environ.items() if k not in ENV_IGNORED}
    return state


def state_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs between two :func:`global_state` readings, named for a human."""
    out = []
    for key in sorted(before.keys() | after.keys()):
        if key == "env":
            a, b = before.get("env", {}), after.get("env", {})
            for var in sorted(a.keys() | b.keys()):
                if a.get(var) != b.get(var):
                    out.append(f"environment variable {var} {'set' if var not in a else 'changed'}")
        elif before.get(key) != after.get(key):
            out.append(f"{key}: {before.get(key)!r} -> {after.get(key)!r}")
    return out


def _cells(fn: Any) -> tuple[int, ...]:
    """Identities of a plain function's code, defaults and closure cell contents."""
    if not inspect.isfunction(fn):
        return ()
    ids = [id(fn.__code__), id(fn.__defaults__), id(fn.__kwdefaults__)]
    for cell in fn.__closure__ or ():
        try:
            ids.append(id(cell.cell_contents))
        except ValueError:  # an empty cell
            ids.append(0)
    return tuple(ids)


def precision_flags() -> dict[str, Any]:
    flags: dict[str, Any] = {"float32_matmul_precision": torch.get_float32_matmul_precision()}
    flags["cuda_matmul_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    flags["cudnn_allow_tf32"] = bool(torch.backends.cudnn.allow_tf32)
    flags["autocast"] = bool(torch.is_autocast_enabled())
    return flags


def precision_violations(flags: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """Precision switches the candidate turned on (PyTorch's own defaults are not its doing)."""
    bad = []
    if flags["float32_matmul_precision"] != baseline.get("float32_matmul_precision", "highest"):
        bad.append(f"float32 matmul precision {flags['float32_matmul_precision']!r}")
    for key in ("cuda_matmul_allow_tf32", "cudnn_allow_tf32", "autocast"):
        if flags[key] and not baseline.get(key, False):
            bad.append(f"{key} enabled")
    return bad


class LaunchCounter:
    """Counts Triton JIT launches by wrapping the launcher class (installed before import)."""

    def __init__(self) -> None:
        self.triton_launches = 0
        self._installed = False

    def install(self) -> None:
        try:
            from triton.runtime import jit
        except Exception:  # noqa: BLE001 - triton absent or broken: nothing to count
            return
        counter = self
        for cls_name in ("JITFunction",):
            cls = getattr(jit, cls_name, None)
            if cls is None or not hasattr(cls, "run"):
                continue
            original = cls.run

            def run(self: Any, *args: Any, __orig: Any = original, **kwargs: Any) -> Any:
                counter.triton_launches += 1
                return __orig(self, *args, **kwargs)

            cls.run = run
        try:
            from triton.runtime import interpreter

            cls = interpreter.InterpretedFunction
            original_i = cls.run

            def run_i(self: Any, *args: Any, __orig: Any = original_i, **kwargs: Any) -> Any:
                counter.triton_launches += 1
                return __orig(self, *args, **kwargs)

            cls.run = run_i
        except Exception:  # noqa: BLE001 - interpreter not available in this triton
            pass
        self._installed = True


# Kernels PyTorch's own libraries launch (cuBLAS/cuBLASLt names: *xmma*, nvjet*, cutlass*).
# Not a bare "gemm": a candidate's own kernel may well be called kf_gemm_kernel.
AT_KERNEL_MARKERS = ("at::native", "at_cuda_detail", "cublas", "cutlass", "cudnn", "xmma", "nvjet",
                     "ampere_", "Memcpy", "Memset")


def profile_events(prof: Any) -> tuple[list[str], list[str], list[str]]:
    """(aten ops, our CPU regions, device kernels not issued by aten) of a profiled call."""
    ops, ours, device_kernels = [], [], []
    for e in prof.events():
        name = e.name
        if name.startswith("kforge::"):
            ours.append(name)
        elif name.startswith("aten::"):
            ops.append(name)
        elif str(e.device_type).endswith("CUDA") and not any(m in name for m in AT_KERNEL_MARKERS):
            device_kernels.append(name)
    return ops, ours, device_kernels


def storage_span(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def output_report(out: Any, inputs: list[Any], device: str) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """Check an output object without calling anything it overrides; returns (report, tensors)."""
    items: list[Any]
    if type(out) is torch.Tensor:
        items, structure = [out], "tensor"
    elif type(out) in (tuple, list):
        items, structure = list(out), type(out).__name__
    else:
        return {"rigged": f"output is a {type(out).__module__}.{type(out).__qualname__}, "
                          "not a torch.Tensor or a tuple of them"}, []
    for item in items:
        if type(item) is not torch.Tensor:
            return {"rigged": f"output item is a {type(item).__qualname__}, not exactly torch.Tensor"}, []
    report: dict[str, Any] = {"structure": structure, "aliases": [], "wrong_device": []}
    spans = [storage_span(t) for t in inputs if isinstance(t, torch.Tensor)]
    for i, t in enumerate(items):
        if t.device.type != torch.device(device).type or t.is_meta:
            report["wrong_device"].append(f"output {i} on {t.device}")
            continue
        lo, hi = storage_span(t)
        if t.numel() and any(lo < b and a < hi for a, b in spans):
            report["aliases"].append(i)
    return report, items


def encode_tensor(t: torch.Tensor) -> tuple[dict[str, Any], bytes]:
    wire = wire_dtype(str(t.dtype))
    target = {"float64": torch.float64, "float32": torch.float32, "int64": torch.int64}[wire]
    data = t.detach().to("cpu")
    if data.is_complex():
        data = torch.view_as_real(data)
    raw = tensor_bytes(data.to(target))
    meta = {"shape": list(t.shape), "dtype": str(t.dtype), "wire": wire, "device": str(t.device)}
    return meta, raw


def background_work(threads_before: set[int], harness_pids: frozenset[int] = frozenset()) -> list[str]:
    """Python threads started by the call and still running, and child processes alive (but
    ``harness_pids``: the on-device comparison's judge, started before the candidate import)."""
    alive = [
        f"thread {t.name!r}" for t in threading.enumerate()
        if t.ident not in threads_before and t.is_alive() and t is not threading.current_thread()
    ]
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me and fields[0] != "Z" and int(entry.name) not in harness_pids:
            alive.append(f"child process {entry.name}")
    return alive


def settle(seconds: float = 0.05) -> None:
    """Give background work a moment to show itself (the output changing after return)."""
    time.sleep(seconds)
