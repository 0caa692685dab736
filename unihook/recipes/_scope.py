"""What every recipe shares: it owns a HookGroup and is a context manager; it takes its targets
as modules, qualified names or lists of either; `every=N` hooks one forward in N."""

from __future__ import annotations

import copy as copy_module
import difflib
import functools
import gc
import inspect
import itertools
import sys
import threading
import types
import weakref
import zlib
from typing import Any, Callable, NamedTuple, Sequence, Union, cast

from unihook import (
    HookArgumentError,
    HookGroup,
    Where,
    backend_of,
    ops,
    register_forward_hook,
    register_forward_pre_hook,
)
from unihook.backend import collector_paused, eager_entry
from unihook.errors import UnihookError
from unihook.handles import Removable

from ._places import Places

__all__ = [
    "RankMismatchError",
    "Recipe",
    "Synced",
    "Targets",
    "check_every",
    "check_history",
    "resolve",
    "executing",
    "hook_caller",
    "tensors_of",
    "where_of",
]

#: A module of the model, its qualified name, or a list of either.
Targets = Union[str, Any, Sequence[Any]]

_EXPECTED = "a module of `model`, its qualified name, or a list of either"


class RankMismatchError(UnihookError, RuntimeError):
    """The ranks of a process group watch different modules: a recipe cannot merge their numbers
    (raised on every rank, as DistributedDataParallel raises for different parameters)."""


_created = itertools.count()  # the recipes' order of creation, which every rank shares
_generations = itertools.count()  # of the hooks `every`'s builders place (see `_Placed`)
# `every`'s counting hooks: torch calls them on its own, and they only count and place hooks
# (a compiler kept off them and what they call: `eager_entry`)
_counting_entry = functools.partial(eager_entry, callees_too=True)
# the merges queued in the running backward, with their recipe's number (see `merge_at_end`)
_queued: list[tuple[tuple[int, int], Callable[[], None]]] = []


def _run_queued() -> None:
    """The end of a backward: every merge queued in it, in the order their recipes were made
    and, for one recipe, of its forwards; each runs (its collective pairs with the other
    ranks'), then the first error raises."""
    if not _queued:
        return  # (another recipe's callback ran them)
    queued = sorted(_queued, key=lambda entry: entry[0])
    _queued.clear()
    failed: BaseException | None = None
    for _, merge in queued:
        try:
            merge()
        except Exception as error:  # (NonFiniteGradientError: raised the same on every rank)
            failed = failed or error
    if failed is not None:
        raise failed


def hook_caller(module: Any, frame: Any) -> Any:
    """The framework's frame running the call of `module` whose hook of unihook's was called
    from `frame`: below unihook's own wrappers (a keyword pre-hook's, the global hooks'), which
    return with the hook, the frame that lives as long as the module call (`ops.call_frame`)."""
    while frame is not None and frame.f_globals.get("__name__", "").startswith("unihook"):
        frame = frame.f_back
    return frame if frame is None else ops.call_frame(module, frame)


def executing(frame: Any) -> bool:
    """Whether `frame` (a framework's frame that called a forward's hook: `hook_caller`) still
    runs, on whichever thread: one a BaseException left (a KeyboardInterrupt, a task's
    CancelledError: no `always_call` hook runs then) has ended. Asked of the frame itself, no
    stack is walked (CPython 3.11 crashed, SIGSEGV, following ``f_back`` from the frames
    ``sys._current_frames()`` gave: helper-101's FINDING 6 test), and no code is compared (torch's
    ``_call_impl.<locals>.inner`` runs every hooked module call: its FINDING 2).
    CPython leaves a frame object untracked by the garbage collector while its thread runs it
    and tracks it once it has ended (3.10 to 3.13, measured; a generator's suspended frame is
    untracked from 3.11, hence taken for running). Until 2026-12-02 an ended frame was told by
    ``frame.clear()``, which emptied the locals of a traceback the user kept (helper-104's
    FINDING 3); the entries holding one now go when they are looked at, and with them what
    its locals held (the forward's inputs: helper-103's FINDING 1)."""
    return bool(frame.f_code.co_flags & _SUSPENDABLE) or not gc.is_tracked(frame)


_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def live_thread_ids() -> set[int]:
    """The ids of the threads running Python now, `threading`'s or not (one begun by
    ``_thread.start_new_thread`` or from C: helper-217's FINDING 4): the keys of
    ``sys._current_frames()``, read with the collector paused (CPython 3.11 hung where a
    collection inside it freed a `threading.local`); no frame is followed."""
    with collector_paused():
        return set(sys._current_frames())


class _Running(NamedTuple):
    """A forward of the model running on a thread (`every` > 1)."""

    caller: Any  # the framework's frame that called `_enter` (`executing`)
    handled: BaseException | None  # the exception handled there (`_count`)
    runs: bool  # the hooks placed run for it
    holds: bool  # it is a recorded one (or inside one): the hooks stay placed until it ends
    claimed: bool  # it took a recorded forward due (`_tickets`), given back if not counted


def _placed(build: Callable[[HookGroup], None]) -> HookGroup:
    """The hooks `build` places in a group; where it raises (a `where` that matches nothing),
    the ones it placed before go."""
    group = HookGroup()
    try:
        build(group)
    except BaseException:
        group.remove()
        raise
    return group


class Recipe(Removable):
    """Removes every hook it placed on `remove()` or when its `with` block exits."""

    _model: Any  # (set by the recipe: the model it watches)

    def __init__(self) -> None:
        self._created = next(_created)
        self._layout: list[str] | None = None  # `name:Type` of the modules all ranks watch
        # the names last merged (the list the hooks were placed with) and their layout
        self._watched: tuple[list[str] | None, list[str]] = (None, [])
        self._hooks = HookGroup()
        self._every = 1
        self._forwards = 0
        self._build: Callable[[HookGroup], None] | None = None
        self._active = HookGroup()
        self._places = Places()  # (`every` > 1: where its hooks go back to)
        # of the hooks that run (`_Placed`), and of those placed for the next forward, which
        # run from its start (`_enter`)
        self._generation = self._next_generation = next(_generations)
        self._placed_ahead = False  # see _replace
        # `every` > 1: the forwards of the model running, per thread (`_Running`)
        self._inside: dict[int, list[_Running]] = {}
        # the recorded forwards due and not yet begun: a forward beginning takes one (its
        # hooks then run for it, also while other threads' forwards run beside it: until
        # 2026-12-07 the hooks placed for one were those of every forward running meanwhile,
        # and those counted meanwhile placed them once, helper-215's FINDING 3)
        self._tickets = 0
        self._placed = False  # whether the builder's hooks are placed (`_begin` runs then)
        # `_enter`, `_count` and `remove` one thread at a time: two threads advancing at once
        # overwrote a placed group unremoved (hooks left after `remove()`, forwards counted
        # twice: helper-101's FINDING 6)
        self._counting = threading.RLock()

    def _schedule(self, model: Any, every: int, build: Callable[[HookGroup], None]) -> None:
        """Place the hooks `build` makes for forwards 0, N, 2N... of `model` (and their
        backward) only. Between them the recipe costs one hook call per forward of `model`:
        a counter that removes the hooks after a logged forward (a backward hook removed after
        the forward still fires in that forward's backward) and puts them back before the next.
        `build` is a method of the recipe's, its hooks wrapped by `_own`: a deep copy of the
        model copies the recipe, and the copy's builder places the copy's hooks on the copy.
        """
        self._every = every
        if every == 1:
            self._active = _placed(build)
            return
        self._tickets, self._placed = 1, True
        # (`_enter` before the pre-hooks placed: a forward's hooks are of the generation it
        # sets)
        self._hooks.add("", register_forward_pre_hook(model, self._enter, with_kwargs=True))
        try:
            self._active = self._places.place(
                self._hooked_modules, functools.partial(_placed, build)
            )
        except BaseException:  # (a `where` that matches nothing: no hook left)
            self._hooks.remove()
            raise
        self._build = build
        self._hooks.add("", register_forward_hook(model, self._count, always_call=True))

    def _hooked_modules(self) -> list[tuple[str, Any]]:
        """The modules `every`'s hooks may sit on, each under the name it keeps its place by
        (`Places`): the model's, by their qualified names."""
        return ops.named_modules(self._model)

    def _own(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        """`hook` (a method of the recipe's) as `every`'s builder places it (`_Placed`)."""
        return hook if self._every == 1 else _Placed(hook, self._next_generation)

    def _begin(self, module: Any, args: Any, kwargs: Any) -> None:
        """A forward of the model that the recipe's hooks run for begins: the model's first
        pre-hook of the recipe's (placed by the builder with `every` = 1, called by `_enter`
        with `every` > 1)."""

    @_counting_entry
    def _enter(self, module: Any, args: Any, kwargs: Any) -> None:
        """A forward of the model starts: running until `_count` ends it, per thread, as the
        frame that called this hook (a forward left by a BaseException, a KeyboardInterrupt,
        which runs no `always_call` hook, has ended: `executing`)."""
        caller, ident = hook_caller(module, sys._getframe(1)), threading.get_ident()
        handled = sys.exc_info()[1]  # (`_count`: a forward run inside an `except` block)
        counted = self._counted(module)
        with self._counting:
            # (the hooks placed since no forward holding them runs: `_replace`)
            self._generation = self._next_generation
            self._prune()
            running = self._inside.get(ident, [])
            if running:  # a forward inside this thread's: the hooks run for it as for that one
                entry = _Running(caller, handled, running[-1].runs, running[-1].holds, False)
            elif counted:
                claimed = self._tickets > 0
                self._tickets -= claimed
                entry = _Running(caller, handled, claimed, claimed, claimed)
            else:
                # not counted (under no_grad, a checkpoint's recomputation): the hooks placed
                # run for it, as for every forward, and tell it apart themselves; they stay
                # until it ends (its `always_call` hooks end what `_begin` began: until
                # 2026-12-07 they went when another thread's recorded forward ended, and its
                # entry kept its inputs, helper-220's FINDING 3)
                entry = _Running(caller, handled, True, self._placed, False)
            running.append(entry)
            self._inside[ident] = running
            begins = entry.runs and self._placed
        if begins:
            # (called here, not placed: the framework runs the model's pre-hooks from a copy of
            # their dict taken before this hook, and another thread may place or remove them
            # meanwhile: until 2026-12-07, under a lock held by a thread placing them, a
            # recorded forward missed it, and one the hooks were removed for ran it)
            self._begin(module, args, kwargs)

    def _prune(self) -> None:
        """The running forwards whose frame has ended go (`executing`: a BaseException left
        them, a KeyboardInterrupt, which runs no `always_call` hook; a dead thread's, also one
        `threading` does not list: helper-100's FINDING 7, helper-103's FINDING 1); the
        recorded forward each held is due again, as one that raised."""
        for ident, entries in list(self._inside.items()):
            alive = [e for e in entries if executing(e.caller)]
            if len(alive) == len(entries):
                continue
            self._tickets += sum(e.claimed for e in entries if not executing(e.caller))
            if alive:
                self._inside[ident] = alive
            else:
                self._inside.pop(ident, None)

    def _counted(self, module: Any) -> bool:
        """Whether the running forward of the model counts towards `every` (and is recorded)."""
        return True

    @_counting_entry
    def _count(self, module: Any, args: Any, output: Any) -> None:
        raised = output is None and ops.forward_raised(
            module, hook_caller(module, sys._getframe(1))
        )
        with self._counting:
            self._count_locked(module, output, raised)

    def _count_locked(self, module: Any, output: Any, raised: bool) -> None:
        ident = threading.get_ident()
        # (a forward a BaseException left inside this one, which caught it: its entry is not
        # this one's; until 2026-12-02 this one's stayed, helper-104's FINDING 2)
        self._prune()
        running = self._inside.get(ident)
        entry = running.pop() if running else None
        if running is not None and not running:
            self._inside.pop(ident, None)
        inside = bool(running)  # (this forward ran inside another of this thread's)
        claimed = entry is not None and entry.claimed
        handled = sys.exc_info()[1]
        if raised or (
            output is None
            and handled is not None
            and (entry is None or handled is not entry.handled)
        ):
            # the forward raised (torch's `_StopRecomputationError` ends a checkpoint's
            # recomputation so; `raised`: the frame calling this hook says so, where
            # torch.compile's code handles no exception, helper-107's FINDING 5): not a
            # forward; and the frameworks iterate the model's hook dict itself there, which
            # placing or removing hooks would change under them. (One returning None inside
            # an `except` block of its caller's is a forward: until 2026-12-02 it was not
            # counted, helper-101's FINDING 4.) The recorded forward it held is due again.
            self._tickets += claimed
            return
        if ops.tracing(module):
            # torch.jit.trace's runs (the trace, its check's second trace): not forwards of
            # the model, and both must see the same hooks (until 2026-12-03 the check saw
            # `every` take them away: "Graphs differed", helper-109's FINDING 6)
            self._tickets += claimed
            return
        if not self._counted(module):
            self._tickets += claimed
            return
        if inside:
            # counted, and so is the one around it as it ends, which decides as the count
            # then stands (until 2026-12-07 each made a recorded forward due: forwards run
            # inside others piled them up, helper-220's FINDING 1)
            self._forwards += 1
            return
        self._ended()

    def _ended(self) -> None:
        """A forward of the model counted towards `every` ended, none of this thread's around
        it: the next recorded one is due if N of them have ended since the last due."""
        self._forwards += 1
        due = self._forwards % self._every == 0
        self._tickets += due
        try:
            self._replace()
        except BaseException:
            # (a Ctrl-C placing them: this forward raises, and is not counted, as any forward
            # that raises; the next one places the hooks again. Until 2026-12-04 the count
            # went on, the next recorded forward had no hooks: helper-130's FINDING 3)
            self._forwards -= 1
            self._tickets -= due
            raise

    def _replace(self) -> None:
        """Place the builder's hooks anew for the recorded forwards due, or remove them where
        none is, once no forward holding them runs (one inside another, or on another
        thread: its later calls keep them; until 2026-12-02 they lost them, helper-97's
        FINDING 6)."""
        if any(e.holds for entries in self._inside.values() for e in entries):
            return
        # (where a copy's copies of them sit too: its own go back there)
        self._places.leave(self._hooked_modules)
        self._active.remove()  # the module's own hooks run from a snapshot: its call is done
        self._placed = False
        # (and, from the next forward on, a copy's copies of them: `_Placed`)
        self._next_generation = next(_generations)
        if self._tickets > 0 and self._build is not None:
            self._active = self._places.place(
                self._hooked_modules, functools.partial(_placed, self._build)
            )
            self._placed = True
            # placed for the next forward: this one's backward is not recorded (a reentrant
            # checkpoint recomputes parts of it there, through these hooks)
            self._placed_ahead = True

    def _runs_here(self) -> bool | None:
        """Whether the hooks placed run for the call of a hook on this thread (asked without
        the lock): as for this thread's innermost forward of the model, else for one running
        on another (a pool thread running a part of it: as for any of them); None where no
        forward runs. An entry a forward left by a BaseException (a KeyboardInterrupt: no
        `always_call` hook ran) does not count: until 2026-12-04 a submodule called on its
        own after one was recorded (helper-119)."""
        inside = self._inside
        if not inside:
            return None
        entries = inside.get(threading.get_ident())
        if entries and executing(entries[-1].caller):
            return entries[-1].runs
        live = [e.runs for entries in list(inside.values()) for e in entries if executing(e.caller)]
        return any(live) if live else None

    def _advance(self) -> bool:
        """Count a forward of the model run by the other ranks only (torch's Join) towards
        `every`: whether it was recorded."""
        if self._build is None:  # (every=1: the hooks stay)
            return True
        with self._counting:
            recorded = self._tickets > 0
            self._tickets -= recorded
            self._ended()
        return recorded

    def _merging(self, model: Any, sync: bool) -> tuple[int, int] | None:
        """``(rank, size)`` when this recipe merges the ranks' numbers for a forward of
        `model`: `sync`, an initialised process group, and more than one rank splitting the
        batch (a one-rank group is a single process: its errors come where one process's do)."""
        found = ops.world(model) if sync else None
        return found if found is not None and found[1] > 1 else None

    def _queue_merge(self, t: Any, merge: Callable[[], None], serial: int = 0) -> None:
        """Run `merge` (a collective) of this recipe's forward number `serial` at the end of
        the backward running `t`'s gradient hook, after the merges of recipes made before this
        one and of its earlier forwards: each rank's hooks fire in its own order (a branch
        taken on some ranks only, or first; autograd runs a later forward's graph first), and
        their collectives must pair."""
        _queued.append(((self._created, serial), merge))
        ops.after_backward(t, _run_queued)

    @staticmethod
    def _cancel_merge(merge: Callable[[], None]) -> None:
        """Forget `merge` if queued by a backward that never ended (it raised: the framework
        dropped its end-of-backward callbacks)."""
        _queued[:] = [entry for entry in _queued if entry[1] is not merge]

    def _writes(self, model: Any, all_ranks: bool) -> bool:
        """Whether this process writes a sink or a file: all of them with `all_ranks`, else
        rank 0 of the process group `model` runs over (`ops.world`), or the one process there
        is."""
        found = ops.world(model)
        return all_ranks or found is None or found[0] == 0

    def _gather(
        self, model: Any, vector: Any, names: list[str], length: Callable[[int], int]
    ) -> Any:
        """Every rank's `vector` (laid out per module of `names`: `length(len(names))`
        numbers), rows in rank order: one all_gather over the ranks that split `model`'s
        batch. Vectors of different lengths would make the ranks wait for each other, or gloo
        abort the process, so the ranks first agree on the modules: before the first merge one
        all_gather of a fixed size compares them (`_check_layout`); later, a rank whose
        modules changed sends a flagged vector of the agreed layout's length instead, and
        every rank then compares again (a change on every rank is taken, a change on some
        raises RankMismatchError on every rank)."""
        import numpy as np

        if names is not self._watched[0]:  # the hooks were placed anew (`every`): their types
            self._watched = (names, _layout(model, names))
        layout = self._watched[1]
        if self._layout is None:
            self._check_layout(model, layout)
        agreed = self._layout == layout
        if agreed:
            flagged = np.concatenate(([0.0], vector))
        else:  # (the length the others send)
            flagged = np.zeros(1 + length(len(self._layout or ())))
            flagged[0] = 1.0
        rows = ops.all_gather(flagged, like=model)
        if rows[:, 0].any():
            self._check_layout(model, layout)  # raises unless every rank changed the same way
            rows = ops.all_gather(np.concatenate(([0.0], vector)), like=model)
        return rows[:, 1:]

    def _check_layout(self, model: Any, layout: list[str]) -> None:
        """One all_gather of a fixed size: the same RankMismatchError on every rank unless
        every rank watches the same modules (`_layout`: names and types)."""
        import numpy as np

        digest = zlib.crc32("\0".join(layout).encode())  # exact in a float64
        ranks = ops.all_gather(np.array([len(layout), digest], np.float64), like=model)
        if (ranks != ranks[0]).any():
            found = ", ".join(
                f"rank {rank}: {int(count)} (digest {int(d):08x})"
                for rank, (count, d) in enumerate(ranks)
            )
            shown = ", ".join(repr(entry) for entry in layout[:8])
            raise RankMismatchError(
                f"unihook ({backend_of(model)}): {type(self).__name__} watches different "
                f"modules (names or types) on the ranks that split the batch, so their "
                f"numbers cannot be merged; modules per rank: {found}. Every rank must "
                f"build the same module tree, as data-parallel training asks, or pass "
                f"sync=False. This rank watches {len(layout)}: "
                f"{shown}{', ...' if len(layout) > 8 else ''}."
            )
        self._layout = list(layout)

    def _out_of_step(self, model: Any, merging: list[str]) -> None:
        """The ranks' collectives paired merges about different things (`merging`, per rank):
        the same RankMismatchError on every rank, before their numbers mix."""
        found = "; ".join(f"rank {rank}: {what}" for rank, what in enumerate(merging))
        raise RankMismatchError(
            f"unihook ({backend_of(model)}): {type(self).__name__} cannot merge the ranks' "
            f"numbers: their collectives paired different merges ({found}). Every rank must "
            f"run the same recorded forwards, in the same mode (train or eval), and the same "
            f"backwards, as data-parallel training asks; evaluate under no_grad (not recorded "
            f"by synced recipes), or pass sync=False."
        )

    def remove(self) -> None:
        with self._counting:  # (not while another thread places the next forward's hooks)
            self._build = None
            self._hooks.remove()
            self._active.remove()
            self._placed = False
            # (and a copy's copies of them: `_Placed`)
            self._generation = self._next_generation = next(_generations)
            self._let_go()

    def _let_go(self) -> None:
        """Drop what a forward under way holds (the frames of the running ones, and so their
        inputs): a forward a KeyboardInterrupt left, then `remove()` (a ``with`` block the
        Ctrl-C left), kept its batch while the user kept the recipe to read its history
        (helper-104's FINDING 6). A copy made for a copy of the model starts from here too."""
        self._inside = {}

    def __getstate__(self) -> dict[str, Any]:
        """A deep copy of the model copies its hooks, and so the recipes they call, as torch
        copies its own (until 2026-12-02 ``TypeError: cannot pickle '_thread.RLock'``:
        helper-104's FINDING 8, ``AveragedModel`` and every EMA copy): the copy gets a lock of
        its own and no forward under way (frames do not copy). Its model a wrapper that a
        copy rebuilds (`_rebuilt`), the copy is removed."""
        return self._state(rebuilt=True)

    def _state(self, rebuilt: bool) -> dict[str, Any]:
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        del copy.__dict__["_counting"]
        # (the recorded forward a running one took, or one a Ctrl-C left, is the copy's next:
        # its hooks are copied with the model; helper-220's FINDING 2)
        copy._tickets += sum(e.claimed for entries in list(self._inside.values()) for e in entries)
        copy._let_go()
        # ... and no handle: torch's handles name the original's hook dicts (weakly: a copy's
        # removed the original's hooks). The copy's recipe keeps the hooks the copy has (its
        # own numbers; the original's stay its own): with `every` > 1 the builder, a method,
        # becomes the copy's (its model the copy), and the hooks it placed, copied with the
        # model, run for the copy's next forward only (`_Placed`). (Until 2026-12-03 the
        # builder placed the copy's hooks on the original, for the original recipe, which
        # then recorded forwards it skips; until 2026-12-04 the copy had none, and recorded
        # no forward, or every one: helper-107's FINDING 1, AveragedModel.)
        copy._hooks, copy._active, copy._places = HookGroup(), HookGroup(), self._places.copy()
        where, names = copy.__dict__.get("_where"), copy.__dict__.get("_names")
        if callable(where) and names:
            # a predicate may pick the original's modules (`module is model[0]`), which a deep
            # copy keeps as they are: the copy's builder takes the names it picked (helper-115)
            copy.__dict__["_where"] = [_escape(name) for name in names]
        copy._copied()
        if rebuilt and _rebuilt(copy.__dict__.get("_model"), copy.__dict__.get("_inner")):
            _inert(copy.__dict__)
        return copy.__dict__

    def __copy__(self) -> Any:
        """A shallow copy (`copy.copy`): the state `__getstate__` gives, the model shared;
        one of a recipe on a compiled model too, which no copy of the wrapper rebuilds
        (helper-122's FINDING 5)."""
        copy = object.__new__(type(self))
        copy.__setstate__(self._state(rebuilt=False))
        return copy

    def _copied(self) -> None:
        """This object is a copy's state being made (`__getstate__`): replace (never change:
        the dict's values are the original's) what is of the original's forwards, which the
        copy never ran, and what does not pickle (weak references to the original's tensors;
        until 2026-12-04 pickling a model carrying a recipe, ``torch.save(model)``, raised:
        helper-115's FINDING 4)."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._counting = threading.RLock()
        if getattr(self._build, "__self__", self) is not self:
            # a shallow copy (`copy.copy`): the builder is the original's, for its model
            self._build = None

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """A deep copy of the model copies its recipes (`__getstate__`). One of a part of it
        only (``copy.deepcopy(model.head)``, ``copy.deepcopy(ddp.module)``), or of the recipe
        alone, copied the whole model with the recipe (helper-115's FINDING 5): the copy is
        then the recipe's numbers so far, removed, holding no module; the hooks the part
        carries call it and do nothing. Told by what the deep copy was asked to copy (its
        outermost call's argument): where that is anything else (a dict or an object holding
        the recipe and the model, in whatever order), the model is copied with the recipe,
        the one copy of it the rest of the deep copy refers to (helper-116's FINDING 2). (A
        pickle has no such view: a pickled submodule carries the model.)"""
        model = self.__dict__.get("_model")
        copy = object.__new__(type(self))
        memo[id(self)] = copy
        state = self.__getstate__()
        if model is not None and id(model) not in memo and self._part(_deepcopy_root(memo)):
            _inert(state)
        copy.__setstate__(copy_module.deepcopy(state, memo))
        return copy

    def _part(self, root: Any) -> bool:
        """Whether `root` is this recipe, or a module of its model other than the model from
        which a deep copy does not reach the model but through this recipe (a submodule
        holding its parent reaches it: the model is copied anyway, helper-117's FINDING 3)."""
        if root is self:
            return True
        model = self.__dict__.get("_model")
        inner = self.__dict__.get("_inner", model)
        if root is None or root is model:
            return False
        if not any(module is root for _, module in ops.named_modules(inner)):
            return False
        return not _reaches(root, {id(model), id(inner)}, avoid=id(self))


# what a deep copy keeps as it is (atomic): the objects it refers to are not copied through it;
# scalars and strings refer to none (a vocabulary's 250k entries are not walked one by one into
# the budget: helper-118's FINDING 1)
_ATOMIC = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.CodeType,
    types.FrameType,
    weakref.ref,
    int,
    float,
    complex,
    str,
    bytes,
    type(None),
)


def _reaches(root: Any, targets: set[int], avoid: int, budget: int = 200_000) -> bool:
    """Whether one of `targets` (ids) is among the objects `root` refers to, directly or not,
    as a deep copy follows them (not through atomic ones, nor through the object `avoid`).
    Past `budget` objects: assumed so (the model is then copied, as a deep copy of anything
    else holding the recipe copies it)."""
    seen, todo = {id(root), avoid}, [root]
    while todo:
        for found in gc.get_referents(todo.pop()):
            key = id(found)
            if key in targets:
                return True
            if key in seen or isinstance(found, _ATOMIC):
                continue
            seen.add(key)
            if len(seen) > budget:
                return True
            todo.append(found)
    return False


def _inert(state: dict[str, Any]) -> None:
    """A copy's `state` made that of a removed recipe holding no module (its numbers kept)."""
    state.update(_model=None, _inner=None, _where=None, _build=None, _removed=True, _placed=False)
    state["_generation"] = state["_next_generation"] = next(_generations)


def _rebuilt(model: Any, inner: Any) -> bool:
    """Whether `model` is a wrapper of `inner` that a copy (deep copy or pickle) rebuilds
    around a copy of `inner` made first, by its class's own ``__reduce__`` (torch.compile's
    ``OptimizedModule``; DataParallel, DDP, a plain Module copy their state after them). The
    new wrapper has none of the old one's hooks, where the recipe starts each forward, and a
    copy of the recipe, reached through `inner`'s hooks, copied the wrapper again around the
    half-made copy of `inner`: AttributeError (a pickle: at the load). Until 2026-12-04 it
    raised so; the copy carries no recipe now, as when the recipe's hooks are all on the
    wrapper (``every`` > 1, between forwards)."""
    if model is None or inner is None or inner is model:
        return False
    cls = type(model)
    return cls.__reduce__ is not object.__reduce__ or cls.__reduce_ex__ is not object.__reduce_ex__


def _deepcopy_root(memo: dict[int, Any]) -> Any:
    """What the deep copy using `memo` was asked to copy (the argument of its outermost
    ``copy.deepcopy`` call), or None."""
    root, frame = None, sys._getframe(1)
    code = copy_module.deepcopy.__code__
    while frame is not None:
        if frame.f_code is code and frame.f_locals.get("memo") is memo:
            root = frame.f_locals.get("x")
        frame = frame.f_back
    return root


class _Placed:
    """A hook of a recipe's that `every`'s builder placed, for the forward it was placed for:
    it runs while the recipe's hooks are of its generation (set as each forward of the model
    starts, `_enter`). A deep copy of the model copies it for the recipe's copy, which has no
    handle to remove it: it runs in the copy's next forward, the one it was placed for, and
    from the one after on (`_replace`: a new generation) does nothing, the copy's builder
    placing the copy's own."""

    __slots__ = ("__wrapped__", "generation")

    __wrapped__: Any

    def __init__(self, hook: Callable[..., Any], generation: int) -> None:
        self.__wrapped__ = hook  # (`attach` reads its signature through this)
        self.generation = generation

    @property
    def __self__(self) -> Any:
        return getattr(self.__wrapped__, "__self__", None)

    @eager_entry
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hook = self.__wrapped__
        recipe = hook.__self__
        if self.generation != recipe._generation:
            return None
        runs = recipe._runs_here()
        if not runs:
            if runs is not None or not args or args[0] is not recipe._model:
                # a module called on its own, no forward of the model running: the original's
                # hooks of the last forward are gone (`_replace`), a copy's stay and do nothing
                # (they recorded it: helper-117's FINDING 2). (The model's own hooks after
                # `_count` in its call run: that call's. `_model` is read only then: under
                # torch.compile, dynamo tracing a compiled wrapper's hook took its read of the
                # wrapper for a second variable of the module it traces: AssertionError.)
                return None
        return hook(*args, **kwargs)


class Synced(Recipe):
    """A recipe that merges the ranks' numbers (`sync`): also a joinable of torch's ``Join``
    (uneven inputs), listed before the model: ``Join([stats, monitor, ddp_model])``. Once a
    rank ran out of inputs, it runs the recipes' merges of each iteration the others still
    run, with nothing of its own in them (`_shadowing`, `_shadow_forward`,
    `_shadow_backward`)."""

    _model: Any
    sync: bool

    def __init__(self) -> None:
        super().__init__()
        self._removed = False
        self._unwatch_joins: Callable[[], None] = _no_join
        self._joined: _Joined | None = None  # the recipes of the last Join this one is in
        # the pre-hook that tells a Join of each forward (`_notify`): kept past `remove()` until
        # the Join it is first in ends (the Join asks its first joinable for it each iteration)
        self._notifier: Removable | None = None
        # set by torch's Join (`Joinable`'s attribute, which its `notify_join_context` reads)
        self._join_config: Any = None

    def join_hook(self, **kwargs: Any) -> Any:
        """torch's ``Joinable.join_hook``: called by ``Join([...])`` on every rank."""
        joined = self._joined = _Joined.of(self)
        other = next((r for r in joined.recipes if r._every != self._every), None)
        if other is not None:
            _Joined.refuse(ops.join_being_built(self._model))
            raise _every_differs(self, other)
        if self._notifier is None:
            self._notifier = register_forward_pre_hook(self._model, self._notify, prepend=True)
        return ops.join_hook(self._model, functools.partial(joined.main, self), joined.end)

    def _watch_joins(self) -> None:
        """From the recipe's construction: each torch ``Join`` the model (the wrapper) is
        passed to must have this recipe before it, while it merges (`_in_join`)."""
        check = functools.partial(_in_join, weakref.ref(self))
        self._unwatch_joins = ops.on_join(self._model, check)

    def _check_in_join(self) -> None:
        join = ops.join_being_built(self._model)
        forming = _Joined.forming(join)
        old = self._joined
        if old is not None and old is not forming and not old.done:
            # a Join of the model is being built: the last one ended (left by an exception,
            # which runs no post-hook): its first recipe, removed inside it, lets go of the
            # notifier it kept, which would tell the new Join of each forward a second time
            old.done = True
            if self._removed:
                self._let_go_of_notifier()
        if self._removed or self._merging(self._model, self.sync) is None:
            return
        if forming is not None and self in forming.recipes:
            return
        _Joined.refuse(join)
        # (a recipe left out, or listed after the model: the rank that ran out would run the
        # merges of the recipes listed before the model only, while the others wait in its)
        raise HookArgumentError(
            f"unihook ({backend_of(self._model)}): {type(self).__name__} merges the ranks' "
            f"numbers of this {type(self._model).__name__}, so it must be in the list given "
            f"to torch's Join, before the model, in every Join of that model: "
            f"Join([stats, monitor, ddp_model]) (a rank that ran out of inputs runs the "
            f"merges of the recipes listed there). Received: a Join without it before the "
            f"model. Build it with sync=False, or remove() it, to keep it out."
        )

    @property
    def join_device(self) -> Any:
        return ops.join_context(self._model)[0]

    @property
    def join_process_group(self) -> Any:
        # (torch reads it once every joinable gave its hook: the Join is built)
        if self._joined is not None:
            self._joined.built = True
        return ops.join_context(self._model)[1]

    def _notify(self, module: Any, args: Any) -> None:
        # The first recipe of a Join notifies it (torch asks the first joinable to, at the
        # start of each forward): the model after the recipes in the list does not.
        joined = self._joined
        if joined is not None and joined.left():
            # the Join was left by an exception (no post-hook ran) and freed: it ended
            joined.done = True
            if self._removed:
                self._let_go_of_notifier()
        if (
            joined is not None
            and joined.built
            and not joined.done
            and joined.recipes[0] is self
            and not ops.in_backward(module)
        ):
            ops.notify_join(module, self)

    def _shadowing(self) -> bool:
        """A rank that ran out of inputs, an iteration of the others: whether this recipe
        merges in it (counting the forward towards `every`, as the others' hooks do)."""
        return False

    def _shadow_forward(self) -> None:
        """Where `_shadowing`: this rank's part in the merges at the end of the others'
        forward, with nothing of its own (in `_Joined`'s thread)."""

    def _shadow_backward(self) -> None:
        """As `_shadow_forward`, at the end of that forward's backward."""

    def remove(self) -> None:
        self._removed = True
        super().remove()
        joined = self._joined
        if joined is None or not joined.built or joined.done or joined.recipes[0] is not self:
            self._let_go_of_notifier()
        if self._notifier is None:
            self._unwatch_joins()

    def _copied(self) -> None:
        super()._copied()
        # (a copy is in no Join: `on_join` is a wrapper's, which a copy of the model is not)
        self._unwatch_joins, self._joined, self._notifier = _no_join, None, None
        self._join_config = None

    def _let_go_of_notifier(self) -> None:
        notifier, self._notifier = self._notifier, None
        if notifier is not None:
            notifier.remove()
        if self._removed:  # (kept watching while it kept the notifier: `_check_in_join`)
            self._unwatch_joins()


def _no_join() -> None:
    return None


def _every_differs(recipe: Synced, other: Synced) -> HookArgumentError:
    # `every` places a recipe's hooks anew after the others': the ranks that have inputs
    # would then run the forwards' merges in another order than the one that ran out (another
    # recipe's numbers read as this one's, or a gloo abort)
    return HookArgumentError(
        f"unihook ({backend_of(recipe._model)}): the recipes in one torch Join must log the "
        f"same forwards: every={other._every} ({type(other).__name__}) and "
        f"every={recipe._every} ({type(recipe).__name__}). Give them the same `every`."
    )


def _in_join(recipe: weakref.ref[Synced]) -> None:
    """`Synced._check_in_join` of `recipe` while it lives (the wrapper holds this, not it)."""
    found = recipe()
    if found is not None:
        found._check_in_join()


class _Joined:
    """The recipes of one torch ``Join``, in its list's order. On a rank that ran out of
    inputs, the first one's hook starts, per iteration the others run, a thread running every
    recipe's shadows in the order the others' merges run (the ends of the forward in the order
    the recipes were made, as their forward hooks run; then those of the backward, as
    `_run_queued`), and returns: the next joinable's hook, DDP's, runs the broadcasts of the
    forward (buffers, its buckets' first rebuild) and the all-reduces of the backward, each
    waiting for its partner, between which the others run the recipes' merges. So the
    recipes' collectives run on a group of their own (`ops.join_hook`), and the first recipe
    must come before DDP in the list: its hook waits for the last iteration's thread first.
    The others' hooks do nothing."""

    _forming: weakref.ref[_Joined] | None = None  # the Join under construction

    def __init__(self, join: Any) -> None:
        self.recipes: list[Synced] = []
        # the framework's Join object (`ops.join_being_built`), while it lives
        self._join = weakref.ref(join) if join is not None else None
        # each recipe's `_join_config` when it joined: Join sets them all once every joinable
        # gave its hook, so one that changed means that this Join is built (where the Join
        # object is not known)
        self.configs: list[Any] = []
        self._running: threading.Thread | None = None
        self._failed: BaseException | None = None
        self.built = False  # the Join's construction went through (`join_process_group`)
        self.done = False  # the Join ended (`end`): its first recipe tells it nothing more

    @classmethod
    def of(cls, recipe: Synced) -> _Joined:
        """The Join `recipe.join_hook` is called for: the one the last call was for, unless
        that was another Join's (one whose construction failed) or has `recipe` already."""
        join = ops.join_being_built(recipe._model)
        joined = cls.forming(join)
        if joined is None or recipe in joined.recipes:
            joined = cls(join)
            cls._forming = weakref.ref(joined)
        joined.recipes.append(recipe)
        joined.configs.append(recipe._join_config)
        return joined

    @classmethod
    def forming(cls, join: Any) -> _Joined | None:
        """The recipes of `join` (`ops.join_being_built`), whose construction is running, or
        None: not built, and the recipes of that Join (where the Join is not known, of one
        whose recipes' configs were not set yet)."""
        joined = cls._forming() if cls._forming is not None else None
        if joined is None or joined.built:
            return None
        if join is not None:
            return joined if joined._join is not None and joined._join() is join else None
        changed = any(r._join_config is not c for r, c in zip(joined.recipes, joined.configs))
        return None if changed else joined

    @classmethod
    def refuse(cls, join: Any) -> None:
        """The Join under construction is refused: its recipes let go of the notifiers they
        placed for it, and the next Join starts afresh."""
        joined = cls.forming(join)
        cls._forming = None
        if joined is None:
            return
        joined.done = True
        for recipe in joined.recipes:
            if recipe._joined is joined:
                recipe._let_go_of_notifier()

    def left(self) -> bool:
        """Whether the Join object is known and gone: a `with Join(...)` block (no name kept)
        ended, by an exception too (which runs no post-hook, so no `end`)."""
        return self._join is not None and self._join() is None and not self.done

    def main(self, recipe: Synced) -> None:
        if recipe is not self.recipes[0]:
            return
        self.wait()
        ordered = sorted(self.recipes, key=lambda r: r._created)
        shadowed = [each for each in ordered if each._shadowing()]  # (hooks placed here)
        if shadowed:
            self._running = threading.Thread(
                target=self._shadow, args=(shadowed,), name="unihook-join", daemon=True
            )
            self._running.start()

    def _shadow(self, recipes: list[Synced]) -> None:
        failed: BaseException | None = None
        try:
            for each in recipes:  # (an error here is raised on every rank: theirs stop too)
                each._shadow_forward()
            for each in recipes:  # each runs, then the first error raises (`_run_queued`)
                try:
                    each._shadow_backward()
                except Exception as error:
                    failed = failed or error
        except Exception as error:
            failed = error
        self._failed = failed

    def wait(self) -> None:
        """The last iteration's shadows done (the next iteration's hook, or once every rank
        ran out): the first error they raised raises here."""
        running, self._running = self._running, None
        if running is not None:
            running.join()
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    def end(self) -> None:
        """The Join's end (its post-hook, on every rank): the last shadows, then the first
        recipe, removed inside it, lets go of its notifier."""
        try:
            self.wait()
        finally:
            self.done = True
            for recipe in self.recipes:
                if recipe._removed:
                    recipe._let_go_of_notifier()


_TENSOR_TYPES: set[type] = set()  # the types `tensors_of` has seen returned as a bare tensor


def _layout(model: Any, names: list[str]) -> list[str]:
    """`name:Type` of each watched module: DDP compares only the parameters, so a parameterless
    module may differ across ranks (a ReLU here, a Tanh there)."""
    types = {name: type(m).__name__ for name, m in ops.named_modules(ops.unwrap(model))}
    return [f"{name}:{types.get(name, '')}" for name in names]


def tensors_of(output: Any, module: Any) -> Sequence[Any]:
    """The tensors in a module's `output`, as `ops.tensors_in`; a bare tensor of a type seen
    before without the framework's tree walk (a few microseconds per module call)."""
    if type(output) in _TENSOR_TYPES:
        return (output,)
    found = ops.tensors_in(output, like=module)
    if len(found) == 1 and found[0] is output:
        _TENSOR_TYPES.add(type(output))
    return found


def check_every(every: int) -> int:
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise HookArgumentError(f"`every` must be a positive int. Received: every={every!r}")
    return every


def check_history(max_history: int | None) -> None:
    if max_history is not None and (
        isinstance(max_history, bool) or not isinstance(max_history, int) or max_history < 1
    ):
        raise HookArgumentError(
            f"`max_history` must be a positive int or None. Received: {max_history!r}"
        )


def _describe(value: Any) -> str:
    if isinstance(value, (str, int, float, type(None))):
        return repr(value)
    return type(value).__name__


def _bad(what: str, value: Any, why: str = "") -> HookArgumentError:
    return HookArgumentError(f"`{what}` must be {_EXPECTED}. Received: {_describe(value)}{why}.")


def resolve(model: Any, targets: Targets, what: str) -> list[tuple[str, Any]]:
    """(qualified name, module) for each of `targets`: a module of `model`, an exact qualified
    name, or a list of either (a shared module gets its first name, as named_modules)."""
    modules = ops.named_modules(model)
    by_name = dict(modules)
    by_id = _ids(modules)
    items = list(targets) if isinstance(targets, (list, tuple)) else [targets]
    if not items:
        raise _bad(what, targets, " (an empty list)")
    found = []
    for item in items:
        if isinstance(item, str):
            if item not in by_name:
                near = difflib.get_close_matches(item, list(by_name), n=5, cutoff=0.4)
                hint = f"; nearest names: {', '.join(map(repr, near or list(by_name)[:5]))}"
                raise _bad(what, item, f", which matches no module{hint}")
            found.append((item, by_name[item]))
        elif (name := _named(by_id, item)) is not None:
            found.append((name, by_name[name]))
        else:
            raise _bad(what, item, " (not a submodule of the model)" if _owned(item) else "")
    return found


def _ids(modules: list[tuple[str, Any]]) -> dict[int, str]:
    """Each module's first name by id, and the part inside a part's wrapper (which
    `ops.named_modules` lists for it: an FSDP1 unit, ``checkpoint_wrapper``) the wrapper's."""
    found: dict[int, str] = {}
    for name, module in modules:
        found.setdefault(id(module), name)
        found.setdefault(id(ops.part(module)), name)
    return found


def _named(names: dict[int, str], module: Any) -> str | None:
    """The name `names` (`_ids`) gives `module`, or the module inside it (a data-parallel
    wrapper, or ``torch.compile``'s, given for a module listed unwrapped)."""
    if id(module) in names:
        return names[id(module)]
    return names.get(id(ops.unwrap(module))) if _owned(module) else None


def _owned(obj: Any) -> bool:
    try:
        backend_of(obj)
    except TypeError:
        return False
    return True


def where_of(model: Any, where: Any) -> Where:
    """`where` as `attach` takes it: None, a glob or a list of globs, ``callable(name, module)
    -> bool``, or modules of `model` (alone or in a list, with names or globs), which become
    their qualified names. A module is callable: it is told from a predicate by identity."""
    if where is None or isinstance(where, str):
        return where
    items = list(where) if isinstance(where, (list, tuple)) else [where]
    if all(isinstance(item, str) for item in items) and items:
        return items
    modules = _ids(ops.named_modules(model))
    if id(where) not in modules and callable(where) and not _owned(where):
        return cast(Callable[[str, Any], bool], where)  # a predicate
    names = []
    for item in items:
        if isinstance(item, str):
            names.append(item)
        elif (name := _named(modules, item)) is not None:
            names.append(_escape(name))
        else:
            why = " (not a submodule of the model)" if _owned(item) else ""
            raise HookArgumentError(
                f"`where` must be None, a glob, a list of globs, callable(name, module) -> "
                f"bool, or {_EXPECTED}. Received: {_describe(item)}{why}."
            )
    return names


class Chosen:
    """A recipe's `where` once its first placement chose the modules: those modules under the
    names they had then (in a copy, which has other modules, their qualified names). `every`
    > 1 places the hooks anew for each recorded forward, where `every=1`'s hooks, placed once,
    stay: on those modules, filed under those names, wherever they went since (a module
    renamed, moved, swapped with another, or taken out and put back); a module added to the
    model since is not hooked (until 2026-12-04 a later placement hooked an added module, and
    a module missing at one placement was lost for good: helper-128's FINDING 5, helper-135's
    FINDING 3; until 2026-12-05 a module was filed under the name it had at each placement:
    two swapped modules' rows were exchanged, helper-135's FINDING 1)."""

    def __init__(self, chosen: Sequence[tuple[str, Any]]) -> None:
        self.names = frozenset(name for name, _ in chosen)
        # id -> (the module, weakly; its first name): by identity, not equality (two modules
        # comparing equal are two modules: until 2026-12-05 a WeakKeyDictionary took them for
        # one, and the second was not hooked, helper-139's FINDING 4)
        self._modules: dict[int, tuple[weakref.ref[Any], str]] | None = {}
        try:
            for name, module in chosen:
                self._modules.setdefault(id(module), (weakref.ref(module), name))
        except TypeError:  # (a module that takes no weak reference: by name)
            self._modules = None

    def pairs(self, model: Any) -> Sequence[tuple[str, Any]] | Callable[[str, Any], bool]:
        """`where` for `attach` on `model`: the chosen modules, by the names they were chosen
        under (in `model`'s order, then those it no longer holds), or by name in a copy."""
        if self._modules is None:
            return lambda name, module: name in self.names
        return self._found(ops.named_modules(model))[0]

    def slots(self, walked: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """`walked` (a model's modules by qualified name) for `Places`: the chosen modules by
        their first names, also those the model no longer holds, so a module moved keeps its
        place among its hooks (until 2026-12-05 its place was noted under its name then, and
        not found under the new one: helper-139's FINDING 3); the others by their names."""
        if self._modules is None:
            return list(walked)
        found, seen = self._found(walked)
        taken = {name for name, _ in found}
        return found + [(n, m) for n, m in walked if id(m) not in seen and n not in taken]

    def _found(self, walked: Sequence[tuple[str, Any]]) -> tuple[list[tuple[str, Any]], set[int]]:
        """The chosen modules under their first names (those in `walked` in its order, then
        the rest alive), and the ids of the walked ones."""
        chosen, found = self._modules or {}, []
        seen: set[int] = set()
        for _, module in walked:
            # (a part's wrapper, torch.compile of a submodule since, stands for the part;
            # asked only of a module not chosen itself: a backend's call per module)
            first, inner = _first_name(chosen, module), module
            if first is None:
                inner = ops.part(module)
                first = None if inner is module else _first_name(chosen, inner)
            if first is not None and id(inner) not in seen:
                seen.update((id(inner), id(module)))
                found.append((first, module))
        for key, (ref, name) in list(chosen.items()):
            module = ref()
            if module is None:
                del chosen[key]  # (gone: its id may be another module's next)
            elif key not in seen:
                found.append((name, module))
        return found, seen

    def __getstate__(self) -> dict[str, Any]:
        # a copy (deepcopy, pickle) has other modules: it chooses by name
        return {"names": self.names, "_modules": None}

    def __repr__(self) -> str:
        return f"Chosen({sorted(self.names)!r})"


def _first_name(chosen: dict[int, tuple[weakref.ref[Any], str]], module: Any) -> str | None:
    """The name `module` was chosen under, if it was (its id held by it, not a dead one's)."""
    found = chosen.get(id(module))
    return found[1] if found is not None and found[0]() is module else None


def _escape(name: str) -> str:
    """`name` as a glob matching only itself."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)
