"""The registry of ATen handlers (a leaf): overload packet name -> the function that turns
one fx node into IR nodes. :mod:`.aten` and :mod:`.inplace` fill it with :func:`handles`;
:mod:`.build` looks each traced node up in it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from kforge.agents.expert.ir.build import Builder

Handler = Callable[["Builder", "torch.fx.Node"], Any]
HANDLERS: dict[str, Handler] = {}


def handles(*names: str) -> Callable[[Handler], Handler]:
    """Register the decorated handler for each ATen / prims packet name (``prims.`` prefixed)."""
    def register(fn: Handler) -> Handler:
        for n in names:
            HANDLERS[n] = fn
        return fn
    return register


def arg(fx: Any, i: int, name: str, default: Any = None) -> Any:
    """The fx node's argument ``i`` (positional) or ``name`` (keyword), else ``default``."""
    if len(fx.args) > i:
        return fx.args[i]
    return fx.kwargs.get(name, default)
