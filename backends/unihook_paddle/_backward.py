"""Module backward hooks for paddle 3.3.1, which has none: the shared emulation of
``unihook._module_backward`` over one ``PyLayer`` identity. (Paddle's develop branch adds native
Layer backward hooks with other details: no length check, flattened tensors instead of one slot
per argument. Switch to them only if the conformance suite passes unchanged.)

Each paddle trap is handled where it bites (numbers from ../shared/SEMANTICS.md §4):
1. a PyLayer forward may not return its input nor ``detach()`` ("can't use inplace strategy"):
   return ``view(shape)``, which shares memory;
2. inputs with stop_gradient=True: marking their outputs non-differentiable keeps them in
   ``ctx.non_differentiable``, a cycle through C++ that leaks the graph of a call whose
   backward never runs; they bypass the PyLayer instead, their gradient is zeros (inputs) or
   None (outputs), as torch's;
3. returning None for a differentiable input segfaults the next grad node: zeros instead
   (so what only an unused output reaches gets a zero gradient, where torch's is None), and
   the nodes only those zeros reach give zeros whatever their kernels make of them (a sqrt's
   at 0 makes NaN: ``guard.cut_off``);
5. a user ``register_hook`` on a PyLayer output has its return value ignored (paddle runs the
   hooks, and gives a retained .grad their result, but the PyLayer's backward the gradient as
   it was): a node with one output hands it out as it is, and the hooks registered on it are
   redirected (`_Node.redirect`, through the autograd guard's patch of `register_hook`) to
   record their result for the node's backward; a node with several outputs hands out a
   ``view`` of each (paddle exposes no output slot of a tensor to tell them apart);
6. an exception inside PyLayer.backward surfaces as OSError: stashed for the autograd guard.
   Paddle then keeps what it called (its bound ``backward``, so the context) and the gradients
   it passed, but keeps the node runnable: it calls ``_Backward``, an object of ours in the
   context holding the ``_Node`` only weakly, and gives back or empties what it keeps
   (``_kept_by_paddle``); a retried ``paddle.grad(retain_graph=True)`` runs the hooks again,
   as torch does;
7. a second backward through a PyLayer node that ``Tensor.backward`` already ran segfaults
   (retain_graph=True or not, ``paddle.grad`` too): each node is recorded as spent when it runs
   under ``Tensor.backward``; a gradient hook on the node raises BackendStateError before
   paddle touches a spent node in Tensor.backward, the autograd guard before a paddle.grad
   copies it (``_Node``);
8. the dispatchers stay last among the forward hooks (``_forward``: pinned);
and traps not listed there:
- paddle changes gradients in place after a node returned them (an input buffer adds into
  the first gradient it received, a leaf's .grad accumulates, grad kernels write over an
  incoming gradient nothing else references), so a gradient handed to a hook would change
  under the hook's feet after it ran: what goes back to paddle after the hooks saw it is a
  copy, unless the running backward's graph shows nothing can change it (``guard.passes_on``:
  on a chain of hooked modules, no copy at all);
- ``paddle.grad`` with respect to some of the inputs cuts a node's input slots that lead to none
  of them, then requires None there ("should return None at 1 position"), which a PyLayer's
  backward cannot see: the autograd guard predicts the cut slots (``guard.pruned``);
- ``view`` refuses a tensor of 0 elements (``_alias``).
"""

from __future__ import annotations

import ctypes
import math
import sys
import weakref
from functools import partial
from typing import Any, Callable, Collection, Iterable, Sequence, cast

import paddle
from paddle import _C_ops
from paddle.autograd import PyLayer

from unihook.backend import (
    Autograd,
    Dispatchers,
    ModuleBackward,
    Site,
    add_global_backward_hook,
    check_grad_like,
    check_kept_input,
    check_returned_input,
    held_tensors,
    kept_inputs,
    note_changes,
    register_backward_hook,
    show_value,
)
from unihook.errors import BackendStateError, HookReturnTypeError
from unihook.handles import Handle

from . import NAME
from . import _autograd_guard as guard
from ._forward import add_dispatchers
from ._global import PADDLE_CALL_CODE
from ._global import _dygraph_call_func as global_call
from ._ops import _is_tensor
from ._static import EagerUnderSOT

Grads = Sequence[Any]

_view_shape = _C_ops.view_shape
_Tensor: Any = paddle.Tensor  # (its private methods are not in paddle's stubs)
# `inplace_version` is a Python property over this C method
_inplace_version = _Tensor._inplace_version
_detach = _Tensor.detach


def _alias(x: Any) -> Any:
    """A new tensor sharing `x`'s memory (traps 1 and 5). ``view`` raises "cannot reshape
    tensor of 0 elements"; such a tensor has no memory to share: ``scale(x, 1)`` then, whose
    gradient node keeps no input (``as_strided``'s keeps `x`, and an in-place op on the result,
    `relu_` after a hooked layer on an empty batch, then failed its version check)."""
    shape = x.shape
    # (the C op `Tensor.view` ends in: its two Python decorators cost half as much again)
    return _view_shape(x, shape) if 0 not in shape else paddle.scale(x, 1.0)


class _Node:
    """One identity PyLayer node: what its backward needs, and trap 7. Registered as a gradient
    hook on the node, so it lives exactly as long as the node; the context holds it weakly, as
    paddle leaks the context of a backward that raised (trap 6)."""

    __slots__ = (
        "site",
        "ptr",
        "spent",
        "held_until",
        "on_backward",
        "shapes",
        "materialize",
        "integral",
        "inputs",
        "__weakref__",
    )
    on_backward: Callable[[Grads], Grads]  # these five are set by _UnihookIdentity.forward
    shapes: list[tuple[Any, Any]]
    materialize: bool
    integral: list[int]
    inputs: list[weakref.ref[Any]]  # (the input side's leaf tensors: `_leaves`)

    def __init__(self, site: Site, held_until: int) -> None:
        self.site = site
        self.ptr = 0
        self.spent = False
        # the identity node (its node_ptr) until whose backward the caller holds the gradients
        # this one returns (the core's input side of the same call), 0 for none
        self.held_until = held_until

    def redirect(self, hook: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """`hook`, registered on the node's one output (trap 5), recording what it leaves as
        the gradient for the node's backward in the same pass (`guard.replace`: the record
        goes with the pass, also when the node does not run there)."""

        def redirected(grad: Any) -> Any:
            result = hook(grad)
            if result is not None and not _is_tensor(result):
                # paddle would segfault converting it
                error = _TENSOR_SITE.error(
                    HookReturnTypeError,
                    "None or a paddle.Tensor like the gradient",
                    show_value(result),
                )
                guard.stash(error)
                raise error
            if not guard.replace(self, grad if result is None else result):
                # (every backward entry point is wrapped while an identity node lives: a
                # backward paddle runs some other way would drop the hook's result silently)
                error = self.site.error(
                    BackendStateError,
                    "a backward run through paddle's wrapped entry points (Tensor.backward, "
                    "paddle.autograd.backward, paddle.grad)",
                    "a gradient hook on the module's output running outside them",
                )
                raise error  # (not stashed: no wrapped entry point runs to re-raise it)
            return result

        return redirected

    def release(self) -> None:
        """Let go of what the call's backward needs (its state, the module): after a backward
        that raised where nothing can run the node again."""
        self.on_backward = partial(_released, self.site)

    def ran(self) -> None:
        """The node's backward ran: under Tensor.backward paddle now frees its context."""
        if not self.spent and guard.in_tensor_backward():
            self.spent = True
            # (the error factory must not hold `self`: the record lives until `self` dies)
            guard.spend(self.ptr, self, partial(_spent_error, self.site))

    def __call__(self, grad: Any) -> None:
        # The guard's graph walk catches a spent node before paddle runs; this is the backstop.
        if self.spent:
            error = _spent_error(self.site)
            guard.stash(error)
            raise error
        return None


def _release_raised(node: _Node) -> None:
    """`node` raised in a Tensor.backward without retain_graph: paddle keeps that graph for
    good (SEMANTICS §4.12), and its identity nodes held their calls' state, the module with it
    (a model kept alive by a hook that raised, 2026-12-07); no pass can go through what ran
    again (the nodes that ran freed their tensors). This one, those that ran, and the other
    side of a module call one of them is let go: not a call none of whose nodes ran, which
    another pass over a graph this one shares may run (``l2 = (h * 2).sum()`` beside:
    helper-183's FINDING 1). A function of its own: the raising frame, which the traceback
    holds, keeps none of them."""
    reached = [n for n in guard.identity_nodes_reached() if isinstance(n, _Node)]
    calls = {id(_call_of(n)) for n in (node, *reached) if n is node or n.spent}
    for other in reached:
        if other.spent or id(_call_of(other)) in calls:
            other.release()
    node.release()


def _leaves(node: _Node) -> Iterable[Any]:
    """The parameters of the module whose call the node is of (the core's call state names it:
    `Autograd.identity`), none for another node, and the leaf tensors the call was given."""
    module = getattr(_call_of(node), "module", None)
    parameters = module.parameters() if isinstance(module, paddle.nn.Layer) else []
    return [*parameters, *(ref() for ref in getattr(node, "inputs", ()))]


def _call_of(node: _Node) -> Any:
    """The object whose method the node's backward is (the core's call state), through
    `_Checked` and `_Bypass`; the node itself for another (a check of the core's)."""
    on_backward: Any = getattr(node, "on_backward", None)  # (unset: a node made, not run)
    while isinstance(on_backward, (_Checked, _Bypass)):
        on_backward = on_backward.on_backward
    return getattr(on_backward, "__self__", node)


def _released(site: Site, grads: Grads) -> Grads:
    raise site.error(
        BackendStateError,
        "a backward through a module call that a Tensor.backward without retain_graph "
        "already ran through, or raised in (paddle keeps such a graph for good: unihook let "
        "go of the call, which kept the model alive)",
        "another pass through that module call; run the forward again",
    )


def _spent_error(site: Site) -> BackendStateError:
    version = getattr(paddle, "__version__", "")
    return site.error(
        BackendStateError,
        f"one Tensor.backward per forward through a hooked module: paddle {version} "
        "frees a PyLayer's context after Tensor.backward, even with retain_graph=True, and "
        "segfaults on the next pass reaching it",
        "another backward or paddle.grad through a module call that Tensor.backward already "
        "ran through. Run the forward again, or use paddle.grad(..., retain_graph=True) for "
        "repeated passes over one graph",
    )


class _UnihookIdentity(PyLayer):  # (paddle names its node after it: see TRUST)
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        on_backward: Callable[[Grads], Grads],
        materialize: bool,
        node: _Node,
        *xs: Any,
    ) -> Any:
        # Every input needs grad (the others bypass the node, see PaddleAutograd.identity).
        node.on_backward = on_backward
        node.shapes = [(x.shape, x.dtype) for x in xs]
        node.materialize = materialize
        # integer and bool tensors: paddle sends them a gradient (its own through a cast,
        # `astype("int32")`), torch's identity none: the hooks see zeros, or None, where
        # torch's do; paddle gets its own on, as without hooks (helper-108's FINDING 5)
        node.integral = [
            i for i, x in enumerate(xs) if not (x.is_floating_point() or x.is_complex())
        ]
        # (a leaf given to the module, `x.grad`: None again where only zeros reach it; no
        # search finds a plain tensor, see `guard.cut_off`)
        node.inputs = [weakref.ref(x) for x in xs if x.is_leaf] if materialize else []
        if _orphans:
            _clear_orphans()
        # what paddle calls: an object of ours in the context's dict, not the bound method
        # paddle would make of `backward`, which it keeps (and the context) when it raises
        ctx.backward = _Backward(node)
        ctx.set_materialize_grads(materialize)
        return tuple(_alias(x) for x in xs)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:  # type: ignore[override]
        return ctx.backward(*grads)  # (a paddle that calls the class's backward, not ctx's)


class _Backward:
    """An identity node's backward, `ctx.backward` (trap 6)."""

    __slots__ = ("node",)

    def __init__(self, node: _Node) -> None:
        self.node = weakref.ref(node)

    def __call__(self, *grads: Any) -> Any:
        node = cast(_Node, self.node())  # alive: the node being run holds it
        try:
            return _backward(node, grads)
        except BaseException as error:
            # paddle turns it into OSError (trap 6): the guard re-raises this one
            guard.stash(error)
            if guard.graph_freed():
                _release_raised(node)
            _kept_by_paddle(self, grads)
            raise  # with retain_graph, paddle keeps the context: a retry runs the hooks again


# Paddle 3.3.1 keeps two references when a PyLayer's backward raises (GradNodePyLayer throws
# before dropping them): to what it called, `ctx.backward` (its bound method kept the context,
# and the model with it before `_release_raised`), and to the tuple of gradients it passed,
# which holds Python tensors of the gradients' size (95 KB a step of a 64x256 model whose hook
# raised: helper-210's FINDING 1). Both are measured once (as the guard's `grad_fn` leak). The
# first is given back; the tuple cannot be, so its tensors are emptied (`Tensor._clear`, which
# drops this Python object's share of the gradient) once nothing else holds them: the
# traceback, or the user's hook, may still, also weakly (an emptied tensor read through a weak
# reference was empty, and arithmetic on it segfaulted: helper-211's FINDING 1);
# `_clear_orphans`, at the next hooked call or raise.
# (of ctx.backward: 1, or 0; the references to an orphan only paddle holds, `_references`, or
# -1 where paddle keeps no gradient or the count is not plain)
_raise_leaks: tuple[int, int] | None = None
_orphans: list[Any] = []
_MAX_ORPHANS = 4096  # (past it, the oldest a user still holds stay held by paddle for good)


def _kept_by_paddle(backward: _Backward, grads: Grads) -> None:
    global _raise_leaks, _orphans
    if _raise_leaks is None:
        _raise_leaks = _measure_raise_leaks()
    called, alone = _raise_leaks
    if called == 1:
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(backward))  # (the context holds it too)
    if alone > 0:
        if _orphans:  # (a retried paddle.grad raising again: those of the last tries wait no
            _clear_orphans()  # more for a hooked forward, helper-213's FINDING 4)
        _orphans = [*_orphans, *(g for g in grads if _is_tensor(g))][-_MAX_ORPHANS:]


def _clear_orphans() -> None:
    global _orphans
    _, alone = _raise_leaks or (0, -1)
    # (swapped, not changed in place: another thread may be adding to it)
    orphans, _orphans = _orphans, []
    kept = []
    for i in range(len(orphans)):
        if _references(orphans, i) <= alone and not weakref.getweakrefcount(orphans[i]):
            orphans[i]._clear()
        else:
            kept.append(orphans[i])
    _orphans = [*kept, *_orphans][-_MAX_ORPHANS:]


def _references(tensors: list[Any], i: int) -> int:
    """The references to ``tensors[i]``, counted as `_clear_orphans` counts them (the list's and
    the argument's among them): compared with the probe's (`_measure_raise_leaks`)."""
    return sys.getrefcount(tensors[i])


class _Probe(PyLayer):
    @staticmethod
    def forward(ctx: Any, x: Any, backward: Callable[..., Any]) -> Any:  # type: ignore[override]
        ctx.backward = backward
        return _alias(x)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:  # type: ignore[override]
        return ctx.backward(grad)


def _measure_raise_leaks() -> tuple[int, int]:
    """What paddle keeps when a PyLayer's backward raised: the references to `ctx.backward` (1
    on paddle 3.3.1; 0 for none or a count that is not plain) and `_references` of a gradient it
    passed that only it holds (-1 where it keeps none, or the count is not plain)."""
    passed: list[Any] = []

    def backward(grad: Any) -> Any:
        passed.append(grad)
        raise _ProbeError

    with paddle.set_grad_enabled(True):
        x = paddle.ones([1])
        x.stop_gradient = False
        loss = _Probe.apply(x, backward).sum()
    before = sys.getrefcount(backward)
    try:
        guard.unguarded_backward(loss)  # (the guard would re-raise the error stashed now)
    except OSError:
        pass
    called = sys.getrefcount(backward) - before
    if called == 1:
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(backward))
    if not passed:
        return (called if called in (0, 1) else 0), -1
    control = [paddle.ones([1])]
    alone = [passed.pop()]
    # (one more than a tensor only the list holds: paddle's tuple's)
    kept = _references(alone, 0) - _references(control, 0)
    return (called if called in (0, 1) else 0), (_references(alone, 0) if kept == 1 else -1)


class _ProbeError(Exception):
    """Raised by `_measure_raise_leaks`'s PyLayer."""


_TENSOR_SITE = Site("tensor", NAME, "Tensor")


def _backward(node: _Node, grads: Grads) -> tuple[Any, ...]:
    if guard.unneeded(node.ptr):
        # a paddle.grad none of whose inputs is below: torch runs no such node, and its hooks
        # do not fire (until 2026-12-07 a full hook fired, w.r.t. the parameters alone, on a
        # call whose input is the model's: helper-207's FINDING 6)
        # (zeros below: a None there crashes paddle, trap 3; no input of it needs them)
        node.ran()
        zeros = tuple(paddle.zeros(shape, dtype) for shape, dtype in node.shapes)
        for zero in zeros:
            zero.stop_gradient = not guard.building_graph()  # (see `constant` below)
        return zeros
    # the slots whose zeros only an outer identity's slot with no gradient sent: none, as in
    # torch (`guard.cut_off`; told by their memory, before any copy)
    unreached = guard.dead_slots(node.ptr, grads)
    replaced = guard.replacement(node)
    if replaced is not None:
        unreached = []  # (a hook of the user's on the output gave its gradient)
        ((shape, dtype),) = node.shapes
        tensor_type = "paddle.Tensor"
        grads = (check_grad_like(replaced, shape, dtype, tensor_type, _is_tensor, _TENSOR_SITE),)
    if guard.receives_seen(node.ptr, STOPS):
        # maybe a view of a retained .grad (user code may zero it in place; torch's
        # retain_grad keeps a copy): the hooks get their own
        grads = tuple(None if g is None else g.clone() for g in grads)
    if unreached:  # (shown as paddle shows a slot with no gradient: zeros where it materializes)
        grads = tuple(
            (paddle.zeros(*node.shapes[i]) if node.materialize else None) if i in unreached else g
            for i, g in enumerate(grads)
        )
    came = grads
    if node.integral:
        shown = list(grads)
        for i in node.integral:
            shape, dtype = node.shapes[i]
            shown[i] = paddle.zeros(shape, dtype) if node.materialize else None
        grads = tuple(shown)
    results = node.on_backward(grads)
    node.ran()
    exposed = results is not grads
    # A constant zero for a double backward makes paddle's double-grad nodes behind it
    # (a Linear's) fail with "MetaTensor is not initialized": a zero in the graph does not.
    constant = not guard.building_graph()
    # Paddle may change a gradient in place after it left the node: one a hook saw (and may
    # keep, as torch allows), here or in an identity node that passed it on uncopied, goes
    # back as a copy unless nothing in this backward can change it (see the module doc).
    copy = exposed or guard.obliged(node.ptr)
    if copy and constant:
        values = _values(results)
        if values >= _CHECK_FROM:
            copy = not guard.passes_on(node.ptr, node.held_until, TRUST, values)
    pruned = guard.pruned(node.ptr)
    out = []
    dead: list[int] = []  # (told below: `guard.cut_off`)
    untold: list[int] = []
    for i, (result, (shape, dtype)) in enumerate(zip(results, node.shapes)):
        if exposed and grads[i] is None and result is not None:
            _check_slot(result, shape, dtype, node)
        if i in node.integral:
            result = came[i]
        if i in pruned:
            out.append(None)
        elif result is None or (i in unreached and result is came[i] and not node.materialize):
            # no gradient below, as torch's: an output with none (unused, or told so), a
            # full hook's None for an input; not a pre-hook's None for one that had one
            # (torch's BackwardHook gives the module's backward zeros there)
            none = node.materialize or came[i] is None
            zeros = guard.no_gradient(shape, dtype) if none else paddle.zeros(shape, dtype)
            zeros.stop_gradient = constant
            out.append(zeros)
            (dead if none else untold).append(i)
        else:
            out.append(result.clone() if copy else result)
    # (what only the zeros reach gives zeros: trap 3)
    # (the module's parameters only the zeros reach keep None)
    if dead:
        guard.cut_off(node.ptr, dead, [out[i] for i in dead], partial(_leaves, node))
    if untold:
        guard.cut_off(node.ptr, untold)
    return tuple(out)


# The grad nodes (by name, paddle 3.3.1) whose kernels write every gradient they return to new
# memory when their incoming gradient is referenced elsewhere (held): none returns a view of it
# (reshape's, flatten's, transpose's, a cast's to the same dtype do).
# `tests/test_paddle_copies.py::test_fresh_nodes_return_new_memory` checks each on the installed
# paddle.
FRESH = frozenset(
    {
        "AddGradNode",
        "BatchNormGradNode",
        "ConcatGradNode",
        "Conv2dGradNodeFinal",
        "DepthwiseConv2dGradNode",
        "DivideGradNode",
        "DropoutGradNode",
        "ExpGradNode",
        "GeluGradNode",
        "HardswishGradNode",
        "LayerNormGradNode",
        "LeakyReluGradNode",
        "MatmulGradNode",
        "MeanGradNode",
        "MultiplyGradNode",
        "Pool2dGradNode",
        "Relu6GradNode",
        "ReluGradNode",
        "ScaleGradNode",
        "SigmoidGradNode",
        "SiluGradNode",
        "SoftmaxGradNode",
        "SubtractGradNode",
        "SumGradNode",
        "TanhGradNode",
    }
)
# Those of FRESH whose kernels write their result over an incoming gradient nobody references,
# even a view of one somebody does (a retained .grad that a view node below passed on): what
# they return may then be that memory.
# `tests/test_paddle_copies.py::test_reusing_nodes_write_over_a_view` checks each.
REUSES = frozenset(
    {
        "AddGradNode",
        "ExpGradNode",
        "HardswishGradNode",
        "LeakyReluGradNode",
        "Relu6GradNode",
        "ReluGradNode",
        "SigmoidGradNode",
        "SiluGradNode",
        "SubtractGradNode",
        "TanhGradNode",
    }
)
STOPS = FRESH - REUSES  # where a gradient user code can reach stops reaching further down
# The grad nodes that pass a view of their gradient on and write nothing: `_alias`'s.
VIEWS = frozenset({"ViewShapeGradNode"})
TRUST = guard.Trust(f"GradNodePyLayer_{_UnihookIdentity.__name__}", FRESH, VIEWS)


# Whether a gradient can go on uncopied takes a walk of the running backward's graph (once,
# see `guard.passes_on`) and a look around the node (some us): asked only for gradients whose
# copy costs more. Small ones are copied without asking.
_CHECK_FROM = 1 << 16  # values in the node's gradients (256 KB of float32)


def _values(results: Grads) -> int:
    # (a hook's wrong value for a slot is reported below, by _check_slot)
    return sum(math.prod(r.shape) for r in results if _is_tensor(r))


class _Aliases(list):  # type: ignore[type-arg]
    """What `identity` returns: the tensors, the node's node_ptr (`held_until`), the node
    (`_Node`) and the positions of the tensors that went through it (`live`)."""

    __slots__ = ("node", "owner", "live")


class _Checked:
    """An identity node's `on_backward` with checks before it, each run when the gradient of
    its slot (among the node's live ones) is there."""

    __slots__ = ("checks", "on_backward")

    def __init__(self, on_backward: Callable[[Grads], Grads]) -> None:
        self.checks: list[tuple[int, Callable[[Grads], Grads]]] = []
        self.on_backward = on_backward

    def __call__(self, grads: Grads) -> Grads:
        for slot, check in self.checks:
            if grads[slot] is not None:
                check(grads)
        return self.on_backward(grads)


def _check_slot(result: Any, shape: Any, dtype: Any, node: _Node) -> None:
    """A hook's value for a slot whose gradient was None (an unused output) is checked only
    here: paddle would take a wrong dtype silently, and give a float an OSError."""
    # the output side (materialize=False) carries the pre-hooks' values
    site = node.site._replace(kind="full_backward" if node.materialize else "full_backward_pre")
    check_grad_like(result, tuple(shape), dtype, "paddle.Tensor", _is_tensor, site)


class _Rebase(PyLayer):
    """`original` takes `alias`'s history: a PyLayer that returns its input is paddle's
    in-place form; no data moves (they share memory) and the gradient goes to `alias`. Its
    `_Node` keeps it from trap 7 as an identity node's (a second Tensor.backward through
    `original` segfaulted); a PyLayer, not paddle's own `assign_out_`, whose node has no
    double grad (create_graph)."""

    @staticmethod
    def forward(ctx: Any, node: _Node, original: Any, alias: Any) -> Any:  # type: ignore[override]
        ctx.node = weakref.ref(node)
        return original

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:  # type: ignore[override]
        node = ctx.node()
        if node is not None:
            node.ran()
        return None, grad


class _Bypass:
    """`on_backward` for an identity that only some of the tensors go through: the others get
    zeros (`materialize`) or None, and only the live ones' results go back."""

    __slots__ = ("on_backward", "n", "live", "dead")

    def __init__(
        self,
        on_backward: Callable[[Grads], Grads],
        tensors: Sequence[Any],
        live: list[int],
        materialize: bool,
    ) -> None:
        self.on_backward = on_backward
        self.n = len(tensors)
        self.live = live
        # what the other tensors' gradients are: (index, shape, dtype) when zeros
        self.dead = [
            (i, t.shape, t.dtype) if materialize else (i, None, None)
            for i, t in enumerate(tensors)
            if i not in live
        ]

    def __call__(self, grads: Grads) -> Grads:
        full: list[Any] = [None] * self.n
        for i, g in zip(self.live, grads):
            full[i] = g
        for i, shape, dtype in self.dead:
            if shape is not None:
                full[i] = paddle.zeros(shape, dtype)
        results = self.on_backward(full)
        if results is full:
            return grads  # nobody saw them: no copies needed
        return [results[i] for i in self.live]


def _span(tensor: Any) -> tuple[int, int]:
    """The bytes `tensor` covers, first and one past the last (`strides` count elements)."""
    size = tensor.element_size()
    low = high = 0
    for n, stride in zip(tensor.shape, tensor.strides):
        reach = (n - 1) * stride * size
        low, high = (low + reach, high) if reach < 0 else (low, high + reach)
    start = int(tensor.data_ptr())
    return start + low, start + high + size


def _held(module: Any, tensor: Any) -> bool:
    return any(t is tensor for _, t in held_tensors(module, _is_tensor))


class PaddleAutograd(Autograd):
    backend = NAME
    own_modules = "paddle.nn."  # (see Autograd: their forward reads no user tensor)
    # paddle's own, and the copy that runs while unihook has global hooks
    # paddle's (the attribute may hold unihook's patch by now) and the patch
    call_codes = frozenset({PADDLE_CALL_CODE, global_call.__code__})
    is_tensor = staticmethod(_is_tensor)

    @staticmethod
    def grad_enabled() -> bool:
        return bool(paddle.is_grad_enabled())

    @staticmethod
    def requires_grad(tensor: Any) -> bool:
        return not tensor.stop_gradient

    @staticmethod
    def identity(
        tensors: Sequence[Any],
        on_backward: Callable[[Grads], Grads],
        materialize: bool,
        site: Site,
        held_until: object = None,
    ) -> Sequence[Any]:
        node = _Node(site, held_until if isinstance(held_until, int) else 0)
        # Some tensor needs grad (the caller checks). Those that don't bypass the node (trap 2).
        live = [i for i, t in enumerate(tensors) if not t.stop_gradient]
        if len(live) < len(tensors):
            on_backward = _Bypass(on_backward, tensors, live, materialize)
        outs = _UnihookIdentity.apply(on_backward, materialize, node, *[tensors[i] for i in live])
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        node.ptr = guard.node_ptr(outs[0])
        guard.register_unseen(outs[0], node)
        result = _Aliases(tensors)
        if len(live) > 1:
            guard.several_slots(node.ptr, node)
            guard.hold(node, identity=True)  # the guard must outlive the node (trap 7)
            for i, o in zip(live, outs):
                result[i] = _alias(o)  # (trap 5)
        else:
            guard.hold(node, identity=True, redirect=node.ptr)  # (trap 5, and as above)
            result[live[0]] = outs[0]
        result.node, result.owner, result.live = node.ptr, node, live
        return result

    @staticmethod
    def guard(tensor: Any, error: Callable[[], Exception], site: Site) -> Any:
        # one more identity node (kept safe from trap 7 as the others), watching a detached
        # alias: it shares `tensor`'s memory and version counter, not its history (no cycle)
        watched, version = tensor.detach(), _inplace_version(tensor)

        def check(grads: Grads) -> Grads:
            if _inplace_version(watched) != version:
                raise error()
            return grads  # (the same list: no copies)

        return PaddleAutograd.identity([tensor], check, False, site)[0]

    @staticmethod
    def watch_inputs(
        args: Sequence[Any],
        tensor_idx: Sequence[int],
        originals: Sequence[Any],
        module: Any,
        site: Site,
        *,
        replaced: bool = False,
        returned: Collection[int] = (),
    ) -> None:
        # (`replaced` is torch's: paddle has no backward hooks of its own)
        for alias, original in kept_inputs(
            args, tensor_idx, originals, returned, module, PaddleAutograd
        ):
            check_kept_input(
                alias,
                original,
                site,
                identity=PaddleAutograd.identity,
                rebase=PaddleAutograd.rebase,  # (its counter stays: see there)
                node_of=guard.node_ptr,
                version=_inplace_version,
                counter_of=_detach,  # (a detached alias shares the counter, not the history)
                caller_side=not original.is_leaf,  # (paddle refuses in-place ops on a leaf)
                leaf=original.is_leaf,  # (the kept alias is checked in its place)
            )

    @staticmethod
    def watch(
        replaced: list[Any],
        aliases: Sequence[Any],
        outputs: Sequence[Any],
        idx: Sequence[int],
        args: Sequence[Any],
        tensor_idx: Sequence[int],
        originals: Sequence[Any],
        site: Site,
        mark: object,
        module: Any,
        result: Any,
    ) -> None:
        # (a hooked call's end: the checks of earlier calls note what changed while it lives)
        note_changes()
        # An input returned unchanged (an identity, eval-mode Dropout) reaches the caller as
        # the output identity's alias, whose later uses would miss the caller's in-place op on
        # its tensor: the output node checks it (`check_returned_input`), no node more.
        node: _Node | None = getattr(aliases, "owner", None)
        live: list[int] = getattr(aliases, "live", [])
        if node is None:
            return
        for p, j in enumerate(idx):
            for k, i in enumerate(tensor_idx):
                if outputs[j] is not args[i]:
                    continue
                original = originals[k]
                if (
                    original is not None
                    and replaced[j] is not original  # (changed in forward: the caller's own)
                    and p in live
                    and not original.stop_gradient
                ):
                    if not isinstance(node.on_backward, _Checked):
                        node.on_backward = _Checked(node.on_backward)
                    slot = live.index(p)
                    alias = args[i]
                    # the input alias forward got, kept with the output (`self.kept = h;
                    # return h`): a third name of the one tensor
                    kept = (
                        alias is not original
                        and not type(module).__module__.startswith(PaddleAutograd.own_modules)
                        and _held(module, alias)
                    )
                    for other in (original, alias) if kept else (original,):
                        check = check_returned_input(
                            replaced[j],
                            other,
                            site,
                            node_of=guard.node_ptr,
                            version=_inplace_version,
                            counter_of=_detach,
                            kept=other is alias,
                        )
                        node.on_backward.checks.append((slot, check))
                    if kept:  # ... whose own later uses are checked against the output
                        check_kept_input(
                            alias,
                            replaced[j],
                            site,
                            identity=PaddleAutograd.identity,
                            rebase=PaddleAutograd.rebase,
                            node_of=guard.node_ptr,
                            version=_inplace_version,
                            counter_of=_detach,
                            caller_side=False,
                        )
                break

    @staticmethod
    def overlaps(a: Any, b: Any) -> bool:
        if a is b:
            return True
        if 0 in a.shape or 0 in b.shape or not a._is_shared_buffer_with(b):
            return False
        (a0, a1), (b0, b1) = _span(a), _span(b)
        return a0 < b1 and b0 < a1

    @staticmethod
    def memory_key(tensor: Any) -> int | None:
        # where its values start: paddle refuses an in-place op on a leaf alone, not on a view
        # (`0 in shape`, not `size`: paddle's `size` costs some us, a numpy product)
        return None if 0 in tensor.shape else int(tensor.data_ptr())

    @staticmethod
    def leaf_of(tensor: Any) -> Any:
        return tensor if tensor.is_leaf else None  # (paddle allows in-place ops on a view)

    @staticmethod
    def refused_like(output: Any, leaf: Any) -> bool:
        return bool(
            0 not in output.shape
            and output._is_shared_buffer_with(leaf)
            and output.shape == leaf.shape
            and output.data_ptr() == leaf.data_ptr()
            and output.strides == leaf.strides
        )

    version = staticmethod(_inplace_version)

    @staticmethod
    def rebase(original: Any, alias: Any, site: Site) -> Any:
        if alias.stop_gradient:
            # same memory and version counter (a view): only a new shape to carry (`squeeze_`)
            if original.shape != alias.shape:
                original._set_impl(alias)
            return original
        if original.is_leaf and not original.stop_gradient:
            # paddle's own error for it is a ValueError ("Leaf Var ... can't use inplace")
            raise ValueError(
                "a leaf Tensor that requires grad was modified in place in forward: paddle "
                "forbids in-place ops on it (the module hooked by unihook saw an alias)"
            )
        # The in-place node bumps the version counter, which `original` shares with `alias` and
        # every other alias of it, and paddle cannot set a counter back: tensors forward saved
        # from `alias` (relu_'s output) would fail their check. So the node runs while
        # `original` stands on a tensor of its own (same memory, its own counter), then
        # `original` goes back to its own tensor, history kept (it lives outside the tensor).
        # (`detach()`: the same tensor, history apart; `paddle.Tensor()` leaks a list per
        # call in paddle 3.3.1)
        own = original.detach()
        fresh = paddle.empty(alias.shape, alias.dtype)
        # (nothing reads `fresh` while it stands in: any layout, a strided one too, which
        # `_share_buffer_to` refuses)
        alias._unsafe_share_buffer_to(fresh)
        original._set_impl(fresh)
        node = _Node(site, 0)
        try:
            _Rebase.apply(node, original, alias)
        finally:
            # a shape or dtype forward changed in place (`squeeze_`, `add_` promoting float16,
            # `exp_` of integers) stays: `original` is `alias`'s tensor then (paddle cannot
            # change either in place without another tensor)
            same = own.shape == alias.shape and own.dtype == alias.dtype
            original._set_impl(own if same else alias)
        node.ptr = guard.node_ptr(original)
        guard.register_unseen(original, node)  # (the backstop of trap 7, as the identity's)
        guard.hold(node)
        return original

    @staticmethod
    def add_dispatchers(layer: Any, pre: Any, post: Any) -> Dispatchers:
        # paddle.jit.to_static: the dispatchers run outside SOT (see ._static)
        pre, post = EagerUnderSOT(pre), EagerUnderSOT(post)
        # pinned last in the layer's own hook dicts (``_forward``), whoever registers after them
        dispatchers = add_dispatchers(layer, pre, post)
        guard.hold(pre)
        return dispatchers


_AUTOGRAD = PaddleAutograd()


def register(
    layer: Any, kind: str, hook: Callable[..., Any], prepend: bool, name: str | None
) -> Handle:
    handle = register_backward_hook(_AUTOGRAD, layer, kind, hook, prepend, name)

    def remove() -> None:
        handle.remove()
        guard.sweep()  # (the dispatchers it held the guard for may be gone)

    return Handle(handle.backend, handle.kind, remove)


class _GlobalDispatchers:
    """The global backward dispatchers: the last forward hooks of every layer (``_global``)."""

    __slots__ = ("_remove",)

    def __init__(self, state: ModuleBackward) -> None:
        from ._global import add_dispatchers

        pre, post = EagerUnderSOT(state.pre_dispatch), EagerUnderSOT(state.post_dispatch)
        self._remove = add_dispatchers(pre, post)

    def remove(self) -> None:
        self._remove()


def add_global(kind: str, hook: Callable[..., Any]) -> Callable[[], None]:
    return add_global_backward_hook(_AUTOGRAD, kind, hook, _GlobalDispatchers)
