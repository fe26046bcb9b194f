"""Capture: a problem's ``Model`` traced by PyTorch's own machinery into an ATen graph with
symbolic sizes (:mod:`.trace`; the ops that would pin a size swapped for the same math during the
trace: :mod:`.sizes`); convolutions become implicit GEMMs during the trace
(:mod:`.conv`)."""
