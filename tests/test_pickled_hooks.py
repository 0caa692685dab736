"""A module carrying hooks registered with `when` (and DropHook's) pickles, as one carrying the
same functions registered natively does (``torch.save(model)``, a checkpoint of the whole
model): until 2026-12-04 the `when` wrapper and DropHook's hooks were closures, and pickling
raised "Can't pickle local object". The loaded copy's hooks keep their `when`."""

from __future__ import annotations

import functools
import os
import pickle
from collections import OrderedDict
from typing import Any

import pytest
from children import last_value, run_code

import unihook
from unihook.recipes import DropHook

CALLS: list[str] = []


def record(module: Any, args: Any, output: Any) -> None:
    CALLS.append(type(module).__name__)


def frozen(module: Any) -> bool:
    return getattr(module, "frozen", False)


def _model(framework: str) -> Any:
    if framework == "torch":
        import torch.nn as nn

        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    import paddle.nn as nn

    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _batch(framework: str) -> Any:
    if framework == "torch":
        import torch

        return torch.ones(64, 4)
    import paddle

    return paddle.ones([64, 4])


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_hooks_registered_with_when_pickle_and_keep_their_when(framework: str) -> None:
    pytest.importorskip(framework)
    model = _model(framework)
    unihook.register_forward_hook(model[0], record, when="train")
    unihook.register_forward_hook(model[1], record, when="eval")
    unihook.register_forward_hook(model[2], record, when=frozen)
    copy = pickle.loads(pickle.dumps(model))
    x = _batch(framework)
    seen = []
    for training, is_frozen in ((True, False), (False, False), (False, True)):
        copy.train() if training else copy.eval()
        copy[2].frozen = is_frozen
        CALLS.clear()
        copy(x)
        seen.append(list(CALLS))
    assert seen == [["Linear"], ["ReLU"], ["ReLU", "Linear"]]


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_a_model_carrying_drop_hook_pickles(framework: str) -> None:
    pytest.importorskip(framework)
    model = _model(framework)
    DropHook(model, "1", 0.5)
    copy = pickle.loads(pickle.dumps(model))
    outputs: list[Any] = []
    unihook.register_forward_hook(copy[1], lambda module, args, output: outputs.append(output))
    x = _batch(framework)
    fractions = []
    for training in (True, False):
        copy.train() if training else copy.eval()
        copy(x)
        values = outputs[-1].detach().numpy() if framework == "torch" else outputs[-1].numpy()
        fractions.append(float((values == 0).mean()))
    relu_zeros = fractions[1]  # (in eval: no drop)
    # a value is zero in training if the ReLU made it so or the drop (p=0.5) did
    assert abs(fractions[0] - (0.5 + 0.5 * relu_zeros)) < 0.1, fractions


def test_a_pickled_paddle_layers_hook_dicts_iterate_a_snapshot() -> None:
    """paddle iterates a layer's live hook dict in its call: the loaded copy's dicts are
    `SnapshotDict`s, so a hook registering another during the call (a recipe's placing, with
    `every` > 1) works as on torch, and native handles still remove their hooks."""
    pytest.importorskip("paddle")
    model = _model("paddle")
    unihook.register_forward_hook(model, record)
    copy = pickle.loads(pickle.dumps(model))
    assert type(copy._forward_post_hooks).__name__ == "SnapshotDict"
    added: list[Any] = []

    def adder(layer: Any, args: Any, output: Any) -> None:
        if not added:
            added.append(layer.register_forward_post_hook(record))

    handle = copy.register_forward_post_hook(adder)
    x = _batch("paddle")
    CALLS.clear()
    copy(x)
    copy(x)
    assert CALLS == ["Sequential"] * 3  # (the added hook from the second call on)
    added[0].remove()
    handle.remove()
    CALLS.clear()
    copy(x)
    assert CALLS == ["Sequential"]


def test_a_pickled_paddle_layers_hooks_refuse_a_full_graph_build() -> None:
    """paddle.jit.to_static(full_graph=True) is refused on a layer with unihook's hooks
    (they would run once, with symbolic values); on a loaded copy the dicts are SnapshotDicts,
    which ran the hooks in the build silently (helper-117's FINDING 1): the same error now,
    naming the layer."""
    pytest.importorskip("paddle")
    import copy as copies

    import paddle

    model = _model("paddle")
    unihook.register_forward_hook(model[0], record)
    loaded = pickle.loads(pickle.dumps(model))
    deep = copies.deepcopy(model)  # (until 2026-12-04 without the check: helper-123's F4)
    unihook.register_forward_hook(loaded[1], record)  # (a HookDict over a SnapshotDict)
    others = (copies.deepcopy(loaded), pickle.loads(pickle.dumps(deep)))
    for layer in (model, loaded, deep, *others):
        static = paddle.jit.to_static(layer, full_graph=True)
        with pytest.raises(unihook.UnsupportedHookError, match="forward hook on Linear"):
            static(_batch("paddle"))


_SAVE_AND_LOAD = r"""
import pickle, sys
framework, path, step, how, tests = sys.argv[1:6]
sys.path.insert(0, tests)
if framework == "torch":
    import torch as fw, torch.nn as nn
    x = fw.ones(1, 2)
else:
    import paddle as fw, paddle.nn as nn
    x = fw.ones([1, 2])
import unihook
from test_pickled_hooks import named

def pre(m, hook, **options):
    if how == "unihook":
        return unihook.register_forward_pre_hook(m, hook, **options)
    return m.register_forward_pre_hook(hook, **options)

def post(m, hook):
    if how == "unihook":
        return unihook.register_forward_hook(m, hook)
    return (m.register_forward_hook if framework == "torch" else m.register_forward_post_hook)(hook)

if step == "save":
    m = nn.Linear(2, 2)
    pre(m, named("saved pre"))
    if framework == "torch":  # (paddle has no keyword pre-hooks)
        pre(m, named("saved kwargs pre", kwargs=True), with_kwargs=True)
    post(m, named("saved post"))
    with open(path, "wb") as f:
        pickle.dump(m, f)
else:
    with open(path, "rb") as f:
        m = pickle.load(f)
    # a fresh process: its handle ids start where the saving one's did
    pre(m, named("new pre"))
    post(m, named("new post"))
    try:
        m(x)
        print(repr(named.calls))
    except TypeError as e:
        print(repr(type(e).__name__))
"""


class _Named:
    """Hooks that say their name as they run (module-level: they pickle by reference)."""

    calls: list[str] = []

    def __call__(self, name: str, kwargs: bool = False) -> Any:
        return functools.partial(_say_kwargs if kwargs else _say, name)


def _say(name: str, module: Any, *rest: Any) -> None:
    _Named.calls.append(name)


def _say_kwargs(name: str, module: Any, args: Any, kwargs: Any) -> None:
    _Named.calls.append(name)


named = _Named()


def _loaded_calls(framework: str, how: str, path: str) -> Any:
    tests = os.path.dirname(os.path.abspath(__file__))
    saved = run_code(_SAVE_AND_LOAD, framework, path, "save", how, tests)
    assert saved.returncode == 0, saved.stderr
    return last_value(run_code(_SAVE_AND_LOAD, framework, path, "load", how, tests))


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_hooks_registered_after_a_load_keep_the_loaded_ones(framework: str, tmp_path: Any) -> None:
    """A process loading a pickled module counts handle ids from 0, like the one that saved it:
    a hook registered after the load drew a loaded hook's id and replaced it silently, or took
    its ``with_kwargs`` flag and raised TypeError (helper-117's FINDING 4; torch and paddle do
    so with their own pickled hooks). Where unihook's hook dict is what pickles (paddle, a
    layer with unihook's hooks), the counter moves past the loaded ids as it loads; where the
    framework's plain dict does (torch), unihook's registration draws past its keys
    (`new_key`; until 2026-12-04 torch's loaded hooks were replaced, as by torch's own)."""
    pytest.importorskip(framework)
    got = _loaded_calls(framework, "unihook", str(tmp_path / "unihook.pkl"))
    native = _loaded_calls(framework, "native", str(tmp_path / "native.pkl"))
    if framework == "paddle":
        assert got == ["saved pre", "new pre", "saved post", "new post"]
        assert native == ["new pre", "new post"]  # (paddle's own: the loaded hooks replaced)
    else:
        assert got == ["saved pre", "saved kwargs pre", "new pre", "saved post", "new post"]
        # (torch's own: "new pre" drew "saved pre"'s id)
        assert native == ["new pre", "saved kwargs pre", "saved post", "new post"]


# the child programs' start: a framework, its input needing grad, its forward hook method
_CHILD = r"""
import pickle, sys
framework, path, step, tests = sys.argv[1:5]
sys.path.insert(0, tests)
if framework == "torch":
    import torch as fw, torch.nn as nn
    x = fw.ones(1, 2, requires_grad=True)
    post = "register_forward_hook"
else:
    import paddle as fw, paddle.nn as nn
    x = fw.ones([1, 2]); x.stop_gradient = False
    post = "register_forward_post_hook"
import unihook
from test_pickled_hooks import named
"""

_NATIVE_LOADED = (
    _CHILD
    + r"""
if step == "save":  # the framework's own hooks only: its plain dicts pickle, ids 0 to 7
    m = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
    for i in range(4):
        m[0].register_forward_pre_hook(named(f"saved pre {i}"))
        getattr(m[0], post)(named(f"saved post {i}"))
    with open(path, "wb") as f:
        pickle.dump(m, f)
    sys.exit()
with open(path, "rb") as f:
    m = pickle.load(f)
# a fresh process: the framework's counter draws 0, 1, ... again; every kind unihook places in
# the module's dicts: its own forward hooks, the dispatchers of module and global backward hooks
handles = [
    unihook.register_forward_pre_hook(m[0], named("new pre")),
    unihook.register_forward_hook(m[0], named("new post")),
    unihook.register_full_backward_hook(m[0], named("new backward")),
    unihook.register_full_backward_pre_hook(m[0], named("new backward pre")),
    unihook.register_module_full_backward_hook(named("global backward"), backend=framework),
]
m(x).sum().backward()
calls = list(named.calls)
for handle in handles:
    handle.remove()
named.calls.clear()
m(x)
print(repr([calls, named.calls]))
"""
)


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_unihook_hooks_on_a_module_loaded_with_native_hooks_keep_them(
    framework: str, tmp_path: Any
) -> None:
    """A module pickled with the framework's own hooks (plain dicts: no unihook in the saving
    process), loaded in a fresh process, then unihook's hooks of every kind placed in its
    dicts: each drew a loaded hook's id (0, 1, ...) and replaced it silently, until
    2026-12-04. Now every loaded hook runs, and after the removals exactly they do."""
    pytest.importorskip(framework)
    tests = os.path.dirname(os.path.abspath(__file__))
    path = str(tmp_path / "native.pkl")
    saved = run_code(_NATIVE_LOADED, framework, path, "save", tests)
    assert saved.returncode == 0, saved.stderr
    calls, after = last_value(run_code(_NATIVE_LOADED, framework, path, "load", tests))
    pres = [f"saved pre {i}" for i in range(4)]
    posts = [f"saved post {i}" for i in range(4)]
    assert calls[:5] == [*pres, "new pre"]
    assert calls[5:10] == [*posts, "new post"]
    # (the global hook once per module: the Tanh, the Linear, the Sequential)
    assert sorted(calls[10:]) == [*["global backward"] * 3, "new backward", "new backward pre"]
    assert after == [*pres, *posts]


_MIXED = r"""
import pickle, sys
path, step, tests = sys.argv[1:4]
sys.path.insert(0, tests)
import paddle, paddle.nn as nn
import unihook
from test_pickled_hooks import named

if step == "save":
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    unihook.register_forward_hook(m[0], named("A unihook"))  # (a HookDict on A)
    m[1].register_forward_post_hook(named("B native"))  # (a plain dict on B)
    m[0].register_forward_pre_hook(named("A native pre"))
else:
    with open(path, "rb") as f:
        m = pickle.load(f)
if step == "load":
    # a fresh process: its handle ids start where the saving ones' did
    m[1].register_forward_post_hook(named("B new native"))
    unihook.register_forward_hook(m[0], named("A new unihook"))
    m(paddle.ones([1, 2]))
    print(repr(named.calls))
else:
    with open(path, "wb") as f:
        pickle.dump(m, f)
"""


@pytest.mark.parametrize("resaved", [False, True])
def test_a_load_keeps_the_native_hooks_of_every_layer_also_saved_again(
    resaved: bool, tmp_path: Any
) -> None:
    """The counter moves past every id the saving process had drawn, so the native hooks of
    other layers in the pickle (ids above the unihook dict's keys) survive a registration
    after the load (helper-120's FINDING 1: the counter moved only past the unihook dict's
    keys, onto B's hook's id); a loaded copy saved again in another process does the same
    (its FINDING 2: the SnapshotDict pickled as a plain OrderedDict)."""
    pytest.importorskip("paddle")
    path, tests = str(tmp_path / "model.pkl"), os.path.dirname(os.path.abspath(__file__))
    for step in ("save", "resave") if resaved else ("save",):
        done = run_code(_MIXED, path, step, tests)
        assert done.returncode == 0, done.stderr
    got = last_value(run_code(_MIXED, path, "load", tests))
    assert got == ["A native pre", "A unihook", "A new unihook", "B native", "B new native"]


def test_a_pickle_of_the_earlier_format_loads() -> None:
    """A layer pickled before 2026-12-04 (its hook dict a plain SnapshotDict, no `_loaded`)
    loads, its hooks with it (README)."""
    pytest.importorskip("paddle")
    from collections import OrderedDict

    from unihook._pinned import SnapshotDict

    earlier = _EarlierFormat([(3, record)])
    loaded = pickle.loads(pickle.dumps(earlier))
    assert type(loaded) is SnapshotDict and list(loaded.items()) == [(3, record)]
    assert loaded.access is None and OrderedDict.__len__(loaded) == 1


class _EarlierFormat:
    """Pickles as a HookDict of ae871c6 did (`(SnapshotDict, (), state, None, items)`)."""

    def __init__(self, items: list[tuple[int, Any]]) -> None:
        self.items = items

    def __reduce__(self) -> Any:
        from unihook._pinned import SnapshotDict

        return (SnapshotDict, (), {"owned": frozenset()}, None, iter(self.items))


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_a_module_a_global_backward_hook_reached_pickles(framework: str) -> None:
    """A global module backward hook pins its dispatchers in every module it reaches; a pickle
    leaves them out as a deep copy does (until 2026-12-04 `torch.save(model)` raised
    HookTargetError for each such module: helper-124's FINDING 1). The loaded copy keeps its
    own hooks and gets the global dispatchers at its first call, while the hook is there."""
    pytest.importorskip(framework)
    model = _model(framework)
    unihook.register_forward_pre_hook(model[0], named("own pre"))
    seen: list[str] = []
    handle = unihook.register_module_full_backward_hook(
        lambda module, grad_input, grad_output: seen.append(type(module).__name__),
        backend=framework,
    )
    try:
        x = _batch(framework)
        model(x).sum().backward()
        first = list(seen)
        copy = pickle.loads(pickle.dumps(model))
        seen.clear()
        _Named.calls.clear()
        copy(x).sum().backward()
        assert seen == first and _Named.calls == ["own pre"]
    finally:
        handle.remove()
    seen.clear()
    copy(x).sum().backward()
    assert seen == []


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_a_hook_dict_deep_copied_before_or_without_its_module(framework: str) -> None:
    """``copy.deepcopy`` reaching a module's hook dict before its module while unihook's
    backward dispatchers are in it: refused with HookTargetError, a TypeError as deepcopy's
    own (until 2026-12-04 TypeError "cannot pickle '_thread._local' object": helper-124's
    FINDING 5; copying the module first left the copy a hidden module's dict: helper-127's
    FINDING 1). The dict alone (a hook transfer, ``other._forward_hooks =
    copy.deepcopy(m._forward_hooks)``) copies as torch's: its forward hooks, in a plain dict,
    run for the other module, whose backward is its own (helper-127's FINDING 4: refused).
    Without backward hooks the dict copies as a plain one."""
    import copy

    pytest.importorskip(framework)
    model = _model(framework)
    post = "register_forward_hook" if framework == "torch" else "register_forward_post_hook"
    attr = "_forward_hooks" if framework == "torch" else "_forward_post_hooks"
    getattr(model[0], post)(named("native post"))
    handle = unihook.register_full_backward_hook(model[0], lambda m, gi, go: None)
    x = _batch(framework)
    model(x).sum().backward()
    with pytest.raises(unihook.HookTargetError, match="its module deep-copied with it"):
        copy.deepcopy([getattr(model[0], attr), model])
    other = _model(framework)[0]
    transferred = copy.deepcopy(getattr(model[0], attr))
    assert type(transferred) is OrderedDict
    assert [getattr(v, "args", None) for v in transferred.values()] == [("native post",)]
    object.__setattr__(other, attr, transferred)
    _Named.calls.clear()
    other(x).sum().backward()
    model(x).sum().backward()
    assert _Named.calls == ["native post", "native post"]
    model_copy = copy.deepcopy([model, getattr(model[0], attr)])[0]  # (the module first)
    _Named.calls.clear()
    model_copy(x).sum().backward()
    assert _Named.calls == ["native post"]
    handle.remove()
    hooks = copy.deepcopy(getattr(model[0], attr))
    assert [getattr(v, "args", None) for v in hooks.values()] == [("native post",)]


_STALE_FLAGS = (
    _CHILD
    + r"""
if step == "save":  # hooks with_kwargs, then the dicts cleared: the flags stay behind
    m = nn.Linear(2, 2)
    for i in range(3):
        m.register_forward_pre_hook(named("gone"), with_kwargs=True)
        getattr(m, post)(named("gone"), with_kwargs=True)
    m._forward_pre_hooks.clear()
    (m._forward_hooks if framework == "torch" else m._forward_post_hooks).clear()
    with open(path, "wb") as f:
        pickle.dump(m, f)
    sys.exit()
with open(path, "rb") as f:
    m = pickle.load(f)
unihook.register_full_backward_hook(m, named("new backward"))  # (its dispatchers first)
unihook.register_forward_pre_hook(m, named("new pre"))
unihook.register_forward_hook(m, named("new post"))
m(x).sum().backward()
print(repr(named.calls))
"""
)


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_new_ids_avoid_the_flags_a_cleared_dict_left(framework: str, tmp_path: Any) -> None:
    """A module whose hook dicts were cleared (``m._forward_pre_hooks.clear()``: a "remove
    every hook" idiom) keeps its with_kwargs flags; pickled and loaded in a fresh process, an
    id drawn there that one flags was called with kwargs (helper-126's FINDING 5: TypeError
    from the backward dispatcher, a hook given an extra argument). New ids avoid them too."""
    pytest.importorskip(framework)
    tests = os.path.dirname(os.path.abspath(__file__))
    path = str(tmp_path / "stale.pkl")
    saved = run_code(_STALE_FLAGS, framework, path, "save", tests)
    assert saved.returncode == 0, saved.stderr
    got = last_value(run_code(_STALE_FLAGS, framework, path, "load", tests))
    assert got == ["new pre", "new post", "new backward"]
