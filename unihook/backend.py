"""The backend SDK: what a backend plugin imports from unihook besides the public API.

A backend implements the hookspecs of `unihook.spec` (its registration functions return
`unihook.Handle`) and builds on the helpers below; the modules they come from are private and
may change, this module's names are the contract. ARCHITECTURE.md shows how the built-in
backends use them.

- **Module backward hooks** with torch's semantics on any autograd: implement `Autograd` (an
  identity node, version counters, installing two forward hooks as `Dispatchers`), then
  `register_backward_hook` per module and `add_global_backward_hook` for global ones.
  `ModuleBackward` is the state those dispatchers run; `has_module_backward` tells whether a
  module has its own. A framework with module backward hooks of its own can have them run
  among unihook's, in the order of registration (the optional `Autograd` members `rank`,
  `natives`, `pending`): `call_holder(module)` marks a call in flight from the moment the
  framework reads the module's hooks (the torch backend's ``_native_backward``).
- **Pinned hook dicts**: `pin` / `unpin` keep unihook's dispatchers last in a module's forward
  hook dict (`HookDict`), `Pinned` installs a pair of them as `Dispatchers`; `Access` is how a
  backend reads and replaces its framework's hook dicts (`iterates_live`: its framework
  iterates them live in a call, so a pickled one comes back as a snapshotting dict).
  `pinned_key` and `Pinned.find` find a dispatcher already pinned in dicts a shallow copy
  shares with its original; `new_key` draws a hook's id past the keys a module loaded from
  another process's pickle brought. `dicts_of` and `unpin_orphaned` remove a hook `pin` put in
  once its module died, from the dicts a shallow copy shares (as the framework's own handle).
- **Error sites**: `Site` names a hook in messages (`Site.error` builds the exception),
  `global_label` maps a global hookspec kind to its handle kind, `type_name` the short type.
- **Return-value checks**: `check_grad` / `check_grad_like` for gradients a hook returns,
  `checked_kwargs_pre_hook` / `kwargs_post_hook` / `check_pre_kwargs_result` for with_kwargs
  forward hooks, `show_value` for what a message says was received.
- **Locks**: `RegistryLock` for a backend's registry (``with lock, lock.mutex:``), so a removal
  a finalizer asks for while the thread holds it (the garbage collector runs anywhere) waits
  instead of deadlocking, and a Ctrl-C never leaves it held. `defer_while_locked(action)`
  for a removal that takes a lock of the framework's: asked for by a finalizer inside a
  registration, it runs when the thread lets go of its registry locks.
  `collector_paused()`: the garbage collector off while any thread is inside one (``with
  collector_paused():``; counted across threads: pausing it by hand on two threads at once
  could leave it off for good; a Ctrl-C anywhere in a ``with`` statement's pause leaves
  nothing counted, one entered through ``ExitStack`` or a wrapper and then held by a cycle
  stays counted: see ``unihook._collector``; one pause per ``with`` statement,
  ``ExitStack.enter_context`` or wrapper; not across a greenlet switch).
  `collector_kept_off()` inside one: off again where another thread's own
  ``gc.disable()`` / ``gc.enable()`` bracket turned it on meanwhile.
- **Ctrl-C**: `undo_if_unfinished(remover)` before each step of a registration: a
  registration cut short (a KeyboardInterrupt anywhere in it) is undone; removers must be
  idempotent (see ``unihook._locks``).
- **Laziness**: `when_imported` / `install_when_imported` run code when the framework gets
  imported, without importing it (a global hook registered before the framework);
  `cancel_when_imported` cancels a callback (taken before registering it). A module another
  thread is importing is in ``sys.modules`` half made: `imported(name)` is None until its
  import ends, and a callback asked for meanwhile runs as it ends.
- **Compilers**: `add_compiler_escape(escape, tracing)`, when the backend is loaded, if its
  framework compiles Python by tracing it (torch.compile's dynamo): while `tracing()`, a
  global hook registered inside a compiled function is registered through
  `escape(call, "registration")`, outside the compiler; so are a removal (`Handle.remove`,
  "removal") and `unihook.backends()` ("backends"), each named for the compiler's error
  where it cannot leave its graph. `eager_entries()`: the core's functions the framework
  calls on its own (the adapters and wrappers unihook places as hooks), which such a compiler
  must not compile as frames of their own (`eager_entry` marks one: the recipes' wrappers).
  `add_hook_compiler(reader, compiler, module_local, backend)` if the framework compiles a
  module's hooks from their source, reading their `__name__` in `reader` (torch.jit.script):
  the objects unihook places as hooks (and a backend's own: ``__name__ = HookName(site_of,
  received)`` in their class) raise `ScriptedHookError` there instead of being skipped.
  `add_compiler_pause(pause)` if that compiler hooks every Python call on a thread (dynamo's
  frame callback, which takes dynamo's compile lock): it is paused while the thread holds a
  registry lock (see ``unihook._locks``).
- **Ops**: a backend's ``unihook_ops`` returns a subclass of `unihook.ops.Ops` (the base class of
  the ops facet: defaults where one is right, NotImplementedError naming the method where
  not); `map_dataclass` maps the fields of a dataclass output (``tensors_in``);
  `history_reaches` walks autograd graphs for `Ops.derived`.
"""

from __future__ import annotations

from typing import Any

from ._checks import (
    check_grad,
    check_grad_like,
    check_pre_kwargs_result,
    checked_kwargs_pre_hook,
    kwargs_post_hook,
    show_value,
)
from ._collector import collector_kept_off, collector_paused
from ._describe import Site, type_name
from ._entries import eager_entries, eager_entry
from ._global_table import add_to_global_table
from ._history import history_reaches
from ._hook_names import HookName, add_hook_compiler
from ._identity import WeakIdentityKeys
from ._imports import cancel_when_imported, imported, install_when_imported, when_imported
from ._kept_inputs import check_kept_input, check_returned_input, kept_inputs, note_changes
from ._locks import RegistryLock, add_compiler_pause, defer_while_locked, undo_if_unfinished
from ._module_backward import (
    Autograd,
    Dispatchers,
    ModuleBackward,
    _states,
    add_global_backward_hook,
    call_holder,
    held_tensors,
    items_of,
    register_backward_hook,
    walk_tensors,
)
from ._pinned import (
    Access,
    HookDict,
    Pinned,
    SnapshotDict,
    dicts_of,
    new_key,
    pin,
    pinned_key,
    unpin,
    unpin_orphaned,
)
from ._plugins import add_compiler_escape
from ._structures import map_dataclass
from .kinds import global_label

__all__ = [
    "Access",
    "Autograd",
    "Dispatchers",
    "HookDict",
    "HookName",
    "ModuleBackward",
    "Pinned",
    "RegistryLock",
    "Site",
    "SnapshotDict",
    "WeakIdentityKeys",
    "add_compiler_escape",
    "add_compiler_pause",
    "add_global_backward_hook",
    "add_hook_compiler",
    "add_to_global_table",
    "cancel_when_imported",
    "check_grad",
    "check_grad_like",
    "check_kept_input",
    "check_returned_input",
    "collector_kept_off",
    "collector_paused",
    "check_pre_kwargs_result",
    "checked_kwargs_pre_hook",
    "defer_while_locked",
    "dicts_of",
    "eager_entries",
    "eager_entry",
    "global_label",
    "has_module_backward",
    "held_tensors",
    "history_reaches",
    "imported",
    "install_when_imported",
    "items_of",
    "kept_inputs",
    "kwargs_post_hook",
    "map_dataclass",
    "note_changes",
    "new_key",
    "pin",
    "pinned_key",
    "register_backward_hook",
    "show_value",
    "type_name",
    "undo_if_unfinished",
    "unpin",
    "unpin_orphaned",
    "walk_tensors",
    "when_imported",
    "call_holder",
]


def has_module_backward(module: Any) -> bool:
    """Whether `module` has backward hooks of its own registered (through
    `register_backward_hook`): its own dispatchers then run the backend's global backward
    hooks too, so the global dispatchers must not be pinned on it as well."""
    return module in _states
