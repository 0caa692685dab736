"""Paddle's backward entry points, made safe for Python hooks.

While any unihook gradient hook is alive, ``core.eager.run_backward`` and
``run_partial_grad`` (what ``Tensor.backward``, ``paddle.autograd.backward`` and ``paddle.grad``
call) are wrapped so that:

- an exception raised in a hook comes out with its own type: paddle's C++ turns it into
  ``OSError "(External) ..."``, so the hook wrapper stashes the original and we re-raise it;
- a hook removed while backward runs is removed when backward returns: removing a tensor hook
  during backward segfaults paddle 3.3.1, also from another thread while one backward runs, so
  paddle's removal waits until no backward runs in any thread (`after_all_backwards`);
- hooks know whether the backward builds a graph (``paddle.grad(create_graph=True)``);
- ``paddle.grad`` runs the hooks of its input tensors: paddle 3.3.1 skips leaf-tensor hooks
  there (torch runs them on the captured gradient and returns their result). Hooks record that
  they fired (``fired``); after the call, the hooks of each input (``track``) that did not
  fire are applied, in registration order, to the gradient returned for it;
- module backward hooks' PyLayer nodes know whether Tensor.backward or paddle.grad runs them,
  and a paddle.grad that would reach a node Tensor.backward already ran raises
  BackendStateError instead of segfaulting (trap 7, see the end of this file);
- those nodes learn which of their input slots a paddle.grad cuts (``pruned``);
- ``paddle.grad`` has the graph alone (no other backward on another thread): paddle 3.3.1
  crashes otherwise;
- those nodes learn whether a gradient a hook saw can go on as it is, or must go on as a copy
  (``passes_on``, see the end of this file);
- a hook registered on the output of such a node that hands its output out as it is gets that
  node's say first (``redirect``): paddle ignores what a hook on a PyLayer output returns.

The wrappers go away when the last hook does (a weak reference to each hook function), restoring
paddle's functions exactly.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import sys
import threading
import weakref
from collections import deque
from typing import Any, Callable, Container, Iterable, Iterator, NamedTuple, Sequence

from paddle.base import core

__all__ = [
    "hold",
    "sweep",
    "stash",
    "after_firing",
    "after_all_backwards",
    "at_backward_end",
    "building_graph",
    "installed",
    "unguarded_backward",
    "track",
    "untrack",
    "fired",
    "graph_freed",
    "identity_nodes_reached",
    "in_tensor_backward",
    "node_ptr",
    "spend",
    "several_slots",
    "pruned",
    "unneeded",
    "obliged",
    "passes_on",
    "receives_seen",
    "register_unseen",
    "replace",
    "replacement",
    "Trust",
]


class _State(threading.local):
    depth = 0
    create_graph = False
    pending: BaseException | None = None
    # `pending` was re-raised by a backward run inside a node of this one (a reentrant
    # recompute's), which paddle wraps in that node's OSError: a later hook's error replaces it
    passed = False
    partial = False  # the innermost running entry point is run_partial_grad (paddle.grad)
    retained = True  # it was asked to keep the graph (retain_graph)
    # tokens of the hooks that fired during the innermost running backward (None: none runs)
    fired_tokens: set[int] | None = None
    # the input slots the innermost running paddle.grad cuts, by node_ptr (see `pruned`)
    cuts: dict[int, frozenset[int]] = {}
    # actions for the end of the innermost running backward (None: none runs under the guard)
    ends: list[Callable[[], object]] | None = None
    # the innermost running backward's roots, and its graph once a node asked (`passes_on`)
    roots: Any = None
    graph: _Graph | None = None
    # the innermost running paddle.grad's inputs (None: Tensor.backward), and the nodes from
    # which one is reached once a node asked (`unneeded`)
    inputs: Any = None
    needed: set[int] | None = None
    # the identity nodes an earlier one passed a gradient to without a copy (`passes_on`)
    obliged: set[int] | None = None
    asked = 0  # values `passes_on` was asked about in the innermost running backward
    # id of an identity node's object -> the gradient the hooks on its output left in the
    # innermost running backward (`replace`); dropped with that backward, run or raised
    replaced: dict[int, Any] | None = None
    declined = False  # it decided not to walk that backward's graph

    def __init__(self) -> None:
        self.shared = _Shared()


class _Shared:
    """The part of a thread's state other threads read (`after_firing`)."""

    __slots__ = ("firing", "deferred")

    def __init__(self) -> None:
        # `serial` of the tensor whose hooks run now (paddle runs one tensor's hooks in a row)
        self.firing: int | None = None
        self.deferred: list[Callable[[], object]] = []  # run when the outermost backward ends


_state = _State()
# Reentrant: weakref callbacks (`_release`, `forget`) can run inside a locked section, from a
# garbage collection or a reference dropped there.
_lock = threading.RLock()
_holders: set[weakref.ref[Any]] = set()  # one per live hook function: the guard stays while any
# paddle's own entry points, as found when the guard goes in; kept after it goes out: a thread
# entering a wrapper while another drops the last hook still calls them
_originals: tuple[Callable[..., Any], Callable[..., Any]] = (
    core.eager.run_backward,
    core.eager.run_partial_grad,
)
_installed = False
# paddle.Tensor's `_register_grad_hook` (what `register_hook` calls) and `retain_grads`, as
# found when the guard goes in: while it is in, the nodes whose gradient user code can see are
# marked (`_seen`)
_Tensor: Any = core.eager.Tensor  # (its private methods are not in paddle's stubs)
_tensor_originals: tuple[Callable[..., Any], Callable[..., Any]] = (
    _Tensor._register_grad_hook,
    _Tensor.retain_grads,
)
# id(tensor) -> (weak reference to it, {token: weak reference to a hook function}) in
# registration order. Weak both ways: paddle holds the hook functions as long as they can fire,
# and a hook whose closure holds its tensor must not make the tensor immortal through us.
_tracked: dict[int, tuple[weakref.ref[Any], dict[int, weakref.ref[Callable[[Any], Any]]]]] = {}
_serials: dict[int, tuple[weakref.ref[Any], int]] = {}  # id(tensor) -> (it, its `serial`)
_numbers = itertools.count()
_active: dict[int, _Shared] = {}  # thread ident -> its state, while a backward runs there
_after_all: list[Callable[[], object]] = []  # actions waiting for `_active` to empty


def installed() -> bool:
    return _installed


def unguarded_backward(loss: Any) -> None:
    """Tensor.backward of `loss` through paddle's own entry point, past the guard."""
    _originals[0]([loss], [], False, None)


class _Redirect(weakref.ref):  # type: ignore[type-arg]
    """The holder of an identity node's object whose node hands its output out as it is."""

    __slots__ = ("ptr",)
    ptr: int


# node_ptr -> the holder of the object owning that identity node, for the nodes whose output
# goes out as it is: a hook registered on that output goes to the object's `redirect` first
_redirects: dict[int, _Redirect] = {}


def hold(hook_function: Callable[..., Any], identity: bool = False, redirect: int = 0) -> None:
    """Keep the guard installed while `hook_function` (held by paddle's graph) is alive;
    `identity`: it is an identity node's (see `passes_on`), counted while alive; `redirect`:
    that node's node_ptr, when its output goes out as it is and `hook_function` has a
    ``redirect(hook) -> hook`` for the hooks registered on that output (see `_mark`)."""
    global _originals, _tensor_originals, _installed, _identity_count
    with _lock:
        # The holder first: a Ctrl-C before the guard is in leaves one that takes it out
        # (`_release`), where the other order could leave the guard in for good.
        # A weak reference with a callback: a fifth of weakref.finalize's cost, and this runs
        # twice per call of a module with backward hooks.
        if redirect:
            _identity_count += 1
            holder = _Redirect(hook_function, _release_identity)
            holder.ptr = redirect
            _redirects[redirect] = holder
            _holders.add(holder)
        elif identity:
            _identity_count += 1
            _holders.add(weakref.ref(hook_function, _release_identity))
        else:
            _holders.add(weakref.ref(hook_function, _release))
        if not _installed:
            _originals = (core.eager.run_backward, core.eager.run_partial_grad)
            _tensor_originals = (_Tensor._register_grad_hook, _Tensor.retain_grads)
            _installed = True
            core.eager.run_backward = _run_backward
            core.eager.run_partial_grad = _run_partial_grad
            _Tensor._register_grad_hook = _register_grad_hook
            _Tensor.retain_grads = _retain_grads


def _release_identity(holder: weakref.ref[Any]) -> None:
    global _identity_count
    try:
        with _lock:
            _identity_count -= 1
            if isinstance(holder, _Redirect) and _redirects.get(holder.ptr) is holder:
                del _redirects[holder.ptr]
            _let_go(holder)
    except BaseException:
        _let_go(holder)  # see `_release`
        raise


def _release(holder: weakref.ref[Any]) -> None:
    try:
        _let_go(holder)
    except BaseException:
        # cut short (a Ctrl-C: CPython prints what a weakref callback raises, and drops it):
        # finish, or the guard would stay in for good
        _let_go(holder)
        raise


def _let_go(holder: weakref.ref[Any] | None, stale_up_to: int = 16) -> None:
    """`holder`'s hook function is gone: the guard goes out with the last one (idempotent).
    While at most `stale_up_to` holders are left, those whose function is gone too go as well:
    a Ctrl-C landing at the entry of their callback, which CPython drops, left them."""
    global _installed
    with _lock:
        if holder is not None:
            _holders.discard(holder)
        if _installed and 0 < len(_holders) <= stale_up_to:
            try:
                _holders.difference_update([ref for ref in list(_holders) if ref() is None])
            except RuntimeError:  # (changed meanwhile: a callback the collector ran) later
                pass
        if not _holders and _installed:
            core.eager.run_backward, core.eager.run_partial_grad = _originals
            _Tensor._register_grad_hook, _Tensor.retain_grads = _tensor_originals
            _installed = False


def sweep() -> None:
    """After a removal that let a hook function go: the guard goes out if none is left (see
    `_let_go`)."""
    _let_go(None, stale_up_to=len(_holders))


def track(tensor: Any, token: int, hook_function: Callable[[Any], Any]) -> None:
    """Remember `hook_function` (unique `token`) as a hook of `tensor`, for ``paddle.grad``."""
    key = id(tensor)
    with _lock:
        entry = _tracked.get(key)
        if entry is None or entry[0]() is not tensor:

            def forget(ref: weakref.ref[Any], key: int = key) -> None:
                with _lock:
                    if key in _tracked and _tracked[key][0] is ref:
                        del _tracked[key]

            entry = (weakref.ref(tensor, forget), {})
            _tracked[key] = entry
        entry[1][token] = weakref.ref(hook_function)


def untrack(tensor_ref: weakref.ref[Any], token: int) -> None:
    tensor = tensor_ref()
    if tensor is None:
        return
    with _lock:
        entry = _tracked.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            entry[1].pop(token, None)
            if not entry[1]:
                del _tracked[id(tensor)]


def serial(tensor: Any) -> int:
    """A number for `tensor` that no other tensor gets, ever (its id() comes back as soon as
    it dies: a dead activation's id must not make a new tensor look as if its hooks ran)."""
    key = id(tensor)
    with _lock:
        entry = _serials.get(key)
        if entry is not None and entry[0]() is tensor:
            return entry[1]

        def forget(ref: weakref.ref[Any], key: int = key) -> None:
            with _lock:
                if key in _serials and _serials[key][0] is ref:
                    del _serials[key]

        number = next(_numbers)
        _serials[key] = (weakref.ref(tensor, forget), number)
        return number


def token() -> int:
    """A number for a hook function that no other gets (`track`, `fired`)."""
    return next(_numbers)


def fired(token: int, tensor_serial: int) -> None:
    """Called by a hook function when it runs: record it for the running backward."""
    state = _state
    state.shared.firing = tensor_serial
    tokens = state.fired_tokens
    if tokens is not None:
        tokens.add(token)


def _run_unfired(inputs: Any, grads: Any, unreached: Container[int] = ()) -> Any:
    """Apply the tracked hooks of each input that did not fire to its returned gradient; call
    those of the `unreached` ones with None (`_unreached`: torch's engine calls them so)."""
    tokens = _state.fired_tokens or set()
    out = list(grads)
    for i, (tensor, grad) in enumerate(zip(inputs, out)):
        if grad is None and i not in unreached:
            continue
        with _lock:
            entry = _tracked.get(id(tensor))
            hooks = list(entry[1].items()) if entry is not None and entry[0]() is tensor else []
        for token, hook_ref in hooks:
            hook_function = hook_ref()
            if hook_function is not None and token not in tokens:
                result = hook_function(grad)
                if result is not None:
                    grad = result
        out[i] = grad
    return out if isinstance(grads, list) else type(grads)(out)


def _unreached(
    inputs: Any, grads: Any, gone: set[int], allow_unused: bool, unreached: list[int]
) -> Any:
    """paddle.grad's `grads` of `inputs`, None for each only edges carrying no gradient reach
    (`_Graph.gone`: the zeros an identity sent for an unused output; their indices appended
    to `unreached`), as torch's and paddle's without hooks; paddle's ValueError for one unless
    `allow_unused` (until 2026-12-07 zeros: the parameters of an auxiliary head whose output
    the loss leaves out)."""
    out = list(grads)
    for i, tensor in enumerate(inputs):
        if out[i] is not None and node_ptr(tensor) in gone:
            if not allow_unused:
                raise ValueError(
                    f"The {i}-th input does not appear in the backward graph (it gets no "
                    "gradient: only an output the loss leaves out reaches it). Please check "
                    "the input tensor or set allow_unused=True to get None result."
                )
            out[i] = None
            unreached.append(i)
    return out if isinstance(grads, list) else type(grads)(out)


def stash(error: BaseException) -> None:
    """Remember the exception a hook raised, for the entry point to re-raise."""
    if _state.pending is None or _state.passed:
        _state.pending, _state.passed = error, False


def _wraps(error: OSError, pending: BaseException) -> bool:
    """Whether paddle's `error` wraps `pending`, re-raised by a backward run inside a node of
    another (a reentrant recompute's): paddle's text names the type and the message of what
    left the PyLayer's backward, and each frame it went through at the line that frame was
    on as it left (a ``raise`` later in the frame that caught it: helper-219's FINDING 1). A
    hook or a PyLayer that caught `pending` and raised another error, or went on, leaves it
    out of that text (helper-216's FINDING 1: the type's name alone told nothing; helper-218's
    FINDINGS 1 to 3: nor did the traceback's outermost frame, where it was last caught; an
    error of the same type and place, with another message: helper-219's FINDING 2).
    """
    traceback = pending.__traceback__
    if traceback is None:
        return False
    while traceback.tb_next is not None:
        traceback = traceback.tb_next
    frame = traceback.tb_frame
    text = str(error)
    if f"{frame.f_code.co_filename}({frame.f_lineno}): {frame.f_code.co_name}" not in text:
        return False
    try:
        lines = str(pending).splitlines()
    except Exception:  # (a `__str__` that raises: paddle's text has no message to compare)
        lines = []
    said = f"{type(pending).__name__}: {lines[0][:200]}" if lines else type(pending).__name__
    return said in text


def building_graph() -> bool:
    return _state.create_graph


def after_firing(tensor: Any, action: Callable[[], object]) -> None:
    """Run `action` now, or, while the hooks of `tensor` run (in any thread), once each
    backward running them has returned: torch snapshots a tensor's hooks when they start."""
    key = serial(tensor)
    with _lock:
        states = [state for state in _active.values() if state.firing == key]
        if not states:
            action()
            return
        left = [len(states)]

        def one() -> None:
            left[0] -= 1
            if not left[0]:
                action()

        for state in states:
            state.deferred.append(one)


def after_all_backwards(action: Callable[[], object]) -> None:
    """Run `action` now, or when no backward runs in any thread any more. It runs under the
    lock a backward takes to start: no backward can begin while it runs."""
    with _lock:
        if _active:
            _after_all.append(action)
        else:
            action()


def at_backward_end(action: Callable[[], object]) -> None:
    """Run `action` when the innermost backward running on this thread is over (paddle's own
    end-of-backward work, DataParallel's all-reduce included, done), before it returns to its
    caller; an exception `action` raises comes out of it with its own type, after the other
    actions ran. A backward the guard does not wrap (it started before the guard went in) runs
    it as paddle's own final hook."""
    ends = _state.ends
    if ends is None:
        core.eager._add_backward_final_hook(action)
        return
    ends.append(action)


def _run_ends(actions: list[Callable[[], object]]) -> None:
    error: Exception | None = None
    for action in actions:
        try:
            action()
        except Exception as e:  # the others still run: each may be a collective every rank runs
            error = error or e
    if error is not None:
        raise error


def _enter(state: _Shared) -> None:
    with _lock:
        _active[threading.get_ident()] = state


def _leave(state: _Shared) -> None:
    """This thread's outermost backward returned: run what waited for it."""
    with _lock:
        _active.pop(threading.get_ident(), None)  # (a Ctrl-C may have kept `_enter` from it)
        deferred, state.deferred = state.deferred, []
        for action in deferred:
            action()
        if not _active:
            while _after_all:
                _after_all.pop(0)()


def _run_backward(*args: Any, **kwargs: Any) -> Any:
    # (tensors, grad_tensors, retain_graph, ...)
    roots = args[0] if args else kwargs.get("tensors")
    retained = bool(args[2] if len(args) > 2 else kwargs.get("retain_graph", False))
    run = lambda: _guarded(_beside_others, False, args, kwargs, roots)  # noqa: E731
    return _entry(False, run, retained)


def _run_partial_grad(*args: Any, **kwargs: Any) -> Any:
    # (outputs, inputs, grad_outputs, retain_graph, create_graph, ...)
    create_graph = bool(args[4] if len(args) > 4 else kwargs.get("create_graph", False))
    unused = bool(args[6] if len(args) > 6 else kwargs.get("allow_unused", False))
    inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
    roots = args[0] if args else kwargs.get("outputs")
    _check_spent(roots)
    cuts = _cut_slots(roots, inputs) if _several else _NO_CUTS
    return _entry(
        True,
        lambda: _guarded(_one_at_a_time, create_graph, args, kwargs, roots, inputs, cuts, unused),
    )


# paddle 3.3.1's paddle.grad is not thread-safe: beside another paddle.grad or a Tensor.backward
# on another thread (no hook needed) it segfaults copying the graph, corrupts the heap or
# reports inputs missing from it. Tensor.backward beside Tensor.backward holds. So, while
# unihook's hooks live: backwards share the graph, a paddle.grad has it alone.
_graph_lock = threading.Lock()
# (`with _graph_lock`, not `with _graph`: Condition's `__exit__` is Python, where a Ctrl-C can
# land before it releases the lock, which would then stay held for every later backward)
_graph = threading.Condition(_graph_lock)
# thread ident -> its Tensor.backward calls sharing the graph. Per thread, and restored by the
# thread from what it saw before: a KeyboardInterrupt between two statements here cannot leave
# a count behind for others to wait on forever.
_readers: dict[int, int] = {}
_writer: int | None = None  # the thread running paddle.grad alone


def _heal(me: int) -> None:
    """This thread's outermost backward starts: a count or a writer left to it is stale (a
    KeyboardInterrupt inside the `finally` below): let the other threads go."""
    global _writer
    if _state.depth == 1 and (_writer == me or me in _readers):
        with _graph_lock:
            if _writer == me:
                _writer = None
            _readers.pop(me, None)
            _graph.notify_all()


def _beside_others(*args: Any, **kwargs: Any) -> Any:
    me = threading.get_ident()
    _heal(me)
    if _writer == me:  # a Tensor.backward inside a hook of this thread's paddle.grad
        return _originals[0](*args, **kwargs)
    before: int | None = None
    try:
        with _graph_lock:
            while _writer is not None:
                _graph.wait()
            before = _readers.get(me, 0)
            _readers[me] = before + 1
        return _originals[0](*args, **kwargs)
    finally:
        if before is not None:
            with _graph_lock:
                if before:
                    _readers[me] = before
                else:
                    _readers.pop(me, None)
                _graph.notify_all()


def _one_at_a_time(*args: Any, **kwargs: Any) -> Any:
    global _writer
    me = threading.get_ident()
    _heal(me)
    if _writer == me or _readers.get(me):
        # inside a hook of this thread's own backward: waiting for it would never end; paddle
        # runs it as it would without unihook. (A hook that waits for paddle.grad on another
        # thread deadlocks: README.)
        return _originals[1](*args, **kwargs)
    try:
        with _graph_lock:
            while _writer is not None or any(t != me for t in _readers):
                _graph.wait()
            _writer = me
        return _originals[1](*args, **kwargs)
    finally:
        if _writer == me:
            with _graph_lock:
                _writer = None
                _graph.notify_all()


def _guarded(
    run: Callable[..., Any],
    create_graph: bool,
    args: Any,
    kwargs: Any,
    roots: Any,
    inputs: Any = None,
    cuts: dict[int, frozenset[int]] = {},  # noqa: B006 (never mutated)
    allow_unused: bool = True,
) -> Any:
    state = _state
    # What the `finally` restores, read before anything changes (a Ctrl-C landing between two
    # of the changes below must find it restored: a depth left at 1, or this backward's roots,
    # would stay for good)
    outer_graph, outer_fired, outer_cuts = state.create_graph, state.fired_tokens, state.cuts
    outer_replaced, outer_ends, outer_depth = state.replaced, state.ends, state.depth
    outer_walk = state.roots, state.graph, state.obliged, state.asked, state.declined
    outer_inputs = state.inputs, state.needed
    shared = state.shared
    outer_firing = shared.firing
    # paddle 3.3.1 leaves gradients off for good after an exception in a node's post hook
    # (`cut_off`'s: a Ctrl-C there, helper-209's FINDING 2): restored where the backward raised
    grad_mode, finished = _paddle().is_grad_enabled(), False
    try:
        state.replaced, state.ends = {}, []
        state.roots, state.graph, state.obliged, state.asked, state.declined = (
            roots,
            None,
            None,
            0,
            False,
        )
        state.inputs, state.needed = inputs, None
        state.create_graph = create_graph
        state.cuts = cuts
        state.fired_tokens = set()
        shared.firing = None
        state.depth = outer_depth + 1
        if not outer_depth:
            _enter(shared)
        try:
            grads = run(*args, **kwargs)
        except OSError as error:
            pending, passed, state.pending, state.passed = state.pending, state.passed, None, False
            if passed and pending is not None and not _wraps(error, pending):
                pending = None  # (caught on its way: this OSError is another error's)
            if pending is not None:
                if outer_depth:
                    # this backward runs inside a node of another (paddle's reentrant
                    # `recompute` runs its segment's backward in its PyLayer's): paddle wraps
                    # what leaves here in that node's OSError, which the outer entry gives back
                    # as the hook's own (helper-213's FINDING 5)
                    state.pending, state.passed = pending, True
                try:
                    raise pending from None
                finally:
                    # (its traceback holds this frame: a cycle only the collector frees, which
                    # kept what the hooks were given until it ran)
                    del pending
            if "KeyboardInterrupt" in str(error):
                # a Ctrl-C that landed in a PyLayer's backward outside any hook (unihook's own
                # code there): paddle wraps it in an OSError, which `except KeyboardInterrupt`
                # would miss
                raise KeyboardInterrupt from error
            raise
        unreached: list[int] = []
        if inputs is not None and state.graph is not None and state.graph.gone:
            grads = _unreached(inputs, grads, state.graph.gone, allow_unused, unreached)
        if inputs is not None and _tracked:
            grads = _run_unfired(inputs, grads, unreached)
        if state.ends:
            _run_ends(state.ends)
        finished = True
        return grads
    finally:
        if not finished and _paddle().is_grad_enabled() != grad_mode:
            _paddle().set_grad_enabled(grad_mode)
        if state.graph is not None:
            # (also where the backward raised: a hook left on a node of a retained graph
            # zeroed a later backward's live gradient there, helper-192's FINDING 1)
            state.graph.unhook()
        state.depth = outer_depth
        state.create_graph, state.fired_tokens, state.cuts = outer_graph, outer_fired, outer_cuts
        state.replaced = outer_replaced
        state.ends = outer_ends
        if state.asked:
            _history[:] = (
                _history[0] if state.graph is None else len(state.graph.children),
                state.asked,
            )
        state.roots, state.graph, state.obliged, state.asked, state.declined = outer_walk
        state.inputs, state.needed = outer_inputs
        shared.firing = outer_firing
        if not outer_depth:
            state.pending, state.passed = None, False
            try:
                _leave(shared)
            except BaseException:
                _leave(shared)  # (a Ctrl-C at its entry: this thread would stay "in a backward")
                raise


# -- PyLayer nodes that Tensor.backward already ran (SEMANTICS trap 7) -------------------------
# paddle's GradNodePyLayer frees its Python context after its first run, whatever retain_graph
# says, and sets it to NULL: a later Tensor.backward reaching the node dereferences NULL, and a
# paddle.grad reaching it copies the node first (Py_INCREF(NULL)); both segfault. paddle.grad
# runs copies of the nodes, so only Tensor.backward spends them. The owner of a node registers a
# gradient hook on it that raises while it is spent (it runs before the NULL dereference:
# enough for Tensor.backward); paddle.grad is checked here, by a walk of its graph, before
# paddle copies anything.

# node_ptr() of a spent node -> builds the error to raise when a backward would reach it
_spent: dict[int, Callable[[], BaseException]] = {}
_grad_fn_leak: int | None = None  # references Tensor.grad_fn leaks per access (None: unknown)


def replace(node: object, gradient: Any) -> bool:
    """Record `gradient` for the identity node `node` (its object) in the innermost backward
    running on this thread (`redirect`); the record goes when that backward ends. False when
    no backward runs here under the guard (nowhere to record it)."""
    replaced = _state.replaced
    if replaced is None:
        return False
    replaced[id(node)] = gradient
    return True


def replacement(node: object) -> Any:
    """What `replace` recorded for `node` in the innermost running backward (once), or None."""
    replaced = _state.replaced
    return None if not replaced else replaced.pop(id(node), None)


def backward_here() -> bool:
    """True while a backward runs on this thread (Tensor.backward or paddle.grad)."""
    return _state.depth > 0


def in_tensor_backward() -> bool:
    """True while Tensor.backward / paddle.autograd.backward runs (not paddle.grad)."""
    return _state.depth > 0 and not _state.partial


def identity_nodes_reached() -> list[Any]:
    """The live identity nodes' objects (`hold`) in the graph of the innermost running
    backward: one walk, for a backward that raised."""
    roots = _state.roots
    if roots is None:
        return []
    reached = {int(ptr) for ptr, _ in _walk(roots)}
    with _lock:
        held = [ref() for ref in _holders]
    return [h for h in held if h is not None and getattr(h, "ptr", 0) in reached]


def graph_freed() -> bool:
    """True while a Tensor.backward without retain_graph runs: no pass can go through its
    graph again (paddle frees the nodes' saved tensors as they run)."""
    return in_tensor_backward() and not _state.retained


def node_ptr(tensor: Any) -> int:
    """The address of `tensor`'s grad node (0 when it cannot be read without leaking it)."""
    node = grad_node(tensor)
    return 0 if node is None else int(node.node_ptr())


def spend(ptr: int, keeper: object, error: Callable[[], BaseException]) -> None:
    """Record that the PyLayer node at `ptr` ran under Tensor.backward. `keeper` lives exactly
    as long as the node (a hook the node holds): the record goes with it, so a new node at the
    same address is not mistaken for it. A later paddle.grad whose graph reaches the node
    raises `error()` instead of running."""
    if ptr:
        _spent[ptr] = error
        weakref.finalize(keeper, _spent.pop, ptr, None)


def grad_node(tensor: Any) -> Any:
    """``tensor.grad_fn`` without its leak: paddle 3.3.1's getter returns the node's Python
    wrapper with one reference too many, which keeps the wrapper, so the node and the whole
    graph behind it, alive forever. The leak is measured once, then given back on each access;
    if it is not a plain count, grad_fn is not used (None)."""
    global _grad_fn_leak
    if _grad_fn_leak is None:
        _grad_fn_leak = _measure_grad_fn_leak()
    if _grad_fn_leak < 0:
        return None
    node = getattr(tensor, "grad_fn", None)
    if node is not None and _grad_fn_leak:
        for _ in range(_grad_fn_leak):
            ctypes.pythonapi.Py_DecRef(ctypes.py_object(node))
    return node


def _measure_grad_fn_leak() -> int:
    import paddle

    with paddle.set_grad_enabled(True):
        x = paddle.ones([1])
        x.stop_gradient = False
        y = x * 2
    node = y.grad_fn
    if node is None:
        return -1
    before = sys.getrefcount(node)
    y.grad_fn  # noqa: B018 (the access is the measurement)
    leak = sys.getrefcount(node) - before
    if leak not in (0, 1):
        return -1
    for _ in range(2 * leak):  # the two accesses above
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(node))
    return leak


def _entry(partial: bool, run: Callable[[], Any], retained: bool = True) -> Any:
    state = _state
    outer, state.partial = state.partial, partial
    kept, state.retained = state.retained, retained
    try:
        return run()
    finally:
        state.partial, state.retained = outer, kept


def _check_spent(roots: Any) -> None:
    """Raise before a paddle.grad from `roots` reaches a spent PyLayer node. Free while no
    spent node is alive (the common case: a graph is dropped after its backward), else one walk
    of the graph."""
    if not _spent or roots is None:
        return
    for ptr, _ in _walk(roots):
        error = _spent.get(ptr)
        if error is not None:
            raise error()


def _walk(roots: Any) -> Iterator[tuple[int, Any]]:
    """(node_ptr, node) of every grad node reachable from `roots` (a tensor or a list), once."""
    if not isinstance(roots, (list, tuple)):
        roots = [roots]
    stack = [node for node in map(grad_node, roots) if node is not None]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        ptr = node.node_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        yield ptr, node
        stack.extend(n for n in node.next_functions if n is not None)


# -- the input slots paddle.grad cuts ----------------------------------------------------------
# paddle.grad (GeneralGrad::ModifyBackwardGraph) clears the edges from a node with several
# input slots to nodes from which none of its inputs can be reached, then requires that node's
# backward to return None there ("should return None at 1 position"); a PyLayer's backward
# cannot see which. One walk of the graph per paddle.grad, only while an identity with several
# input slots lives, predicts them by paddle's rule. (no_grad_vars' edges are cut too; they are
# not predicted: paddle then raises its error, it never runs wrongly.)

_NO_CUTS: dict[int, frozenset[int]] = {}
_NONE: frozenset[int] = frozenset()
# node_ptr() of a live identity node with several input slots -> its keeper (alive with it)
_several: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def several_slots(ptr: int, keeper: object) -> None:
    """Register the identity node at `ptr`, which has several input slots; `keeper` lives
    exactly as long as the node."""
    if ptr:
        _several[ptr] = keeper


def pruned(ptr: int) -> frozenset[int]:
    """The input slots of the node at `ptr` that the running paddle.grad cut: its backward must
    return None there."""
    return _state.cuts.get(ptr, _NONE)


def unneeded(ptr: int) -> bool:
    """Whether the running backward is a paddle.grad that reaches none of its inputs below the
    node at `ptr`: torch's engine runs no such node (autograd.grad w.r.t. the parameters
    alone: a module's input side, whose hook then does not fire), paddle runs it. One walk
    of the graph, at the first ask."""
    state = _state
    if state.inputs is None or state.roots is None:
        return False
    needed = state.needed
    if needed is None:
        needed = state.needed = _needed(_parents(state.roots)[0], state.inputs)
    return ptr not in needed


def _parents(roots: Any) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """The graph of `roots`: each node's parents, and the child of each slot of the identity
    nodes of several slots (0: none)."""
    parents: dict[int, list[int]] = {}
    slots: dict[int, list[int]] = {}
    several = set(_several.keys())  # (a set: the weak dictionary's lookups cost a call each)
    if not isinstance(roots, (list, tuple)):
        roots = [roots]
    todo = [(node.node_ptr(), node) for node in map(grad_node, roots) if node is not None]
    seen = {ptr for ptr, _ in todo}
    while todo:  # (`_walk`'s, each node_ptr read once: this runs for every paddle.grad)
        ptr, node = todo.pop()
        children = []
        for child in node.next_functions:
            child_ptr = 0 if child is None else child.node_ptr()
            children.append(child_ptr)
            if child_ptr:
                parents.setdefault(child_ptr, []).append(ptr)
                if child_ptr not in seen:
                    seen.add(child_ptr)
                    todo.append((child_ptr, child))
        if ptr in several:
            slots[ptr] = children
    return parents, slots


def _needed(parents: dict[int, list[int]], inputs: Any) -> set[int]:
    """paddle's needed nodes: the inputs' nodes and every node from which one can be reached."""
    if not isinstance(inputs, (list, tuple)):
        inputs = [inputs]
    needed: set[int] = set()
    todo = [node.node_ptr() for node in map(grad_node, inputs) if node is not None]
    while todo:
        ptr = todo.pop()
        if ptr not in needed:
            needed.add(ptr)
            todo.extend(parents.get(ptr, ()))
    return needed


def _cut_slots(roots: Any, inputs: Any) -> dict[int, frozenset[int]]:
    if roots is None or inputs is None:
        return _NO_CUTS
    parents, slots = _parents(roots)
    if not slots:
        return _NO_CUTS
    needed = _needed(parents, inputs)
    cuts = {}
    for ptr, children in slots.items():
        if ptr in needed:
            cut = frozenset(i for i, c in enumerate(children) if c and c not in needed)
            if cut:
                cuts[ptr] = cut
    return cuts or _NO_CUTS


# -- nodes whose gradient user code sees --------------------------------------------------
# A tensor hook (which may keep its gradient, or return a view of it that a grad kernel then
# writes over) and retain_grads (paddle's .grad of a non-leaf is the gradient itself, which user
# code may change in place: `clear_gradient()` zeroes it; torch's retain_grad stores a copy)
# let user code reach the gradient a node receives. While the guard is in, registering either
# marks the tensor's grad node; `passes_on` never passes a gradient a hook saw to such a node.
# Every node `passes_on` trusts is created while the guard is in (it goes in with the first
# identity node and stays while one lives), so no mark is missed. The mark lives as long as the
# node: a no-op hook of ours beside the user's, which paddle drops with the node.

_seen: set[int] = set()  # node_ptr of each marked node (it has a live _Mark hook)
_marks: set[weakref.ref[Any]] = set()  # the _Mark hooks, weakly (the node holds them)
_identity_count = 0  # identity nodes alive (`hold`)


class _Mark:
    __slots__ = ("__weakref__",)

    def __call__(self, grad: Any) -> None:
        return None


def _unmark(ref: weakref.ref[Any], ptr: int) -> None:
    with _lock:
        _marks.discard(ref)
        _seen.discard(ptr)


def _mark(tensor: Any, hook: Any = None, native: bool = False) -> Any:
    """Mark `tensor`'s grad node as seen by user code; return `hook`, redirected when that node
    is an identity node handing its output out as it is, and not run as it is where only
    edges carrying no gradient reach it (`_unless_gone`; `native`: registered through
    paddle's own API)."""
    node = grad_node(tensor) if hook is not None or _identity_count else None
    if node is None:
        return hook  # a leaf: its accumulation node is never trusted
    ptr = int(node.node_ptr())
    holder = _redirects.get(ptr)
    owner = None if holder is None else holder()
    if hook is not None and owner is not None:
        hook = owner.redirect(hook)
    if hook is not None:
        # (outside the redirect: where the node gets no gradient, the redirect records no
        # replacement, which would stand for one: helper-206's FINDING 1; also while no
        # identity node lives yet, a hook registered before the forward that makes them:
        # helper-205's FINDING 1)
        hook = functools.partial(_unless_gone, ptr, hook, native)
    if not _identity_count:
        return hook  # (what `passes_on` trusts is made while an identity node lives)
    with _lock:
        if ptr in _seen:
            return hook  # (one mark a node: it stays until the node goes, whatever is removed)
        mark = _Mark()
        _seen.add(ptr)
        _marks.add(weakref.ref(mark, lambda ref, ptr=ptr: _unmark(ref, ptr)))
    _tensor_originals[0](tensor, mark)
    return hook


def _unless_gone(ptr: int, hook: Callable[[Any], Any], native: bool, grad: Any) -> Any:
    """`hook` on a tensor of the node at `ptr`; where only edges carrying no gradient reach
    that node in the running backward (`_Graph.gone`: the zeros of an unused output of a
    hooked call), what it returns is left out, and it is called with None, as torch's engine
    calls it there (unihook's `register_tensor_hook`), or not at all, as paddle without
    unihook's hooks runs no node there (one registered through paddle's own API, which may
    not take None: helper-205's FINDING 4). Until 2026-12-07 it got zeros, and what it
    returned went on as a gradient; GradientMonitor recorded 0.0 for an auxiliary head beside
    a global full hook (helper-204's FINDING 3)."""
    graph = _state.graph
    if graph is not None and ptr in graph.gone:
        if not native:
            hook(None)
        return None
    return hook(grad)


def _register_grad_hook(self: Any, hook: Any) -> Any:
    if not self.stop_gradient:
        hook = _mark(self, hook, native=True)
    return _tensor_originals[0](self, hook)


def _retain_grads(self: Any) -> Any:
    if not self.stop_gradient:
        _mark(self)
        _retain(self)
    return _tensor_originals[1](self)


# node_ptr -> the tensors of that node whose gradients user code retained (`retain_grads`)
# while the guard was in, weakly: where only edges carrying no gradient reach the node, their
# .grad is None again as the backward ends, as torch's and paddle's without hooks (they kept
# the zeros sent: helper-205's FINDING 3)
_retained: dict[int, list[weakref.ref[Any]]] = {}


def _retain(tensor: Any) -> None:
    ptr = node_ptr(tensor)
    if not ptr or tensor.is_leaf:
        return

    def forget(ref: weakref.ref[Any]) -> None:
        with _lock:
            refs = _retained.get(ptr)
            if refs is not None and ref in refs:
                refs.remove(ref)
                if not refs:
                    del _retained[ptr]

    with _lock:
        refs = _retained.setdefault(ptr, [])
        if not any(ref() is tensor for ref in refs):  # (once however often it is asked)
            refs.append(weakref.ref(tensor, forget))


def register_hook(tensor: Any, hook: Callable[[Any], Any], hook_ids: list[int]) -> None:
    """``tensor._register_grad_hook(hook)`` (marking its node while the guard is in), paddle's
    id appended to `hook_ids` by C code: no point between them where a Ctrl-C can land."""
    if not tensor.stop_gradient:  # (also before the guard is in: `_unless_gone`)
        hook = _mark(tensor, hook)
    register = _tensor_originals[0] if _installed else _Tensor._register_grad_hook
    hook_ids.extend(map(register, (tensor,), (hook,)))


def register_unseen(tensor: Any, hook: Callable[[Any], Any]) -> int:
    """Register `hook` on `tensor` without marking its node: for unihook's own hooks that
    neither keep nor change the gradient (an identity node's)."""
    return int(_tensor_originals[0](tensor, hook))


# -- gradients passed on without a copy ------------------------------------------------------
# paddle changes a gradient in place after a node returned it: a node's input buffer adds a
# later gradient into the first one it received (GradTensorHolder), a leaf's .grad accumulates
# into the tensor it got, and a grad kernel whose incoming gradient nobody else references
# writes its result over it (relu_grad and others, "inplace" in paddle's backward.yaml). What a
# hook saw (the tensor, a view of it) would change after the hook: torch never does that (its
# input buffer steals only a gradient nothing else references). So a gradient a hook saw goes on
# as a copy, unless the graph of the running backward shows that nothing can change it:
# `passes_on`, one walk of the graph per backward, made when the first node asks.


class _Graph:
    """The running backward's graph, from its roots: each node's children and how many edges
    reach it, its name."""

    __slots__ = (
        "children",
        "cleared",
        "dead",
        "dead_gradients",
        "edges_in",
        "gone",
        "gone_leaves",
        "handles",
        "materializing",
        "names",
        "nodes",
        "posts",
        "reach",
        "returned",
        "seeds",
        "tainted",
        "told_in",
        "zeroed",
    )

    def __init__(self, roots: Any) -> None:
        self.children: dict[int, list[int]] = {}
        self.edges_in: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self.nodes: dict[int, Any] = {}  # (the node objects, for `cut_off`'s post hooks)
        self.dead: dict[int, int] = {}  # edges into a node that carry no gradient (`cut_off`)
        self.zeroed: set[int] = set()  # the nodes only those reach (`cut_off`)
        # ... and those only edges carrying no gradient as torch's reach (told: an unused
        # output's, a full hook's None; not a pre-hook's None for a used one), with the count
        self.told_in: dict[int, int] = {}
        self.gone: set[int] = set()
        self.gone_leaves: set[int] = set()  # (the leaves' nodes among them)
        self.materializing: set[int] | None = None  # (`_materializing`, when first needed)
        self.handles: list[Any] = []  # `cut_off`'s post hooks, taken off as the backward ends
        self.returned: list[list[Any]] = []  # what they returned (`_given_back`)
        self.cleared: list[weakref.ref[Any]] = []  # `_none_again`'s leaves
        # the zero gradients `cut_off` told, by data pointer (`dead_slots`; held: no other
        # tensor takes their memory while the backward runs)
        self.dead_gradients: dict[int, Any] = {}
        self.reach: dict[tuple[int, int], bool] = {}
        self.tainted: set[int] | None = None  # see `receives_seen`
        # whether `hook` places post hooks: not under paddle.grad, which runs copies of the
        # nodes made as it starts (see `cut_off`)
        self.posts = in_tensor_backward()
        if not isinstance(roots, (list, tuple)):
            roots = [roots]
        stack = [node for node in map(grad_node, roots) if node is not None]
        # the roots' nodes, which the backward's own seed gradient reaches besides any edge
        # (helper-194's FINDINGS 1, 2: taken for reached by zeros only, they gave zeros)
        self.seeds = {node.node_ptr() for node in stack}
        while stack:
            node = stack.pop()
            ptr = node.node_ptr()
            if ptr in self.children:
                continue
            kids = []
            for child in node.next_functions:
                child_ptr = 0 if child is None else child.node_ptr()
                kids.append(child_ptr)
                if child_ptr:
                    self.edges_in[child_ptr] = self.edges_in.get(child_ptr, 0) + 1
                    stack.append(child)
            self.children[ptr] = kids
            self.names[ptr] = node.name()
            self.nodes[ptr] = node

    def hook(self, ptr: int, zeros: bool, tell: bool) -> None:
        """`cut_off`'s post hook on the node at `ptr`, for this backward: it gives zeros
        (`zeros`), and tells the zeros it gives to the identity nodes below (`tell`)."""
        if not self.posts:
            return
        told = self.dead_gradients if tell else None
        hook = functools.partial(_zeros_if_dead, self.zeroed, ptr, zeros, told, self.returned)
        self.handles.append(self.nodes[ptr]._register_post_hook(hook))

    def tell(self, gradients: Any) -> None:
        """`gradients` carry no gradient (`dead_slots`)."""
        for gradient in gradients:
            if _has_values(gradient):
                self.dead_gradients[int(gradient.data_ptr())] = gradient

    def unhook(self) -> None:
        """The backward is over (also one that raised): `cut_off`'s post hooks go, and the
        leaves `_none_again` found get None back."""
        handles, self.handles = self.handles, []
        for handle in handles:
            handle.remove()
        _given_back(self.returned)
        cleared, self.cleared = self.cleared, []
        if not cleared:
            return
        with _lock:
            # (not while another thread's backward runs: it may be adding its gradient to the
            # same leaf, read as zeros here and lost, or read half made: "Tensor not initialized
            # yet", helper-213's FINDING 1; that leaf keeps zeros. `_enter` takes the lock.)
            if len(_active) > 1:
                return
            for ref in cleared:
                try:
                    _clear_zeros(ref())
                except Exception:  # (one paddle cannot read keeps zeros; the error goes on)
                    pass

    def reaches(self, start: int, target: int) -> bool:
        """Whether the node `target` is `start` or at most `_NEAR` nodes below it (breadth
        first: a module's last node reaches its input side's in a few steps; a search through
        a whole graph for every node would cost its size squared)."""
        key = (start, target)
        found = self.reach.get(key)
        if found is None:
            seen = {start}
            todo = deque([start])
            found = False
            while todo and len(seen) <= _NEAR:
                ptr = todo.popleft()
                if ptr == target:
                    found = True
                    break
                for child in self.children.get(ptr, ()):
                    if child and child not in seen:
                        seen.add(child)
                        todo.append(child)
            self.reach[key] = found
        return found


_NEAR = 64


def cut_off(
    ptr: int,
    slots: Sequence[int],
    zeros: Sequence[Any] | None = None,
    leaves: Callable[[], Iterable[Any]] | None = None,
) -> None:
    """The identity node at `ptr` sends zeros down its input `slots` for no gradient (an
    output the loss does not use, a hook's None: paddle's nodes take no None, trap 3): each
    grad node that only such edges reach in the running Tensor.backward gives zeros in place
    of what its kernel makes of them (a sqrt's at 0: 0 * inf, NaN in every gradient below,
    where torch's undefined gradient gives none: helper-108's FINDINGS 3 and 4), through a
    post hook of paddle's taken off as the backward ends: the nodes of `SINGULAR` only (any
    other gives zeros of zeros; a post hook's result for a node with a list of inputs, a
    concat's, segfaults or raises in paddle 3.3.1, whatever it is). No post hook under
    paddle.grad, which runs copies of the nodes made as it starts, which a hook registered
    now does not reach (helper-190's measurements; hooks placed on every such node before it
    starts, 2026-12-07, cost 1.6x a paddle.grad and made the next one abort the process after
    one raised, paddle freeing its copies of them without the GIL: helper-196's FINDING 1):
    there the nodes are counted only (`_Graph.gone`, which the tensor hooks and the identity
    nodes below read by the original nodes' addresses, and `_unreached`).

    A leaf among `leaves()` (the hooked module's parameters) that only such edges reach, whose
    .grad is None, has None again as the backward ends, as torch's (an optimizer skips a
    parameter whose .grad is None; zeros took weight decay and momentum: a no-op hook changed
    the training of an auxiliary head whose output the loss leaves out). Any other leaf only
    they reach gets zeros in .grad.

    The identity nodes below (an inner hooked layer's, one of whose outputs only those edges
    reach) are told which of their slots get no gradient (`dead_slots`): those of a node only
    told edges reach (`_Graph.gone`: `zeros` given, not None, which stands for a gradient
    there); else the zeros sent, and those the zeroed nodes of `TELLING` above an identity
    give, by data pointer; they then take that slot for one with no gradient, as torch's hook
    does (until 2026-12-07 they took the zeros for a gradient, and a sqrt inside made every
    gradient NaN: helper-196's FINDING 2)."""
    if not slots:
        return
    graph = _running_graph()
    children = None if graph is None else graph.children.get(ptr)
    if graph is None or children is None:
        return
    told = zeros is not None
    recount = ptr in graph.zeroed
    # (a node all of whose edges carry none: its children were counted with it)
    if not recount or (told and ptr not in graph.gone):
        if told:
            graph.tell(zeros)
        todo = [(children[i], told) for i in slots if i < len(children) and children[i]]
        _count_dead(graph, todo, recount)
    if graph.gone_leaves and leaves is not None and graph.posts:
        # (also those an outer identity's walk found: a layer before a full hook's None)
        _none_again(graph, graph.gone_leaves, leaves())


def _count_dead(graph: _Graph, todo: list[tuple[int, bool]], recount: bool) -> None:
    """Count the edges of `todo` (child, told) as carrying no gradient, and those of the nodes
    only such edges reach (`zeroed`; `gone` where all are told). `recount`: the edges were
    counted, as untold, by the walk that zeroed the node they leave (edges into it from a
    pre-hook's None and from an unused output): they are told now, that node's identity
    having taken its slot for one with none (helper-202's generated cases). The leaves' nodes
    that only told edges reach go to `gone_leaves`."""
    dead, told_in, edges_in, names = graph.dead, graph.told_in, graph.edges_in, graph.names
    while todo:
        node, by_told = todo.pop()
        if not recount:
            dead[node] = dead.get(node, 0) + 1
        if by_told:
            told_in[node] = told_in.get(node, 0) + 1
        if dead.get(node, 0) != edges_in.get(node, 0) or node in graph.seeds:
            continue  # (a gradient still comes in through another edge, or as a seed)
        gone = told_in.get(node, 0) == dead[node]
        if recount and (not gone or node in graph.gone):
            continue  # (as it was: its children were counted with it)
        if gone:
            graph.gone.add(node)
            if node in _retained:
                _none_again(graph, {node}, [ref() for ref in _retained.get(node, ())])
        name = names.get(node, "")
        if name.startswith(_PYLAYER) and node in _materializing(graph):
            # the input side of a call with full hooks: torch's BackwardHook gives the
            # inputs zeros where none came, which stand for a gradient below (its hooks see
            # zeros: helper-202's FINDING 1); its own None for an input is its `cut_off`'s
            continue
        graph.zeroed.add(node)
        if name == _ACCUMULATION and gone:
            graph.gone_leaves.add(node)
        kids = [child for child in graph.children.get(node, ()) if child]
        tell = gone and name in TELLING and any(names.get(k, "").startswith(_PYLAYER) for k in kids)
        # (and one gone gives zeros whatever a tensor hook put in: one registered before
        # unihook's, which the guard could not wrap, returned ones there, and they went on as
        # a gradient, 89.97 where paddle's is 0.03: helper-205's FINDING 1)
        singular, neutral = name in SINGULAR, gone and name in TELLING
        if recount:  # (a singular one's zeros hook is on already)
            if tell or (neutral and not singular):
                graph.hook(node, not tell, tell)
        elif tell or singular or neutral:
            graph.hook(node, True, tell)
        todo.extend((kid, gone) for kid in kids)


_ACCUMULATION = "GradNodeAccumulation"  # (a leaf's node: paddle runs no post hook on it)


def _materializing(graph: _Graph) -> set[int]:
    """The node_ptrs of the live identity nodes that materialize a slot with no gradient
    (their objects' `materialize`: a call's input side), once per backward that needs them."""
    if graph.materializing is None:
        with _lock:
            held = [ref() for ref in _holders]
        graph.materializing = {
            h.ptr for h in held if h is not None and getattr(h, "materialize", False) is True
        }
    return graph.materializing


def _none_again(graph: _Graph, accumulating: set[int], leaves: Iterable[Any]) -> None:
    """The leaves whose grad nodes are in `accumulating` (only zeros reach them: their
    gradients have not come yet) and whose .grad is None get None back as the backward ends
    (`_Graph.unhook`, also where it raised: helper-201's FINDING 3), unless something else put
    a gradient there meanwhile (another thread's backward). Only `leaves` (the hooked module's
    parameters, the leaves its call was given): paddle names no leaf of a grad node, and a
    search of the live parameters (`gc.get_objects`) broke other threads building a tuple
    (SystemError) and cost 25 to 70 ms a step (helper-212's FINDINGS 1, 2)."""
    graph.cleared += [
        weakref.ref(leaf)
        for leaf in leaves
        # (also one frozen since the forward: paddle still accumulates into it, helper-201's
        # FINDING 4)
        if leaf is not None and leaf.grad is None and node_ptr(leaf) in accumulating
    ]


_HALVES = frozenset({"paddle.float16", "paddle.bfloat16"})


def _clear_zeros(leaf: Any) -> None:
    if leaf is None:
        return
    grad = leaf.grad
    # (dense only: `any` of a sparse Embedding's SelectedRows gradient raised, or aborted the
    # process: helper-201's FINDING 2)
    if grad is None or not grad.is_dense():
        return
    if str(grad.dtype) in _HALVES:  # (paddle 3.3.1 has no CPU `any`: helper-213's FINDING 2)
        grad = grad.astype("float32")
    if not bool(grad.any()):
        leaf.clear_gradient(False)  # (False: None, not zeros)


def dead_slots(ptr: int, grads: Sequence[Any]) -> list[int]:
    """The slots of the identity node at `ptr`'s gradients that carry no gradient in the
    running Tensor.backward (`cut_off`): every one where only such edges reach the node (by
    the graph: whatever ops are between); else, for a node of several slots, zeros told, by
    data pointer, still all zeros (paddle sums a later edge's gradient into the first one's
    memory: a live gradient summed into told zeros is no longer zeros, unless it is exact
    zeros: helper-198's FINDING 1); none for a node of one slot that a live edge reaches
    (until 2026-12-07 a live gradient of exact zeros summed into told zeros was taken for
    none, and the module's parameters got None: helper-201's FINDING 1)."""
    graph = _state.graph
    if graph is None or not (graph.gone or graph.dead_gradients):
        return []
    if ptr in graph.gone:
        return [i for i, grad in enumerate(grads) if _has_values(grad)]
    told = graph.dead_gradients
    if len(grads) == 1 or not told:
        return []
    return [
        i
        for i, grad in enumerate(grads)
        if _has_values(grad) and int(grad.data_ptr()) in told and _none_only(grad)
    ]


def _has_values(grad: Any) -> bool:
    return grad is not None and grad._is_initialized() and bool(grad.size)


# The grad nodes (by name, paddle 3.3.1) whose kernels make NaN or inf of a zero gradient at
# some point (a derivative infinite there, or an infinite operand they saved: 0 * inf; a
# multiply's of ``x * log(x)`` at 0, helper-192's FINDING 3), each with one tensor an input
# slot; what `cut_off` gives zeros.
# `tests/test_paddle_no_gradient_slots.py::test_singular_nodes` checks each on the installed
# paddle.
SINGULAR = frozenset(
    {
        "AcosGradNode",
        "AcoshGradNode",
        "AsinGradNode",
        "Atan2GradNode",
        "AtanhGradNode",
        "DigammaGradNode",
        "DivideGradNode",
        "ElementwisePowGradNode",
        "ErfinvGradNode",
        "LayerNormGradNode",
        "LgammaGradNode",
        "Log10GradNode",
        "Log1pGradNode",
        "Log2GradNode",
        "LogGradNode",
        "LogitGradNode",
        "MatmulGradNode",
        "MultiplyGradNode",
        "PNormGradNode",
        "PolygammaGradNode",
        "PowGradNode",
        "ProdGradNode",
        "ReciprocalGradNode",
        "RsqrtGradNode",
        "SqrtGradNode",
    }
)


def _zeros_if_dead(
    zeroed: set[int],
    ptr: int,
    zeros: bool,
    told: dict[int, Any] | None,
    returned: list[list[Any]],
    outputs: Any,
    inputs: Any,
) -> Any:
    """A post hook of `cut_off`'s: where it found only the zeros reach the node in the
    backward this thread runs (`zeroed`: its graph's), zeros (`zeros`), told to the identity
    nodes below (`told`: the graph's `dead_gradients`), else the node's own gradients (one of
    a graph retained and run by another thread at once: helper-192's FINDING 2). Not the
    graph itself: the node would hold it, and through it the nodes. What it returns is a
    list of the graph's `returned` (`_given_back`)."""
    graph = _state.graph
    if graph is None or graph.zeroed is not zeroed or ptr not in zeroed:
        return outputs  # (paddle keeps it: a leak only where two threads run one graph)
    if told is not None:  # (its own zeros' signs are the op's: `no_gradient`'s)
        outputs = _zeros_out(outputs, inputs, told=True)
        graph.tell(outputs)
    elif zeros:
        outputs = _zeros_out(outputs, inputs)
    result = list(outputs)
    returned.append(result)
    return result


# paddle 3.3.1 keeps a reference to what a node's post hook returns, for good: the gradients
# in it, each the size of an input of the node, stayed alive after every backward that placed
# post hooks (an auxiliary head's output left out: 320 MB a thousand steps of a 64x256 model
# beside a global hook, helper-208's FINDING 1). The hooks return lists (`_zeros_if_dead`),
# emptied as the backward ends, and the reference paddle keeps is given back (measured once,
# as `_grad_fn_leak`; the empty list stays if it is not one).
_post_hook_leak: int | None = None


def _given_back(returned: list[list[Any]]) -> None:
    """The lists the post hooks of a backward that ended returned: emptied, paddle's
    reference given back."""
    global _post_hook_leak
    if not returned:
        return
    if _post_hook_leak is None:
        _post_hook_leak = _measure_post_hook_leak()
    lists = returned[:]
    returned.clear()
    for result in lists:
        result.clear()
        # (only one paddle took: an exception landing between a hook's record of its list
        # and its return, a Ctrl-C, kept it from paddle, helper-209's FINDING 1; ours: the
        # copy's, the loop's and the argument's)
        if _post_hook_leak == 1 and sys.getrefcount(result) == 4:
            ctypes.pythonapi.Py_DecRef(ctypes.py_object(result))


def _measure_post_hook_leak() -> int:
    import paddle

    result: list[Any] = []

    def hook(outputs: Any, inputs: Any) -> list[Any]:
        result.extend(outputs)
        return result

    with paddle.set_grad_enabled(True):
        x = paddle.ones([1])
        x.stop_gradient = False
        y = x * 2.0
        handle = grad_node(y)._register_post_hook(hook)
        y.sum().backward()
        handle.remove()
        del y, handle
    leak = sys.getrefcount(result) - 2  # (the local name and the argument)
    result.clear()
    return leak if leak in (0, 1) else -1


# The grad nodes (by name, paddle 3.3.1) whose zeros `cut_off` tells the identity nodes below:
# those of one tensor per slot that most often stand between a layer's output and its use (a
# post hook on a node with a list in a slot, a concat's, crashes: see `cut_off`); past any
# other, the identity takes the zeros for a gradient, as before.
# `tests/test_paddle_no_gradient_slots.py::test_telling_nodes` checks each on the installed
# paddle.
TELLING = SINGULAR | frozenset(
    {
        "AbsGradNode",
        "AddGradNode",
        "AmaxGradNode",
        "AminGradNode",
        "ArgsortGradNode",
        "AssignGradNode",
        "AtanGradNode",
        "BmmGradNode",
        "CastGradNode",
        "CeluGradNode",
        "ClipGradNode",
        "Conv2dGradNodeFinal",
        "CosGradNode",
        "CoshGradNode",
        "CumsumGradNode",
        "DivScaleGradNode",
        "DropoutGradNode",
        "EluGradNode",
        "ErfGradNode",
        "ExpGradNode",
        "ExpandAsGradNode",
        "ExpandGradNode",
        "FlattenGradNode",
        "FlipGradNode",
        "GatherGradNode",
        "GatherNdGradNode",
        "GeluGradNode",
        "HardsigmoidGradNode",
        "HardswishGradNode",
        "HardtanhGradNode",
        "IndexElementwiseGetGradNode",
        "IndexSelectGradNode",
        "KthvalueGradNode",
        "LeakyReluGradNode",
        "LogSoftmaxGradNode",
        "LogsigmoidGradNode",
        "LogsumexpGradNode",
        "MaskedFillGradNode",
        "MaxGradNode",
        "MaximumGradNode",
        "MeanAllGradNode",
        "MeanGradNode",
        "MedianGradNode",
        "MinGradNode",
        "MinimumGradNode",
        "MishGradNode",
        "ModeGradNode",
        "NearestInterpGradNode",
        "Pool2dGradNode",
        "PreluGradNode",
        "PutAlongAxisGradNode",
        "Relu6GradNode",
        "ReluGradNode",
        "RepeatInterleaveGradNode",
        "RepeatInterleaveWithTensorIndexGradNode",
        "ReshapeGradNode",
        "RollGradNode",
        "ScaleGradNode",
        "SeluGradNode",
        "SigmoidGradNode",
        "SignGradNode",
        "SiluGradNode",
        "SinGradNode",
        "SinhGradNode",
        "SliceGradNode",
        "SoftmaxGradNode",
        "SoftplusGradNode",
        "SoftsignGradNode",
        "SplitGradNode",
        "SplitWithNumGradNode",
        "SquareGradNode",
        "SqueezeGradNode",
        "StridedSliceGradNode",
        "SubtractGradNode",
        "SumGradNode",
        "SwishGradNode",
        "TakeAlongAxisGradNode",
        "TanGradNode",
        "TanhGradNode",
        "TanhShrinkGradNode",
        "TileGradNode",
        "TopkGradNode",
        "TransposeGradNode",
        "TrilGradNode",
        "TriuGradNode",
        "UnbindGradNode",
        "UnsqueezeGradNode",
        "ViewShapeGradNode",
        "WhereGradNode",
    }
)
# a PyLayer's grad node's name begins so (an identity node's: `GradNodePyLayer__UnihookIdentity`)
_PYLAYER = "GradNodePyLayer_"


def _zeros_out(outputs: Any, inputs: Any, told: bool = False) -> Any:
    """The node's gradients, zeros (`told`: `no_gradient`'s; one not computed, for an input
    that needs none, left as it is: None there raises)."""
    return tuple(
        out
        if out is None or not out._is_initialized()
        else no_gradient(out.shape, out.dtype)
        if told
        else _paddle().zeros_like(out)
        for out in outputs
    )


def no_gradient(shape: Any, dtype: Any) -> Any:
    """Zeros standing for no gradient, told (`cut_off`): negative zeros where the dtype has
    them (a float's), so that a live gradient of exact zeros paddle sums into their memory
    shows (-0.0 + 0.0 is 0.0: `dead_slots`; until 2026-12-07 it was taken for none, its
    hook saw None and the parameters below it got None: helper-198's FINDING 1,
    helper-203's FINDING 1)."""
    paddle = _paddle()
    kind = paddle.empty([0], dtype)
    if paddle.is_floating_point(kind):
        return paddle.full(shape, -0.0, dtype)
    if paddle.is_complex(kind):  # (-0.0 - 0.0j: helper-204's FINDING 2)
        part = paddle.full(shape, -0.0, paddle.real(kind).dtype)
        return paddle.complex(part, part)
    return paddle.zeros(shape, dtype)


def _none_only(grad: Any) -> bool:
    """Whether `grad`, told zeros (`no_gradient`), still holds them only: all zeros, and
    negative where its dtype has negative zeros (a live exact zero summed in made one 0.0;
    one of -0.0 does not show)."""
    if bool(grad.any()):
        return False
    paddle = _paddle()
    if grad.is_complex():
        return _negative(paddle.real(grad)) and _negative(paddle.imag(grad))
    return not grad.is_floating_point() or _negative(grad)


def _negative(grad: Any) -> bool:
    paddle = _paddle()
    if grad.dtype not in (paddle.float32, paddle.float64):
        grad = grad.astype("float32")  # (no sign kernel for halves on the CPU)
    return bool(paddle.signbit(grad).all())


def _paddle() -> Any:
    import paddle

    return paddle


def _running_graph() -> _Graph | None:
    state = _state
    if state.roots is None:
        return None
    if state.graph is None:
        state.graph = _Graph(state.roots)
    return state.graph


def receives_seen(ptr: int, stops: Container[str]) -> bool:
    """Whether the node at `ptr` may receive a gradient sharing memory with one user code can
    reach (a retained .grad, a tensor hook's argument): a node marked so is above it, with
    only nodes between that may pass on a view of their gradient or write their result over
    it (not in `stops`: kernels that write new memory even over an unreferenced view)."""
    if not _seen or not ptr:
        return False
    if ptr in _seen:
        return True  # (a hook on its own output: an identity node handing it out as it is)
    graph = _running_graph()
    if graph is None:
        return True
    if graph.tainted is None:  # once per backward: down from the marked nodes
        tainted: set[int] = set()
        with _lock:  # (another thread may mark meanwhile)
            marked = list(_seen)
        todo = [m for m in marked if m in graph.children]
        while todo:
            node = todo.pop()
            for child in graph.children[node]:
                if child and child not in tainted:
                    tainted.add(child)
                    if graph.names.get(child, "") not in stops:
                        todo.append(child)
        graph.tainted = tainted
    return ptr in graph.tainted


def obliged(ptr: int) -> bool:
    """Whether an identity node passed its gradients to the node at `ptr` without a copy, on
    the condition that this one keeps them safe in turn (`passes_on`)."""
    marked = _state.obliged
    return marked is not None and ptr in marked


# The walk of a graph costs about 4 us a node; a copy about 0.7 ns a float32 value. A backward
# walks its graph only when the values the nodes asked about in the previous backward
# (`_history`: that graph's size, those values) would have cost more to copy than the walk.
_VALUES_PER_NODE = 6000
_history = [0, 0]  # nodes in the last graph walked (0: none yet), values asked last backward


class Trust(NamedTuple):
    """The nodes `passes_on` trusts, by name."""

    identity: str  # unihook's identity nodes
    fresh: Container[str]  # kernels that write their results to new memory
    views: Container[str]  # nodes passing a view of their gradient on, writing nothing


def passes_on(ptr: int, held_until: int, trust: Trust, values: int) -> bool:
    """Whether the identity node at `ptr` may return the gradients a hook saw as they are:
    nothing in the running backward can change them afterwards. Each node they go to must get
    no other edge (no input buffer adds into them) and be no leaf's accumulation, and be
    - another identity node (named `trust.identity`), obliged to keep them safe in turn; or
    - a node passing a view of its gradient on without writing (`trust.views`), whose
      children are checked by the same rule; or
    - when the caller holds the gradients until the identity node at `held_until` ran (so no
      grad kernel finds them unreferenced and writes over them), a node above that one whose
      kernel writes its results to new memory (`trust.fresh`).
    `values`: how many values the gradients have (see `_history`)."""
    state = _state
    state.asked += values
    graph = state.graph
    if graph is None:
        if state.roots is None or state.declined or not ptr:
            return False
        nodes, asked = _history
        if nodes and asked < nodes * _VALUES_PER_NODE:
            state.declined = True  # (for this backward: the copies are cheaper)
            return False
        graph = _running_graph()
        if graph is None:
            return False
    children = graph.children.get(ptr)
    if children is None:
        return False
    mine: list[int] = []
    if not all(_keeps(graph, child, held_until, trust, mine) for child in children if child):
        return False
    if mine:
        if state.obliged is None:
            state.obliged = set()
        state.obliged.update(mine)
    return True


def _keeps(
    graph: _Graph,
    ptr: int,
    held_until: int,
    trust: Trust,
    mine: list[int],
) -> bool:
    """Whether the node at `ptr` leaves a gradient it receives unchanged (see `passes_on`)."""
    if graph.edges_in.get(ptr) != 1 or ptr in _seen:
        return False
    name = graph.names.get(ptr, "")
    if name == trust.identity:
        mine.append(ptr)
        return True
    if name in trust.views:
        # (a view is a new tensor: the caller's hold does not cover it)
        return all(_keeps(graph, child, 0, trust, mine) for child in graph.children[ptr] if child)
    return bool(held_until) and name in trust.fresh and graph.reaches(ptr, held_until)
