"""helper-57's attack on ActivationStats and GradientMonitor in torch's Join (uneven inputs): each
test runs one case of tests/join_attack_child.py on 2 or 3 gloo CPU ranks (60 s at most, a
collective waits 15 s), then compares every rank's `history` / `rows()` with one process over
the batches actually run, or asks for a unihook error on every rank where the use is wrong.
Each test here failed on the code it was written against (672fb0c): a gloo abort (SIGABRT), a
timeout, or numbers that differ from one process's without an error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import join_attack_child as child  # noqa: E402
from children import run_ranks  # noqa: E402

CHILD = Path(__file__).with_name("join_attack_child.py")
BOUND = 150  # seconds for one case's ranks (a loaded CI host is several times slower)


def _ranks(case: dict[str, Any], tmp_path: Path) -> list[dict[str, Any]]:
    """What each rank pickled; a HANG or a CRASH fails the test (`run_ranks`)."""
    return run_ranks(CHILD, [json.dumps(case)], case["world"], tmp_path, BOUND)


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    return bool(np.isclose(a, b, rtol=1e-5, atol=1e-6))


def _same_step(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    assert list(got) == list(want), what
    for name, row in want.items():
        for key in ("calls", "nonfinite"):
            assert got[name][key] == row[key], f"{what}: {key} of {name!r}"
        for key in ("mean", "std", "min", "max", "zeros"):
            assert _close(got[name][key], row[key]), f"{what}: {key} of {name!r}"


def _sorted(result: dict[str, Any]) -> None:
    """`result`'s rows and history entries by module name (where only their order differs)."""
    for rec in result["recipes"]:
        rec["history"] = [dict(sorted(h.items())) for h in rec["history"]]
        if "rows" in rec:
            rec["rows"] = sorted(rec["rows"], key=lambda r: r["name"])


def _as_one_process(
    case: dict[str, Any], ranks: list[dict[str, Any]], orderless: bool = False
) -> None:
    """No error on any rank, and every rank's numbers are one process's over the batches run
    (`orderless`: in any order of the modules)."""
    want = child.run(case, None)
    if orderless:
        for result in [want, *ranks]:
            _sorted(result)
    for rank, got in enumerate(ranks):
        assert got["errors"] == [], f"rank {rank}: {got['errors']}"
        for i, (spec, g, w) in enumerate(zip(case["recipes"], got["recipes"], want["recipes"])):
            what = f"rank {rank}, recipe {i} ({spec[0]})"
            assert len(g["history"]) == len(w["history"]), what
            for step, (a, b) in enumerate(zip(g["history"], w["history"])):
                if spec[0] == "stats":
                    _same_step(a, b, f"{what}, step {step}")
                else:
                    assert sorted(a) == sorted(b), f"{what}, step {step}"
                    assert all(_close(a[k], b[k]) for k in b), f"{what}, step {step}"
            if spec[0] == "stats":
                rows = {r["name"]: r for r in g["rows"]}
                _same_step(rows, {r["name"]: r for r in w["rows"]}, f"{what}, rows()")


def _unihook_error_on_every_rank(ranks: list[dict[str, Any]]) -> None:
    for rank, got in enumerate(ranks):
        assert got["errors"], f"rank {rank}: no error"
        message = got["errors"][0][1]
        assert "unihook" in message, f"rank {rank}: not a unihook error: {message}"


def _refused_for_every(ranks: list[dict[str, Any]]) -> None:
    _unihook_error_on_every_rank(ranks)
    for rank, got in enumerate(ranks):
        assert "the same `every`" in got["errors"][0][1], f"rank {rank}: {got['errors']}"


BOTH = [["stats", 1], ["monitor", 1]]


@pytest.mark.parametrize(
    "case",
    [
        # rank 0: 3 batches, rank 1: 5; the first-listed recipe removed at iteration 1 on both
        {
            "world": 2,
            "counts": [3, 5],
            "model": "mlp",
            "recipes": BOTH,
            "remove": [0, 1, 0, [0, 1]],
        },
        # removed at iteration 2, before rank 0 runs out at 3
        {
            "world": 2,
            "counts": [3, 5],
            "model": "mlp",
            "recipes": BOTH,
            "remove": [0, 2, 0, [0, 1]],
        },
        # 3 ranks, the monitor first, removed before the first forward
        {
            "world": 3,
            "counts": [2, 5, 5],
            "model": "mlp",
            "recipes": [["monitor", 1], ["stats", 1]],
            "remove": [0, 0, 0, [0, 1, 2]],
        },
    ],
    ids=["at-1", "at-2", "3-ranks-at-0"],
)
def test_removing_the_first_listed_recipe_inside_join(case: dict[str, Any], tmp_path: Path) -> None:
    """`stats.remove()` on every rank at the same iteration of ``Join([stats, monitor, ddp])``
    (the second recipe's removal works): the first recipe's `_notify` pre-hook goes with its
    hooks, so nobody tells the Join of the forwards any more (DDP, not first, does not);
    when rank 0 runs out, its Join all-reduce pairs with DDP's sync flag and DDP's join hook
    with the bucket's all-reduce: gloo aborts both processes ("Received data size doesn't
    match expected size", SIGABRT). Wanted: the monitor left in the Join reports as one
    process."""
    _as_one_process(case, _ranks(case, tmp_path))


def _left_out_of_the_join(ranks: list[dict[str, Any]]) -> None:
    _unihook_error_on_every_rank(ranks)
    for rank, got in enumerate(ranks):
        message = got["errors"][0][1]
        assert "must be in the list given to torch's Join" in message, f"rank {rank}: {message}"


def test_recipes_left_out_of_a_later_join_raise_a_unihook_error(tmp_path: Path) -> None:
    """README: once in a Join, the recipes go in every later one with that model. A later
    ``Join([ddp])`` without them (epoch 2, uneven) is a misuse; the promise is a clear unihook
    error on every rank. Got (until 2026-11-30): the recipes' stale `_join_config` (first,
    enabled) still notified at each forward beside DDP's own notice, and gloo aborted both
    processes. Now DDP's `join_hook` checks its synced recipes are listed before it."""
    case = {
        "world": 2,
        "counts": [[2, 2], [1, 3]],
        "model": "mlp",
        "recipes": BOTH,
        "epochs": 2,
        "later_without": True,
        "timeout": 4,  # (a collective that waits: the limit)
    }
    _left_out_of_the_join(_ranks(case, tmp_path))


def test_a_synced_recipe_left_out_of_the_join_raises_a_unihook_error(tmp_path: Path) -> None:
    """``Join([stats, ddp])`` while a synced GradientMonitor on the same wrapper is not listed:
    the rank that ran out does not shadow its merges (which run on the recipes' own group since
    the Join), and the other rank waited (until 2026-11-30) in its all_gather until the group's
    timeout. Now a unihook error on every rank when the Join is built."""
    case = {
        "world": 2,
        "counts": [1, 3],
        "model": "mlp",
        "recipes": BOTH,
        "listed": [0],
        "timeout": 4,  # (a collective that waits: the limit)
    }
    _left_out_of_the_join(_ranks(case, tmp_path))


def test_a_rank_with_no_batch_lists_the_modules_in_call_order(tmp_path: Path) -> None:
    """Rank 0 has no batch at all (``Join([stats, ddp])``, rank 1: 2 batches) and the model's
    tree order differs from its call order (`shared` is registered before `act`, called after
    it). Rank 0 learns of the modules in its first shadowed merge and files them in `names`'
    order (`ActivationStats._merge`: ``_Running(order=len(self._stats))`` in tree order), so
    its `rows()` and every `history` entry list `shared` before `act`, where rank 1 and one
    process list them in call order (the numbers agree): SILENT_WRONG in the order only, and
    the ranks' reports differ. (2026-11-30: each rank sends its modules' places; a rank new to
    a module files it in the first rank's order.)"""
    case = {"world": 2, "counts": [0, 2], "model": "twice", "recipes": [["stats", 1]]}
    ranks = _ranks(case, tmp_path)
    want = child.run(case, None)["recipes"][0]
    for rank, got in enumerate(ranks):
        names = [row["name"] for row in got["recipes"][0]["rows"]]
        assert names == [row["name"] for row in want["rows"]], f"rank {rank}: rows() {names}"
        for step, entry in enumerate(got["recipes"][0]["history"]):
            assert list(entry) == list(want["history"][step]), f"rank {rank}, step {step}"
    _as_one_process(case, ranks)


@pytest.mark.xfail(
    strict=True,
    reason="a forward interrupted (BaseException) on every rank: one process counts the "
    "partial forward, merged ranks do not (README's known limits)",
)
def test_a_forward_interrupted_on_every_rank_counts_as_in_one_process(tmp_path: Path) -> None:
    """A KeyboardInterrupt out of a submodule's forward hook (after modules 0, 1 and 2 ran) at
    the second iteration on every rank, even batches, no Join: one process's `rows()` count
    that interrupted forward's calls and values of the modules that ran (calls 2, their mean
    and std moved), the ranks' merged `rows()` leave it out (calls 1): the two disagree
    without an error (not specific to Join; README's known limit names only the monitor)."""
    case = {
        "world": 2,
        "counts": [3, 3],
        "model": "mlp",
        "recipes": BOTH,
        "nojoin": True,
        "kbi": [0, 1, [0, 1]],
        "stop_on_error": False,
    }
    ranks = _ranks(case, tmp_path)
    for got in ranks:  # (the interrupt itself is expected: drop it, then compare)
        assert [e for _, e in got["errors"]] == ["KeyboardInterrupt: interrupted on purpose"]
        got["errors"] = []
    want = child.run(case, None)
    assert [e for _, e in want["errors"]] == ["KeyboardInterrupt: interrupted on purpose"]
    for rank, got in enumerate(ranks):
        g = {r["name"]: r for r in got["recipes"][0]["rows"]}
        w = {r["name"]: r for r in want["recipes"][0]["rows"]}
        _same_step(g, w, f"rank {rank}, rows()")


@pytest.mark.parametrize("counts", [[1, 4], [0, 4]], ids=["runs-out-after-1", "no-batch"])
def test_two_stats_with_every_are_not_swapped_on_the_rank_that_ran_out(
    counts: list[int], tmp_path: Path
) -> None:
    """SILENT_WRONG. ``Join([a, b, ddp])`` with two ActivationStats on one module each,
    ``a = ActivationStats(ddp, where=["0"], every=2)`` made first, ``b = ActivationStats(ddp,
    where=["3"])``; rank 0 runs out after 1 batch (or has none), rank 1 has 4. After `a`'s
    first recorded forward `every` removes its hooks and places them anew, after `b`'s: on
    rank 1 the forward's end then runs `b`'s merge before `a`'s, while rank 0's shadow thread
    runs them in creation order (`a` first). Same vector lengths, so the all_gathers pair
    without a gloo error, the stamps agree (rank 0's JOINED row is left out), the layouts are
    not compared again: rank 0's `a.history[1]["0"]` holds module 3's numbers of iteration 2
    and its `b.history[2]["3"]` module 0's (mean 0.041 and 0.242 swapped), rank 1 and one
    process agree with each other."""
    case = {
        "world": 2,
        "counts": counts,
        "model": "mlp",
        "recipes": [["stats", 2, True, ["0"]], ["stats", 1, True, ["3"]]],
    }
    # Now refused when the Join is built, on every rank: its recipes must share `every`
    _refused_for_every(_ranks(case, tmp_path))
    same = {**case, "recipes": [["stats", 2, True, ["0"]], ["stats", 2, True, ["3"]]]}
    _as_one_process(same, _ranks(same, tmp_path / "same"))


@pytest.mark.parametrize("every", [2, 3])
def test_every_replacing_hooks_keeps_the_shadows_order(every: int, tmp_path: Path) -> None:
    """``Join([stats, monitor, ddp])``, ActivationStats(every=2 or 3) made before a
    GradientMonitor, a model with an output shared by every sample (a positional table,
    `PosNet`), rank 0 with no batch, rank 1 with 4. With one rank left the monitor's slots stay
    undecided (one row: 'the same inputs'), so each forward ends with its table exchange
    (`_settle`). `every` removes the stats' hooks after a recorded forward and places them
    anew before the next: its `_close` then comes after the monitor's `_settle` in the model's
    forward hooks, so rank 1 runs the monitor's exchange first, while rank 0's shadow thread
    (`_Joined._shadow`) runs them in creation order, stats first: at the second recorded
    forward the two all_gathers pair, gloo aborts both processes ("Received data size doesn't
    match expected size", 352 vs 304). Were the sizes equal, the shadowing rank would parse
    the monitor's table as the stats' numbers: its own stamp (JOINED) is left out of the
    check, and the only other stamp agrees with itself."""
    case = {
        "world": 2,
        "counts": [0, 4],
        "model": "pos",
        "recipes": [["stats", every], ["monitor", 1]],
    }
    _refused_for_every(_ranks(case, tmp_path))  # (now: the recipes of a Join share `every`)
    same = {**case, "recipes": [["stats", every], ["monitor", every]]}
    # (orderless: the row order on a rank with no batch is the test above)
    _as_one_process(same, _ranks(same, tmp_path / "same"), orderless=True)


def test_same_inputs_on_every_rank_keep_the_shadows_order(tmp_path: Path) -> None:
    """As above without a rank lacking batches: every rank gets the same rows (data drawn with
    one seed), so the monitor's slots stay undecided while both ranks run; rank 0 runs out
    after 2 batches, and at the next recorded stats forward (iteration 2) its shadows pair
    the stats' merge with rank 1's monitor exchange: gloo aborts both."""
    case = {
        "world": 2,
        "counts": [2, 4],
        "model": "pos",
        "same": True,
        "recipes": [["stats", 2], ["monitor", 1]],
    }
    _refused_for_every(_ranks(case, tmp_path))  # (now: the recipes of a Join share `every`)
    same = {**case, "recipes": [["stats", 2], ["monitor", 2]]}
    _as_one_process(same, _ranks(same, tmp_path / "same"), orderless=True)


# What the check of the two cases above lets through (2026-11-30): a recipe that does not merge
# (sync=False) or was removed may stay out of a Join; the others still report as one process.


def test_a_recipe_without_sync_may_stay_out_of_the_join(tmp_path: Path) -> None:
    case = {
        "world": 2,
        "counts": [1, 3],
        "model": "mlp",
        "recipes": [["monitor", 1], ["stats", 1, False]],
        "listed": [0],
    }
    for rank, got in enumerate(_ranks(case, tmp_path)):
        assert got["errors"] == [], f"rank {rank}: {got['errors']}"
        assert len(got["recipes"][0]["history"]) == 3, f"rank {rank}"


def test_a_removed_recipe_may_stay_out_of_a_later_join(tmp_path: Path) -> None:
    case = {
        "world": 2,
        "counts": [[2, 2], [1, 3]],
        "model": "mlp",
        "recipes": BOTH,
        "epochs": 2,
        "remove": [0, 1, 0, [0, 1]],  # (epoch, iteration, recipe, ranks)
        "drop_removed": True,
    }
    _as_one_process(case, _ranks(case, tmp_path))
