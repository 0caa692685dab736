"""Hook kinds: the one table every other list of kinds is derived from.

A kind's name is what a `Handle`'s ``kind`` and error messages say ("forward_pre",
"module_forward", "buffer_registration"). Each kind targets a module, a tensor, every module
of a backend (a global hook) or every registration on a module; it accepts the options listed
here, and a global kind reaches the ``unihook_register_global_hook`` hookspec under its
`spec_kind` (a global forward hook is ``kind="forward"`` there). Adding a kind starts here:
ARCHITECTURE.md has the rest of the touch list.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Literal, Mapping, NamedTuple, get_args

__all__ = [
    "GLOBAL_KINDS",
    "KINDS",
    "KIND_INFO",
    "MODULE_KINDS",
    "GlobalKind",
    "HookKind",
    "KindInfo",
    "ModuleKind",
    "Option",
    "Target",
    "global_label",
]

#: Every hook kind of the spec (a Handle's `kind`): per object, then global.
HookKind = Literal[
    "forward_pre",
    "forward",
    "tensor",
    "full_backward_pre",
    "full_backward",
    "module_forward_pre",
    "module_forward",
    "module_full_backward_pre",
    "module_full_backward",
    "parameter_registration",
    "buffer_registration",
    "module_registration",
]

#: The per-module hook kinds `attach` takes.
ModuleKind = Literal["forward_pre", "forward", "full_backward_pre", "full_backward"]

#: The `kind` the ``unihook_register_global_hook`` hookspec receives.
GlobalKind = Literal[
    "forward_pre",
    "forward",
    "full_backward_pre",
    "full_backward",
    "parameter_registration",
    "buffer_registration",
    "module_registration",
]

#: What a hook of a kind is registered on.
Target = Literal["module", "tensor", "global", "registration"]

#: The keyword options a registration function of a kind may take.
Option = Literal["prepend", "with_kwargs", "always_call"]


class KindInfo(NamedTuple):
    """One hook kind: its name, its target, the options it accepts and, for a global or
    registration kind, the kind the global-hook hookspec receives."""

    name: HookKind
    target: Target
    options: frozenset[Option]
    spec_kind: GlobalKind | None = None


def _kind(
    name: HookKind, target: Target, *options: Option, spec_kind: GlobalKind | None = None
) -> KindInfo:
    return KindInfo(name, target, frozenset(options), spec_kind)


#: Every kind, in the order tables list them (`HookKind`'s).
KIND_INFO: Mapping[HookKind, KindInfo] = MappingProxyType(
    {
        info.name: info
        for info in (
            _kind("forward_pre", "module", "prepend", "with_kwargs"),
            _kind("forward", "module", "prepend", "with_kwargs", "always_call"),
            _kind("tensor", "tensor"),
            _kind("full_backward_pre", "module", "prepend"),
            _kind("full_backward", "module", "prepend"),
            _kind("module_forward_pre", "global", "with_kwargs", spec_kind="forward_pre"),
            _kind("module_forward", "global", "with_kwargs", "always_call", spec_kind="forward"),
            _kind("module_full_backward_pre", "global", spec_kind="full_backward_pre"),
            _kind("module_full_backward", "global", spec_kind="full_backward"),
            _kind("parameter_registration", "registration", spec_kind="parameter_registration"),
            _kind("buffer_registration", "registration", spec_kind="buffer_registration"),
            _kind("module_registration", "registration", spec_kind="module_registration"),
        )
    }
)

#: The kinds in the order tables list them.
KINDS: tuple[HookKind, ...] = get_args(HookKind)

#: The per-module kinds (`ModuleKind`), in table order.
MODULE_KINDS: tuple[ModuleKind, ...] = get_args(ModuleKind)

#: The hookspec's global kind (a `GlobalKind`) -> the kind its Handle and messages name.
GLOBAL_KINDS: Mapping[str, HookKind] = MappingProxyType(
    {info.spec_kind: info.name for info in KIND_INFO.values() if info.spec_kind is not None}
)


def global_label(kind: str) -> HookKind:
    """The handle kind of a global hook registered as `kind` ("forward" -> "module_forward",
    "buffer_registration" -> itself): what its Handle and error messages say."""
    return GLOBAL_KINDS[kind]
