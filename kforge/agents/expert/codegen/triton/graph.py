"""CUDA graph replay for a generated Triton candidate (the ``cuda_graph`` knob).

A generated ``forward`` is Python: parameter lookups, shape guards, allocations and one
Triton launch per kernel (the precast passes included). Measured on the H200 with a full
device sync before each timed call (``benchmarks/results/pipeline_level2_gemm_h200.md``),
that host side leaves the GPU idle for 0.2-0.3 ms per call around a 0.2-0.6 ms GEMM. With the
knob on, ``forward`` runs eagerly the first time it sees a set of buffers (inputs, parameters
and buffers by address, shape, stride and dtype), captures a CUDA graph of the same work the
second time, and from then on replays it: every kernel runs again on every call (the graph
reads the buffers' current contents; nothing is cached but the launch sequence).

The result lives in the graph's memory, which the next replay rewrites. It is lent without a
copy (21 us of a 0.35 ms call for a 1024 x 8192 output on the H100,
``benchmarks/results/call_overhead_gpu.md``): the caller gets a tensor over that memory whose
storage is its own (``torch.from_dlpack``), and a weak reference to that storage says when
every tensor of the caller's that reaches it (views and detached ones included) is gone. Until
then a call replays a second graph of the same work, captured in the first one's memory pool,
and copies its output out, so a held result never changes under its holder. An output that
shares storage with anything else (another output, an input, a parameter) is always copied.

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

from kforge.agents.expert.plan.kernels import Program

GRAPH_HELPER = '''_KF_GRAPHS_MAX = 8  # buffer sets kept per module (each holds its own temporaries)


def _kf_graph_key(module, args):
    key = []
    for t in (*args, *module.parameters(), *module.buffers()):
        if isinstance(t, torch.Tensor):  # device pointers are unique across devices (UVA)
            key.append((t.data_ptr(), t.shape, t.stride(), t.dtype))
        else:
            key.append(repr(t))
    return tuple(key)


def _kf_outputs(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _kf_outputs(o)] if isinstance(out, tuple) else []


def _kf_map(fn, out):
    if isinstance(out, torch.Tensor):
        return fn(out)
    if isinstance(out, tuple):
        return tuple(_kf_map(fn, o) for o in out)
    return out


def _kf_storages(ts):
    return [t.untyped_storage().data_ptr() for t in ts if isinstance(t, torch.Tensor)]


def _kf_lend(out):
    """New tensors over the graph's output memory, each with a storage of its own (DLPack), and
    weak references to those storages: expired, nobody holds the result any more (views and
    detached copies of it keep its storage alive)."""
    lent = _kf_map(torch.from_dlpack, out)
    return lent, [t.untyped_storage()._weak_ref() for t in _kf_outputs(lent)]


def _kf_returned(refs):
    """Has the caller dropped every tensor lent last time (their weak references released)?"""
    if not all(torch.UntypedStorage._expired(r) for r in refs):
        return False
    for r in refs:
        torch.UntypedStorage._free_weak_ref(r)
    refs.clear()
    return True


def _kf_capture(fn, args, pool):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        out = fn(*args)
    return graph, out


def _kf_graphed(module, fn, args):
    """fn(*args), replayed from a CUDA graph once these buffers have been seen before."""
    graphs = getattr(module, "_kf_graphs", None)
    if graphs is None:
        graphs = module._kf_graphs = {}
    if (_INTERPRETED or not any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
            or torch.cuda.is_current_stream_capturing()
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
        graph, out = _kf_capture(fn, args, None)
        # lent only where each output has storage of its own (no alias of another output, an
        # input, a parameter or a buffer)
        mine = _kf_storages(_kf_outputs(out))
        theirs = set(_kf_storages((*args, *module.parameters(), *module.buffers())))
        lend = bool(mine) and len(set(mine)) == len(mine) and not theirs.intersection(mine)
        entry = graphs[key] = [graph, out, [], lend, None]
    graph, out, refs, lend, copier = entry
    if lend and _kf_returned(refs):
        graph.replay()
        lent, entry[2] = _kf_lend(out)
        return lent
    if not lend:
        graph.replay()
        return _kf_map(torch.Tensor.clone, out)
    if copier is None:  # the caller still holds the lent result: a second graph, copied out
        copier = entry[4] = _kf_capture(fn, args, graph.pool())
    copier[0].replay()
    return _kf_map(torch.Tensor.clone, copier[1])
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
