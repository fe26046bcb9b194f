"""CUDA graph replay for a generated Triton candidate (the ``cuda_graph`` knob).

A generated ``forward`` is Python: parameter lookups, shape guards, allocations and one
Triton launch per kernel (the precast passes included). Measured on the H200 with a full
device sync before each timed call (``benchmarks/results/pipeline_level2_gemm_h200.md``),
that host side leaves the GPU idle for 0.2-0.3 ms per call around a 0.2-0.6 ms GEMM. With the
knob on, ``forward`` runs eagerly the first time it sees a set of buffers (inputs, parameters
and buffers by address, shape, stride and dtype), captures a CUDA graph of the same work the
second time, and from then on replays it: every kernel runs again on every call (the graph
reads the buffers' current contents; nothing is cached but the launch sequence), and the
result is copied out of the graph's memory so each call returns a tensor of its own.

The knob is on from round 0 wherever the program can be captured (:func:`graphable`): that
gap was on every row of the H200 run above and cost more than any tile choice. The analysis
turns it off when a profile taken with it on still shows the GPU idle (the calls came on
buffers no graph was captured for, so the graph never replayed); it turns it on after a round
that had it off and shows the gap. A graph holds its own temporaries (up to
``_KF_GRAPHS_MAX`` buffer sets per module), the price of the replay.

Where it does not apply the eager path runs: the Triton interpreter or no CUDA device, a
capture already under way (the caller's own graph), inputs that require grad. Programs that
write module state (BatchNorm's running statistics) or take a Python scalar as an input (its
host-to-device copy cannot be captured) never get the knob (:func:`graphable`); a capture
that fails anyway raises (no silent fallback: the verifier would call it one).
"""

from __future__ import annotations

from typing import Any

from kforge.agents.expert.kernels import Program

GRAPH_HELPER = '''_KF_GRAPHS_MAX = 8  # buffer sets kept per module (each holds its own temporaries)


def _kf_graph_key(module, args):
    key = []
    for t in (*args, *module.parameters(), *module.buffers()):
        if isinstance(t, torch.Tensor):
            key.append((t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device))
        else:
            key.append(repr(t))
    return tuple(key)


def _kf_copy_out(out):
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, tuple):
        return tuple(_kf_copy_out(o) for o in out)
    return out


def _kf_graphed(module, fn, args):
    """fn(*args), replayed from a CUDA graph once these buffers have been seen before."""
    graphs = getattr(module, "_kf_graphs", None)
    if graphs is None:
        graphs = module._kf_graphs = {}
    if (_INTERPRETED or not torch.cuda.is_available()
            or torch.cuda.is_current_stream_capturing()
            or not any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
            or (torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args))):
        return fn(*args)
    key = _kf_graph_key(module, args)
    entry = graphs.get(key)
    if entry is None:  # first call on these buffers: eager (and every kernel compiled)
        while len(graphs) >= _KF_GRAPHS_MAX:
            graphs.pop(next(iter(graphs)))
        graphs[key] = "seen"
        return fn(*args)
    if entry == "seen":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = fn(*args)
        entry = graphs[key] = (graph, out)
    graph, out = entry
    graph.replay()
    return _kf_copy_out(out)
'''


def graphable(program: Program) -> bool:
    """Can the program's forward be captured and replayed as it is?"""
    scalar_input = any(program.buffers[n].kind == "input" and program.buffers[n].shape == ()
                       for n in program.placeholders)
    return bool(program.kernels) and not scalar_input and not writes_state(program)


def writes_state(program: Program) -> bool:
    """Does a kernel store into an input or a parameter / buffer of the module?"""
    kinds = {name: buf.kind for name, buf in program.buffers.items()}
    for k in program.kernels:
        stores: list[Any] = []
        for attr in ("stores", "outer_stores", "full_stores"):
            stores += list(getattr(k, attr, []) or [])
        if getattr(k, "store", None) is not None:
            stores.append(k.store)  # type: ignore[union-attr]
        if any(kinds.get(s.buffer) in ("input", "param") for s in stores):
            return True
    return False


def graphed_class(model_new: str) -> str:
    """The ``ModelNew`` source with ``forward`` renamed ``_kf_forward`` and a replaying
    ``forward`` in front of it."""
    head = "    def forward(self, "
    if model_new.count(head) != 1:
        raise ValueError("expected one forward() in the generated ModelNew")
    wrapper = ("    def forward(self, *args):\n"
               "        return _kf_graphed(self, self._kf_forward, args)\n\n")
    return model_new.replace(head, wrapper + "    def _kf_forward(self, ")
