"""The graph wrapper's lending rule (``triton_graph.GRAPH_HELPER``) on CPU tensors: a lent output
is a tensor over the graph's memory with a storage of its own, and the next replay may rewrite
that memory only once every tensor of the caller's that reaches it is gone. The CUDA replay
around it runs on the GPU (tests/platforms/test_gpu_graph.py); the bookkeeping is plain torch
and is checked here."""

from __future__ import annotations

from typing import Any

import torch

from kforge.agents.expert.codegen.triton.graph import GRAPH_HELPER


def _helpers() -> dict[str, Any]:
    ns: dict[str, Any] = {"torch": torch, "_INTERPRETED": False}
    exec(compile(GRAPH_HELPER, "graph_helper", "exec"), ns)  # noqa: S102 - our own template
    return ns


def test_a_lent_output_is_returned_only_when_nothing_reaches_it() -> None:
    h = _helpers()
    graph_out = torch.arange(12.0).reshape(3, 4)
    lent, refs = h["_kf_lend"](graph_out)
    assert lent.data_ptr() == graph_out.data_ptr()  # no copy
    assert lent.untyped_storage()._cdata != graph_out.untyped_storage()._cdata  # its own storage
    view = lent[1:].detach()  # a detached view of it: still the caller's
    del lent
    assert not h["_kf_returned"](refs) and refs  # held: the next call must not replay into it
    del view
    assert h["_kf_returned"](refs) and refs == []  # all gone: free again, the references released


def test_every_tensor_of_a_nested_result_is_watched() -> None:
    h = _helpers()
    a, b, c = torch.zeros(2), torch.ones(3), torch.full((4,), 2.0)
    out = (a, (b, c), 7)
    assert [t.data_ptr() for t in h["_kf_outputs"](out)] == [a.data_ptr(), b.data_ptr(), c.data_ptr()]
    lent, refs = h["_kf_lend"](out)
    assert len(refs) == 3 and lent[2] == 7
    inner = lent[1][1]
    del lent
    assert not h["_kf_returned"](refs)  # the innermost tensor is still held
    del inner
    assert h["_kf_returned"](refs)
    # a clone is what the copier path hands out: memory of its own
    copied = h["_kf_map"](torch.Tensor.clone, out)
    assert copied[1][0].data_ptr() != b.data_ptr() and torch.equal(copied[1][0], b)
