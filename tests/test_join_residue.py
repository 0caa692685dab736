"""The check torch's ``Join`` runs for a DDP wrapper's synced recipes (README "Uneven inputs";
the two-rank cases are in `tests/test_attack_h57.py`) leaves nothing behind: DDP's
``join_hook`` attribute comes with the first synced recipe on the wrapper (given the wrapper,
or the wrapper inside ``torch.compile``) and goes with the last one's ``remove()``, a dropped
recipe is freed, and a one-rank group (nothing merged) needs no recipe in its Join. One
process, gloo, in a subprocess (a process group outlives a test)."""

from __future__ import annotations

import pytest
from children import last_value, run_code

CHILD = """
import gc, os, socket, weakref, torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.algorithms.join import Join
from unihook.recipes import ActivationStats, GradientMonitor

s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
ddp = nn.parallel.DistributedDataParallel(model)
out = {"before": "join_hook" in vars(ddp)}
stats, monitor = ActivationStats(ddp), GradientMonitor(torch.compile(ddp, backend="eager"))
inner = ActivationStats(model)
out["with"] = "join_hook" in vars(ddp) and "join_hook" not in vars(model)
with Join([ddp]):  # one rank: the recipes merge nothing, so they need not be listed
    ddp(torch.ones(2, 4)).sum().backward()
out["history"] = len(stats.history)
stats.remove()
stats.remove()  # (idempotent)
out["one_left"] = "join_hook" in vars(ddp)
monitor.remove()
out["none_left"] = "join_hook" in vars(ddp) or type(ddp).join_hook is not ddp.join_hook.__func__
dropped = ActivationStats(ddp)
ref = weakref.ref(dropped)
dropped.remove()
del dropped
gc.collect()
out["freed"] = ref() is None and "join_hook" not in vars(ddp)
inner.remove()
print(repr(out))
dist.destroy_process_group()
"""


def test_the_join_check_leaves_nothing_behind() -> None:
    pytest.importorskip("torch")
    assert last_value(run_code(CHILD)) == {
        "before": False,
        "with": True,
        "history": 1,
        "one_left": True,
        "none_left": False,
        "freed": True,
    }
