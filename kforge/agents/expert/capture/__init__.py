"""Capture: a problem's ``Model`` traced by PyTorch's own machinery into an ATen graph with
symbolic sizes (:mod:`.trace`); convolutions become implicit GEMMs during the trace
(:mod:`.conv`)."""
