"""Platforms: one adapter module per platform (``kforge/platforms/<name>.py`` exposing
``PLATFORM``) plus one one-shot example folder (``refs/<name>/``). See docs/ADDING_A_PLATFORM.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: base imports this registry (load_example)
    from kforge.platforms.base import Platform

KNOWN_PLATFORMS = ("cpu", "triton", "cuda", "metal")


class UnknownPlatformError(KeyError):
    pass


def get_platform(name: str) -> Platform:
    """The adapter for ``name``: a module ``kforge.platforms.<name>``, or a dotted module path
    (``mypkg.myplatform``) for a platform that lives outside this package."""
    module_name = name if "." in name else f"kforge.platforms.{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:
            raise
        raise UnknownPlatformError(
            f"unknown platform {name!r}: no adapter module {module_name}; known: {', '.join(KNOWN_PLATFORMS)}"
        ) from None
    platform = getattr(module, "PLATFORM", None)
    if platform is None:
        raise UnknownPlatformError(f"adapter module {module_name} defines no PLATFORM object")
    return platform
