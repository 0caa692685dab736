"""A torch hook registered or removed on one thread while dynamo compiles a model on another
(helper-80's held churn failed in CI: dynamo iterates a module's hook dicts live, in its frame
callback too, outside its compile lock, and the registration changed one in the middle:
"OrderedDict mutated during iteration", or a KeyError). The registration waits for dynamo's
loop; the compiled call runs the hooks as they were, the next call the new ones."""

from __future__ import annotations

import pytest
from children import last_value, run_code

pytest.importorskip("torch")

MID_COMPILE = r"""
import inspect, sys, threading
import torch, torch._dynamo, unihook
from torch._dynamo import utils

KIND = sys.argv[1]
m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
# (a backward hook: its dispatchers break the graph around m[0], whose frame dynamo's callback
# then looks at, reading its hook dicts)
kept = unihook.register_full_backward_hook(m[0], lambda mod, gi, go: None)
removed = unihook.register_forward_pre_hook(m[0], lambda mod, a: seen.append("removed"))
f = torch.compile(m, backend="eager")
seen, inside, registered = [], threading.Event(), threading.Event()
looping = inspect.unwrap(utils.nn_module_get_all_hooks).__code__  # (unihook marks its runs)


def pause(frame, event, arg):
    # inside dynamo's loop over m[0]'s forward pre-hooks: the other thread changes them now
    local = frame.f_locals
    if (
        event == "line"
        and local.get("mod") is m[0]
        and local.get("hook_dict_name") == "_forward_pre_hooks"
        and "hook_name" in local
    ):
        if not inside.is_set():
            inside.set()
            registered.wait(0.3)  # (it waits for this loop to end: the wait times out)
    return pause


def trace(frame, event, arg):
    return pause if frame.f_code is looping else None


def other():
    inside.wait(30)
    if KIND == "register":
        unihook.register_forward_pre_hook(m[0], lambda mod, a: seen.append("new"))
    else:
        removed.remove()
    registered.set()


thread = threading.Thread(target=other)
thread.start()
sys.settrace(trace)
errors = []
try:
    f(torch.ones(2, 3)).sum().backward()
except Exception as error:
    errors.append(f"{type(error).__name__}: {error}")
sys.settrace(None)
thread.join()
first = list(seen)
seen.clear()
f(torch.ones(2, 3)).sum().backward()
print([inside.is_set(), errors, first, list(seen)])
"""


@pytest.mark.parametrize("kind", ["register", "remove"])
def test_a_hook_changed_while_dynamo_reads_the_hooks_waits_for_it(kind: str) -> None:
    got = last_value(run_code(MID_COMPILE, kind, timeout=120))
    after = ["new"] if kind == "register" else []
    assert got == [True, [], ["removed"], ["removed", *after] if kind == "register" else after]
