"""Containers the frameworks' tree utilities keep whole, mapped for them (backends' Ops)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

__all__ = ["map_dataclass"]


def map_dataclass(obj: Any, mapper: Callable[[Any], Any]) -> Any:
    """A copy of dataclass instance `obj` with `mapper` applied to each field (frozen ones
    too) and, for one that is also a dict (transformers' ``ModelOutput``), to each item: its
    fields and items are the same values seen twice."""
    rebuilt = copy.copy(obj)
    for field in dataclasses.fields(obj):
        object.__setattr__(rebuilt, field.name, mapper(getattr(obj, field.name)))
    if isinstance(obj, dict):
        for key, value in dict.items(obj):
            dict.__setitem__(rebuilt, key, mapper(value))
    return rebuilt
