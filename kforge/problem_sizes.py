"""A problem file's size constants (a leaf: :mod:`kforge.problems` presets them,
:mod:`kforge.problem_cost` counts work at other values of them).

A size constant is a public module-level ``int`` (``batch_size = 128``) or one element of a
public tuple or list of ints (KernelBench's ``input_shape = (32768,)``, ``hidden_layer_sizes =
[32768, 32768]``), keyed ``name[i]``.
"""

from __future__ import annotations

import types


def size_constants(module: types.ModuleType) -> dict[str, int]:
    """Public module-level ``int`` constants (bools excluded), in definition order; the
    elements of a public tuple or list of ints (KernelBench's ``input_shape = (32768,)``) as
    ``name[i]``."""
    out: dict[str, int] = {}
    for key, value in vars(module).items():
        if key.startswith("_"):
            continue
        if type(value) is int:
            out[key] = value
        elif type(value) in (tuple, list) and value and all(type(v) is int for v in value):
            out.update({f"{key}[{i}]": v for i, v in enumerate(value)})
    return out


def _tuple_key(key: str) -> tuple[str, int] | None:
    if key.endswith("]") and "[" in key:
        name, index = key[:-1].split("[", 1)
        if index.isdigit():
            return name, int(index)
    return None


def get_size(module: types.ModuleType, key: str) -> int:
    """A size constant's value: ``name`` or a tuple element ``name[i]``."""
    split = _tuple_key(key)
    return getattr(module, split[0])[split[1]] if split else getattr(module, key)


def set_size(module: types.ModuleType, key: str, value: int) -> None:
    """Set a size constant: ``name``, or element i of the tuple ``name`` for ``name[i]``."""
    split = _tuple_key(key)
    if split is None:
        setattr(module, key, value)
        return
    name, index = split
    old = getattr(module, name)
    items = list(old)
    items[index] = value
    setattr(module, name, type(old)(items))
