"""Capture activations (and gradients) of many modules for the length of a scope.

A captured value is what the module returned (its args, its grad_output), even when a later
in-place op (``ReLU(inplace=True)``, ``out += identity``, ``x.add_(...)``) overwrites that
tensor. Copying every output costs about 1.15x a forward, so capture learns, per module and
kind of value, whether the framework's tensors get modified in place after being recorded. It
reads their version counters, which every in-place op bumps on a tensor, its detached aliases
and its views:

- not learned yet: keep a copy, and a detached alias with its version; when the next forward
  of the model starts or the capture is removed, a changed version marks the module "copy",
  an unchanged one "alias";
- "copy": keep a copy;
- "alias": keep the alias and its version; every read checks the version, and a changed one
  raises `StaleCaptureError` (and marks the module "copy" from the next forward on).

What is learned outlives the capture (weakly keyed by module), so later captures of the model
copy only what in-place ops touch. Writes that bypass the version counter (torch's
``t.data.add_()``, paddle's ``copy_`` and ``set_value``) are not seen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Iterator

from . import api
from ._describe import Site
from ._hook_names import HookName
from ._identity import WeakIdentityKeys
from ._locks import Collecting, registering, undo
from .compose import HookGroup, Where, select
from .errors import StaleCaptureError
from .handles import Removable
from .ops import Ops, ops_for

__all__ = ["Capture", "StaleCaptureError", "capture"]

_WHAT = {"output": "output", "inputs": "positional args", "grads": "grad_output"}

# module -> {(what, training): modified in place after capture?}; a missing key: not learned
# yet. Keyed by training mode too: in-place ops often differ (Dropout(inplace=True)).
_learned: WeakIdentityKeys[dict[tuple[str, bool], bool]] = WeakIdentityKeys()


class _Site:
    """One module, the kind of value kept of it ("output", "inputs", "grads") and its mode."""

    __slots__ = ("name", "what", "key", "flags", "backend")

    def __init__(
        self, name: str, what: str, training: bool, flags: dict[Any, bool], backend: str
    ) -> None:
        self.name, self.what, self.key = name, what, (what, training)
        self.flags, self.backend = flags, backend


Sites = tuple[_Site, _Site]  # indexed by `module.training`


def _sites(name: str, what: str, flags: dict[Any, bool], backend: str) -> Sites:
    """A module's sites in eval and in training mode."""
    return (_Site(name, what, False, flags, backend), _Site(name, what, True, flags, backend))


def _flags(module: Any) -> dict[Any, bool]:
    try:
        return _learned.setdefault(module, {})
    except TypeError:  # unhashable (a dataclass module with eq=True): learn for this capture
        return {}


class _Kept:
    """A recorded value. `aliases` share the version counters of the framework's tensors,
    whose versions were `versions` when recorded. When `copied`, `value` is a copy and the
    aliases are watched only to learn."""

    __slots__ = ("value", "aliases", "versions", "site", "copied")

    def __init__(
        self,
        value: Any,
        aliases: tuple[Any, ...],
        versions: tuple[Any, ...],
        site: _Site,
        copied: bool,
    ) -> None:
        self.value, self.aliases, self.versions = value, aliases, versions
        self.site, self.copied = site, copied


def _read(kept: _Kept, version: Callable[[Any], Any]) -> Any:
    for alias, before in zip(kept.aliases, kept.versions):
        now = version(alias)
        if now == before:
            continue
        site = kept.site
        site.flags[site.key] = True
        if kept.copied:
            kept.aliases = ()
            break
        raise StaleCaptureError(
            f"unihook.capture: the {_WHAT[site.what]} of module {site.name!r} ({site.backend}) "
            f"was modified in place after capture recorded it (version {before} -> {now}), so "
            "the recorded tensor no longer holds the value the module returned. capture copies "
            f"this module's {_WHAT[site.what]} from the next forward on: run it again."
        )
    return kept.value


class _Checked(Mapping[str, Any]):
    """`Capture.inputs` / `Capture.grads`: name -> the last value, checked on every read."""

    def __init__(self, records: dict[str, _Kept], version: Callable[[Any], Any]) -> None:
        self._records, self._version = records, version

    def __getitem__(self, name: str) -> Any:
        return _read(self._records[name], self._version)

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)


class _Own:
    """A hook of a capture's, as placed on the model: a copy of the model (a deep copy, an EMA
    or AveragedModel made in the capture's scope; a pickle) copies it inert. The capture
    records the model it was made on; until 2026-12-04 a deep copy's forwards were recorded
    into it, mixed with the model's, and a pickle raised "Can't pickle local object"
    (helper-124's FINDINGS 3 and 3b)."""

    __slots__ = ("hook",)
    __name__ = HookName(
        lambda own, module, backend: (
            Site.of("forward", backend, module),
            "a capture's hooks (remove the capture first)",
        )
    )

    def __init__(self, hook: Callable[..., None] | None) -> None:
        self.hook = hook

    def __call__(self, *args: Any) -> None:
        hook = self.hook
        if hook is not None:
            hook(*args)

    def __deepcopy__(self, memo: dict[int, Any]) -> _Own:
        return _Own(None)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Own, (None,))


class Capture(Removable):
    """What `capture` records, by qualified module name.

    ``cache[name]``: the detached output of the module's last call, as it was returned (a
    namedtuple, dict, dataclass... stays one); ``cache.calls(name)``: every call's, in order;
    ``cache.inputs[name]``: the last call's positional args (inputs=True); ``cache.grads[name]``:
    the last grad_output (grads=True; a tensor for a single-output module, else a tuple). A
    read raises `StaleCaptureError` where an in-place op changed a value capture could not know
    to copy (see the module docstring). `names` lists the modules hooked. The hooks go away
    when the scope exits (or on `remove()`); the recorded tensors then live only as long as
    this object.

    ``reuse=True`` is for repeated forwards: each forward of `model` copies every output into
    the buffers the previous forward filled (one per module call) instead of keeping the
    framework's own tensors alive, which costs most of a capture's time (allocation and page
    faults). `cache[name]` and `calls(name)` then hold the latest forward's outputs, valid
    until the next forward overwrites them (copy what you keep).
    """

    def __init__(
        self,
        model: Any,
        where: Where = None,
        *,
        inputs: bool = False,
        outputs: bool = True,
        grads: bool = False,
        reuse: bool = False,
    ) -> None:
        self._start(model, where, inputs=inputs, outputs=outputs, grads=grads, reuse=reuse)

    def _start(
        self,
        model: Any,
        where: Where,
        *,
        inputs: bool,
        outputs: bool,
        grads: bool,
        reuse: bool,
    ) -> Capture:
        """Place the hooks; returns this capture."""
        self._outputs: dict[str, list[_Kept]] = {}
        self._forwards = 0  # forwards of `model` seen (reuse: which buffers are current)
        self._filled: dict[str, list[int]] = {}  # reuse: name -> [forward, calls in it]
        self._learning: list[_Kept] = []  # copies whose aliases tell what gets modified
        self._ops: Ops = ops_for(model)
        self._version = self._ops.version
        self._inputs: dict[str, _Kept] = {}
        self._grads: dict[str, _Kept] = {}
        self.inputs: Mapping[str, Any] = _Checked(self._inputs, self._version)
        self.grads: Mapping[str, Any] = _Checked(self._grads, self._version)
        self._group = HookGroup()
        selected = select(model, where)
        self.names: list[str] = [name for name, _ in selected]
        # as attach (unihook.compose): a registration cut short undoes those made so far
        steps = Collecting()
        outer = getattr(registering, "steps", None)
        try:
            registering.steps = steps
            start = api.register_forward_pre_hook(model, _Own(self._next_forward))
            self._group.add("", start)
            for name, module in selected:
                flags = _flags(module)
                site = {w: _sites(name, w, flags, start.backend) for w in _WHAT}
                inputs_site = site["inputs"] if inputs else None
                if reuse and outputs:
                    hook = _Own(self._reusing_hook(name, site["output"], inputs_site))
                    self._group.add(name, api.register_forward_hook(module, hook, name=name))
                elif outputs or inputs:
                    output_site = site["output"] if outputs else None
                    hook = _Own(self._forward_hook(name, output_site, inputs_site))
                    self._group.add(name, api.register_forward_hook(module, hook, name=name))
                if grads:
                    hook = _Own(self._grad_hook(name, site["grads"]))
                    self._group.add(
                        name, api.register_full_backward_pre_hook(module, hook, name=name)
                    )
            registering.steps = outer
            return self
        except BaseException as error:
            registering.steps = outer
            undo(steps, error)
            self._group.remove()
            raise

    def _keep(self, sites: Sites, module: Any, value: Any) -> _Kept:
        """`value` as recorded now: an alias when the module is known to be left alone, else a
        copy (see the module docstring)."""
        ops = self._ops
        tensor = ops.is_tensor(value)
        if tensor:
            alias = ops.detach(value)
            aliases: tuple[Any, ...] = (alias,)
            versions: tuple[Any, ...] = (ops.version(alias),)
        else:
            found: list[Any] = []

            def watch(t: Any) -> Any:
                found.append(ops.detach(t))
                return found[-1]

            alias = ops.map_tensors(watch, value)
            aliases = tuple(found)
            versions = tuple(ops.version(a) for a in found)
        site = sites[module.training]
        mutated = site.flags.get(site.key)
        unversioned = None in versions  # e.g. torch inference tensors: copy, nothing to learn
        if mutated is False and not unversioned:
            return _Kept(alias, aliases, versions, site, False)
        copy = ops.clone(alias) if tensor else ops.map_tensors(ops.clone, alias)
        if mutated is not None or unversioned:
            return _Kept(copy, (), (), site, True)
        kept = _Kept(copy, aliases, versions, site, True)
        self._learning.append(kept)
        return kept

    def _settle(self) -> None:
        """Learn from the copies kept so far whether their modules' tensors got modified."""
        version = self._version
        for kept in self._learning:
            flags, key = kept.site.flags, kept.site.key
            if any(version(a) != v for a, v in zip(kept.aliases, kept.versions)):
                flags[key] = True
            else:
                flags.setdefault(key, False)
            kept.aliases = ()
        self._learning.clear()

    def _forward_hook(
        self, name: str, output_site: Sites | None, inputs_site: Sites | None
    ) -> Callable[..., None]:
        calls = self._outputs.setdefault(name, [])
        store_inputs = self._inputs
        keep = self._keep

        if inputs_site is None:
            assert output_site is not None

            def hook(module: Any, args: Any, output: Any) -> None:
                calls.append(keep(output_site, module, output))

        else:

            def hook(module: Any, args: Any, output: Any) -> None:
                if output_site is not None:
                    calls.append(keep(output_site, module, output))
                store_inputs[name] = keep(inputs_site, module, args)

        return hook

    def _next_forward(self, module: Any, args: Any) -> None:
        self._forwards += 1
        if self._learning:
            self._settle()

    def _reusing_hook(
        self, name: str, output_site: Sites, inputs_site: Sites | None
    ) -> Callable[..., None]:
        buffers = self._outputs.setdefault(name, [])
        filled = self._filled.setdefault(name, [0, 0])
        ops = self._ops
        is_tensor, copy_into, clone, map_tensors = (
            ops.is_tensor,
            ops.copy_into,
            ops.clone,
            ops.map_tensors,
        )
        store_inputs = self._inputs
        keep = self._keep

        def hook(module: Any, args: Any, output: Any) -> None:
            if filled[0] != self._forwards:
                filled[0], filled[1] = self._forwards, 0
            i = filled[1]
            filled[1] = i + 1
            # copies, refilled in place for a tensor: nothing to watch
            if i < len(buffers):
                kept = buffers[i]
                buffer = kept.value if is_tensor(kept.value) else None
            else:
                kept = _Kept(None, (), (), output_site[0], True)
                buffers.append(kept)
                buffer = None
            if is_tensor(output):
                kept.value = copy_into(buffer, output)
            else:
                kept.value = map_tensors(clone, output)
            if inputs_site is not None:
                store_inputs[name] = keep(inputs_site, module, args)

        return hook

    def _current(self, name: str) -> list[_Kept]:
        calls = self._outputs[name]
        filled = self._filled.get(name)
        return calls if filled is None else calls[: filled[1]]

    def _grad_hook(self, name: str, site: Sites) -> Callable[..., None]:
        grads = self._grads
        keep = self._keep

        def hook(module: Any, grad_output: Any) -> None:
            value = grad_output[0] if len(grad_output) == 1 else grad_output
            grads[name] = keep(site, module, value)

        return hook

    def __getitem__(self, name: str) -> Any:
        calls = self._current(name) if name in self._outputs else None
        if not calls:
            raise KeyError(self._missing(name))
        return _read(calls[-1], self._version)

    def __contains__(self, name: object) -> bool:
        return name in self._outputs and bool(self._current(name))  # type: ignore[arg-type]

    def calls(self, name: str) -> list[Any]:
        if name not in self._outputs:
            raise KeyError(self._missing(name))
        return [_read(kept, self._version) for kept in self._current(name)]

    def keys(self) -> list[str]:
        return [n for n in self.names if n in self]

    def _missing(self, name: str) -> str:
        if name in self._outputs:
            return f"module {name!r} was hooked but has not run"
        return f"no module {name!r} was captured; captured: {', '.join(map(repr, self.names[:8]))}"

    def remove(self) -> None:
        """Remove every hook this capture placed (idempotent)."""
        self._group.remove()
        if self._learning:
            self._settle()


def capture(
    model: Any,
    where: Where = None,
    *,
    inputs: bool = False,
    outputs: bool = True,
    grads: bool = False,
    reuse: bool = False,
) -> Capture:
    """Record the outputs (and optionally inputs and grad_outputs) of the modules of `model`
    that `where` selects: ``with unihook.capture(model) as cache: model(x)``. See `Capture`
    for ``reuse=True``."""
    # (not `Capture(...)`: CPython checks for a Ctrl-C when a type's call returns, which would
    # lose a capture whose hooks are placed; a Python method returns to its caller unchecked)
    cache = Capture.__new__(Capture)
    return cache._start(model, where, inputs=inputs, outputs=outputs, grads=grads, reuse=reuse)
