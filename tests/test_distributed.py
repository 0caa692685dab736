"""Data parallel (issue 17): unihook's hooks and recipes on 2 CPU ranks (gloo) of torch's
DistributedDataParallel and paddle.DataParallel, against single-process runs in this process
(no process group here). Each framework's ranks run once (tests/distributed_child.py, in a
subprocess of their own, bounded in time); the tests read what the ranks saw."""

from __future__ import annotations

import itertools
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import distributed_child as child
import numpy as np
import pytest

CHILD = Path(__file__).with_name("distributed_child.py")
FUZZ = Path(__file__).with_name("distributed_fuzz.py")  # generated models (README: per sample)
FUZZ_CASES, FUZZ_SEED = "30", "17"
TIMEOUT = 150  # seconds for one 2-rank run (15 to 25 s here, the four runs side by side)
FRAMEWORKS = ["torch", "paddle"]


class Run:
    """The child with its 2 ranks, started in a session of its own, output to a file (a pipe
    nobody reads until the end could fill and block it)."""

    def __init__(self, framework: str, out: Path, *extra: str, script: Path = CHILD) -> None:
        self.framework = framework
        self.out = out
        self.log = out / "output.txt"
        # the checkout first, then the caller's path (a worktree's backends, say)
        path = os.pathsep.join(filter(None, [str(CHILD.parent.parent), os.getenv("PYTHONPATH")]))
        env = {
            **os.environ,
            "GLOG_minloglevel": "2",
            "PYTHONPATH": path,
            "UNIHOOK_TEST_PORT": str(_port_block()),
        }
        self.start = time.monotonic()
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(script), framework, str(out), *extra],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def wait(self) -> tuple[int, str, float]:
        """(exit code, output, seconds it took); past TIMEOUT the whole session is killed."""
        try:
            self.process.wait(timeout=max(1.0, self.start + TIMEOUT - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            pytest.fail(f"{self.framework}: the ranks did not finish within {TIMEOUT} s")
        return self.process.returncode, self.log.read_text(), time.monotonic() - self.start


_blocks = itertools.count()


def _port_block(size: int = 8) -> int:
    """The first of `size` free ports, a block of its own per run, below Linux's ephemeral
    range (32768 up), from which the frameworks' own picks (bind to port 0) come: runs started
    side by side, and another test session (by its pid), do not pick each other's ports."""
    for _ in range(200):
        start = 20000 + (os.getpid() % 300 * 37 + next(_blocks)) * size % 12000
        try:
            for port in range(start, start + size):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return start
    return 0  # (none found: the child picks a free port itself)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, Any], Run]:
    """Every run of this file, started at once: the ranks mostly import their framework, and
    side by side the runs take about as long as two in a row."""
    started: dict[tuple[str, Any], Run] = {}
    for framework in FRAMEWORKS:
        pytest.importorskip(framework)
        for fail in (False, True):
            out = tmp_path_factory.mktemp(f"dist-{framework}-{'fail' if fail else 'ok'}")
            started[framework, fail] = Run(framework, out, *(["fail"] if fail else []))
        out = tmp_path_factory.mktemp(f"dist-{framework}-fuzz")
        started[framework, "fuzz"] = Run(framework, out, FUZZ_CASES, FUZZ_SEED, script=FUZZ)
        if framework == "torch":  # (paddle has no Join)
            out = tmp_path_factory.mktemp("dist-torch-join")
            started[framework, "join"] = Run(framework, out, "join")
    return started


def _session_alive(pid: int, grace: float = 10.0) -> bool:
    """Whether any process of session `pid` is still running after `grace` seconds (a rank
    that outlived the launcher; one exiting takes a moment)."""
    deadline = time.monotonic() + grace
    while _session_members(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _session_members(pid)


def _session_members(pid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == pid and fields[0] != "Z":  # field 6: the session id
                return True
    return False


@pytest.fixture(scope="module", params=FRAMEWORKS)
def ranks(request: pytest.FixtureRequest, runs: dict[tuple[str, Any], Run]) -> Any:
    framework = request.param
    return framework, _results(runs[framework, False])


def _results(run: Run) -> list[dict[str, Any]]:
    """What each rank of `run` pickled, once it ended well."""
    code, output, _ = run.wait()
    assert code == 0, output[-4000:]
    found = []
    for rank in range(child.WORLD):
        with open(run.out / f"rank{rank}.pkl", "rb") as f:
            found.append(pickle.load(f))
    return found


def close(a: Any, b: Any, what: str) -> None:
    if a is None or b is None:
        assert a is None and b is None, what
        return
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=what)


def test_hooks_per_rank_as_one_process_on_its_rows(ranks: Any) -> None:
    """Every hook kind, on the inner modules, globally and on the wrapper: per rank the calls a
    single process makes on that rank's rows, in the same order, with the same values (backward
    hooks see the rank's own gradients); the parameters' gradients are the ranks' mean."""
    framework, results = ranks
    fw = child.Framework(framework)
    reference_grads = []
    for rank, result in enumerate(results):
        reference = child.hook_scenario(fw, fw.model(child.weights()), rank)
        reference_grads.append(reference["grads"])
        seen = result["hooks"]["calls"]
        # the wrapper's own calls: its forward hook (and the tensor hook that puts on the
        # output), its backward hook, the global hooks on it
        wrapper = [call for call in seen if call[1] == "<wrapper>"]
        inner = [call for call in seen if call[1] != "<wrapper>"]
        kinds = sorted(kind for kind, _, _ in wrapper)
        assert kinds == [
            "forward", "full_backward", "global_forward", "global_full_backward", "tensor"
        ]  # fmt: skip
        assert [c[:2] for c in inner] == [c[:2] for c in reference["calls"]]
        for (kind, name, values), (_, _, expected) in zip(inner, reference["calls"]):
            for value, want in zip(values, expected):
                close(value, want, f"rank {rank}: {kind} hook of {name!r}")
        model_out = next(v for k, n, v in reference["calls"] if (k, n) == ("forward", ""))
        model_grad = next(v for k, n, v in reference["calls"] if (k, n) == ("full_backward", ""))
        for kind, _, values in wrapper:
            if kind == "forward":
                close(values[0], model_out[0], f"rank {rank}: the wrapper's output")
            if kind == "full_backward":
                close(values[1], model_grad[1], f"rank {rank}: the wrapper's grad_output")
            if kind == "tensor":
                close(values[0], model_grad[1], f"rank {rank}: the wrapper's output gradient")
    mean = [np.mean(parts, axis=0) for parts in zip(*reference_grads)]
    for result in results:
        for got, want in zip(result["hooks"]["grads"], mean):
            close(got, want, "DDP's all-reduced gradient")


def _global_reference(fw: child.Framework) -> dict[str, Any]:
    # A loss summed over the rows: DDP averages the ranks' gradients, so the same updates on the
    # global batch take the learning rate over the world size.
    return child.recipe_scenario(fw, fw.model(child.weights()), None, child.LR / child.WORLD)


def _same_stats(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    assert list(got) == list(want), what
    for name in want:
        for key in ("calls", "nonfinite"):
            assert got[name][key] == want[name][key], f"{what}: {key} of {name!r}"
        for key in ("mean", "std", "min", "max", "zeros"):
            close(got[name][key], want[name][key], f"{what}: {key} of {name!r}")


def _same_norms(got: dict[str, float], want: dict[str, float], what: str) -> None:
    assert sorted(got) == sorted(want), what
    for name in want:
        close(got[name], want[name], f"{what}: norm of {name!r}")


# what the recipes were given: the DDP / DataParallel wrapper, the model inside it, torch's FSDP
# (one FullyShardedDataParallel unit, one per Linear; fully_shard), paddle's fleet sharding
# (ShardingParallel)
SETUPS = {
    "wrapper": "recipes",
    "inner": "inner_recipes",
    "fsdp1": "fsdp1_recipes",
    "fsdp1-units": "fsdp1-units_recipes",
    "hsdp1": "hsdp1_recipes",
    "fsdp2": "fsdp2_recipes",
    "fleet-sharding": "sharding_recipes",
}


@pytest.mark.parametrize("setup", list(SETUPS))
def test_recipes_report_the_global_batch(ranks: Any, setup: str) -> None:
    """ActivationStats and GradientMonitor over 2 SGD steps: every rank reports what one process
    reports on the global batch (inner names, no `module.` / `_layers.` /
    `_fsdp_wrapped_module.`), given the wrapper, the model inside it, or a sharded model."""
    framework, results = ranks
    key = SETUPS[setup]
    if key not in results[0]:
        pytest.skip(f"{setup} is not a {framework} setup")
    want = _global_reference(child.Framework(framework))
    first, second = (result[key] for result in results)
    for part in ("stats", "monitor", "rows"):  # the same merge on every rank: the same bits
        assert first[part] == second[part], part
    # FSDP's hybrid sharding over one-rank shard groups updates the weights otherwise than DDP
    # here (torch 2.13, gloo; without unihook too): its first step only, before any update
    steps = 1 if setup == "hsdp1" else child.STEPS
    for rank, result in enumerate(results):
        got = result[key]
        assert len(got["stats"]) == len(got["monitor"]) == child.STEPS
        for step in range(steps):
            what = f"rank {rank}, step {step}"
            _same_stats(got["stats"][step], want["stats"][step], f"{what}, ActivationStats")
            _same_norms(got["monitor"][step], want["monitor"][step], f"{what}, GradientMonitor")
        if steps == child.STEPS:
            rows = {row["name"]: row for row in got["rows"]}
            _same_stats(rows, {row["name"]: row for row in want["rows"]}, f"rank {rank}, rows()")


def test_sync_false_keeps_each_ranks_numbers(ranks: Any) -> None:
    """`sync=False`: the first step's numbers are a single process's on the rank's rows."""
    framework, results = ranks
    fw = child.Framework(framework)
    for rank, result in enumerate(results):
        want = child.recipe_scenario(fw, fw.model(child.weights()), rank, child.LR)
        got = result["recipes"]
        what = f"rank {rank}, sync=False"
        _same_stats(got["local_stats"][0], want["stats"][0], what)
        _same_norms(got["local_monitor"][0], want["monitor"][0], what)
        assert got["local_stats"][0]["0"]["mean"] != got["stats"][0]["0"]["mean"]


def test_sinks_write_on_rank_zero_only(ranks: Any) -> None:
    _, results = ranks
    first, second = (result["recipes"] for result in results)
    assert first["written"] == (True, True) and second["written"] == (False, False)
    assert first["scalars"][0] > 0 and second["scalars"][0] == 0
    assert second["scalars"][1] == first["scalars"][0]  # all_ranks=True writes everywhere


def test_nonfinite_raises_the_same_error_on_every_rank(ranks: Any) -> None:
    """A NaN gradient on rank 1 only: both ranks raise the same NonFiniteGradientError naming
    rank 1 and the first module in backward order, then keep training (no rank waits)."""
    _, results = ranks
    errors = [result["nonfinite"]["errors"] for result in results]
    assert errors[0] == errors[1]
    ((message, module, rank, flagged),) = errors[0]
    # the model returns the last Linear's output: the model is outermost, first in backward
    assert (module, rank, flagged) == ("", 1, (1,))
    assert "'(model)' on rank 1" in message
    for result in results:
        after = result["nonfinite"]["after"]
        assert after and all(np.isfinite(v) for v in after.values())
        # on_nonfinite="warn": the same warning on every rank
        assert result["nonfinite"]["warned"] == [message]


def test_a_rank_whose_loss_reaches_no_module_output_merges_too(ranks: Any) -> None:
    """Rank 1 backpropagates the dummy loss of an empty batch (its parameters times 0): no
    rank waits, and both record rank 0's norms, the only gradients there are."""
    _, results = ranks
    merged = [result["dummy_loss"]["merged"] for result in results]
    assert len(merged[0]) == 2 and merged[0] == merged[1]
    assert merged[0] == results[0]["dummy_loss"]["local"]
    # a GradientMonitor built before the process group (on the model inside the wrapper)
    for result in results:
        assert result["dummy_loss_early"]["merged"] == merged[0]


def test_an_evaluation_on_one_rank_before_training_stays_out_of_the_rows(ranks: Any) -> None:
    _, results = ranks
    first = [result["evaluation_first"] for result in results]
    assert first[0] == first[1]
    assert all(row["calls"] == 1 for row in first[0])


def test_nonfinite_activations_merge(ranks: Any) -> None:
    """A NaN input on rank 1: every rank's ActivationStats counts the non-finite values of the
    global batch and gives the statistics of its finite values, as one process on it."""
    framework, results = ranks
    fw = child.Framework(framework)
    want = child.nan_stats(fw, fw.model(child.weights()), None)
    # the sample's 8 outputs of the first Linear (paddle's ReLU then turns NaN into 0)
    assert want["0"]["nonfinite"] == 8
    for rank, result in enumerate(results):
        _same_stats(result["nonfinite"]["stats"], want, f"rank {rank}, NaN input")


def test_an_evaluation_on_one_rank_between_steps_is_not_recorded(ranks: Any) -> None:
    """Rank 0 alone runs the wrapper under no_grad before each training step: the synced
    recipes leave those forwards out (no rank waits for a partner) and out of `every`'s count,
    so they report what they report without the evaluations."""
    framework, found = ranks
    for rank, result in enumerate(found):
        assert result["removed_between"] == []  # removed before the backward: nothing merged
        for key in ("evaluation_between", "evaluation_within"):
            what = f"{framework} rank {rank}, {key}"
            _same_as_without_evaluations(result[key], result["recipes"], what)


def _same_as_without_evaluations(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    assert len(got["stats"]) == len(got["monitor"]) == child.STEPS, what
    assert len(got["sparse_stats"]) == len(got["sparse_monitor"]) == 1, what  # forward 0 only
    for step in range(child.STEPS):
        _same_stats(got["stats"][step], want["stats"][step], f"{what}, step {step}")
        _same_norms(got["monitor"][step], want["monitor"][step], f"{what}, step {step}")
    _same_stats(got["sparse_stats"][0], want["stats"][0], f"{what}, every=2")
    _same_norms(got["sparse_monitor"][0], want["monitor"][0], f"{what}, every=2")


def test_recipes_merge_over_the_wrappers_own_group(ranks: Any) -> None:
    """A wrapper built over a group of one rank: the recipes merge over that group, not the
    default one, so each rank reports its own batch's numbers, and writes (its group's rank 0)."""
    framework, found = ranks
    for rank, result in enumerate(found):
        own = result["own_group"]
        assert own["world"] == (0, 1)
        assert own["written"] == (True, True), f"rank {rank}"
        for got, want in zip(own["stats"], own["local_stats"]):
            _same_stats(got, want, f"{framework} rank {rank}: stats over its own group")
        for got, want in zip(own["monitor"], own["local_monitor"]):
            _same_norms(got, want, f"{framework} rank {rank}: norms over its own group")
        assert own["nan"][1:] == (None, ()), own["nan"]  # at the module, as one process
        # torch: the inner model's names through torch.compile's OptimizedModule and DDP
        assert [row["name"] for row in own["rows"]] == ["", "0", "1", "2", "2.0", "2.1", "3"]


def test_ranks_watching_different_modules_raise_on_every_rank(ranks: Any) -> None:
    framework, found = ranks
    counts = {"extra": ("rank 0: 7 ", "rank 1: 8 "), "types": ("rank 0: 7 ", "rank 1: 7 ")}
    # every=2 places its hooks anew on the modules its first placement chose: a module rank 1
    # adds later is not watched, as with every=1 (the ranks merge on: no error, no hang); one
    # it replaces is not either, so rank 1 watches a module fewer (until 2026-12-04 every=2
    # hooked the new tree: 8 modules, and the Tanh)
    counts["late_types"] = ("rank 0: 7 ", "rank 1: 6 ")
    for recipe in ("ActivationStats", "GradientMonitor"):
        late = [result["mismatch"].get(f"{recipe} late") for result in found]
        assert late == [None, None], f"{framework} {recipe} late: {late}"
        for case, (first, second) in counts.items():
            messages = [result["mismatch"].get(f"{recipe} {case}") for result in found]
            assert all(messages), f"{framework} {recipe} {case}: {messages}"
            for message in messages:
                assert first in message and second in message, message
                assert f"{recipe} watches different modules" in message, message
            assert ("'extra:ReLU'" in messages[1]) == (case == "extra"), messages[1]
            assert ("'1:Tanh'" in messages[1]) == (case == "types"), messages[1]
            assert "'extra:" not in messages[0] and "'1:ReLU'" in messages[0]


def test_an_evaluation_with_gradients_on_one_rank_raises_on_every_rank(ranks: Any) -> None:
    """Its merge would pair with the other rank's training forward and mix their numbers."""
    framework, found = ranks
    errors = [result["evaluation_with_grad"]["errors"] for result in found]
    # rank 0 raises in its evaluation forward, rank 1 in its training forward of step 1, with
    # the same message; the last step merges as before
    assert [[step for step, _ in e] for e in errors] == [[1], [1]], (framework, errors)
    message = errors[0][0][1]
    assert errors[1][0][1] == message, (framework, errors)
    assert "ActivationStats cannot merge" in message, message
    assert "rank 0: ActivationStats' numbers of an evaluation-mode forward" in message, message
    assert "rank 1: ActivationStats' numbers of a training-mode forward" in message, message
    rows = [result["evaluation_with_grad"]["rows"] for result in found]
    assert rows[0] == rows[1] and rows[0], (framework, rows)
    assert {row["calls"] for row in rows[0] if row["name"] == "0"} == {2}, rows[0]


def test_uneven_accumulation_under_no_sync_raises_on_every_rank(ranks: Any) -> None:
    """Rank 0 accumulates 2 micro-batches per step, rank 1 three: rank 0's synced second one
    would merge with rank 1's second, under `no_sync()` (until 2026-11-30, silently). An even
    step before it merges as usual."""
    framework, found = ranks
    errors = [result["accumulation"]["errors"] for result in found]
    assert [[micro for micro, _ in e] for e in errors] == [[3], [3]], (framework, errors)
    message = errors[0][0][1]
    assert errors[1][0][1] == message, (framework, errors)
    assert "ActivationStats cannot merge" in message, message
    assert "rank 0: ActivationStats' numbers of a training-mode forward;" in message, message
    assert "rank 1: ActivationStats' numbers of a training-mode forward under no_sync()" in message
    for result in found:  # micro-batches 0 to 2 recorded (the even step's too), not the 4th
        assert (result["accumulation"]["stats"], result["accumulation"]["monitor"]) == (3, 3)


def test_each_rank_dumps_what_one_process_dumps_on_its_rows(
    ranks: Any, runs: dict[tuple[str, Any], Run], tmp_path: Path
) -> None:
    """`dump` of the model inside the wrapper, one file per rank (README): the same run as one
    process's on that rank's rows (the wrapper's collectives are not run)."""
    from unihook.recipes import compare_dumps, dump

    framework, _ = ranks  # (the ranks ended)
    fw = child.Framework(framework)
    x, _ = child.batch()
    for rank in range(child.WORLD):
        want = tmp_path / f"one{rank}.npz"
        dump(fw.model(child.weights()), fw.tensor(x[child.rows(rank)]), want)
        report = compare_dumps(runs[framework, False].out / f"dump{rank}.npz", want)
        assert report.ok, str(report)


def test_recipes_watching_no_module_record_nothing(ranks: Any) -> None:
    framework, found = ranks
    for result in found:
        assert result["empty_where"] == {"rows": [], "stats": [], "monitor": []}, framework


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_failing_rank_ends_the_run(framework: str, runs: dict[tuple[str, Any], Run]) -> None:
    """Rank 1 raises while rank 0 waits in the recipes' collective (gloo would let it wait 300
    s): the launcher ends both ranks promptly, with the error, and leaves no process behind.
    Promptly: from the raise to the launcher's end, both written by the child (the seven
    runs start at once, and a bound from the start, 100 s, failed at 110 s on two loaded
    cores, 2026-12-01: their imports)."""
    run = runs[framework, True]
    code, output, _ = run.wait()
    assert code != 0 and "rank 1 fails on purpose" in output
    failed, ended = (float((run.out / f).read_text()) for f in ("failed_at", "ended_at"))
    assert ended - failed < 60
    assert not list(run.out.glob("rank*.pkl"))
    assert not _session_alive(run.process.pid)


def test_what_hooks_see_of_fsdp_parameters(ranks: Any) -> None:
    """Under torch's FSDP, module hooks see the parameters as FSDP leaves them at that moment
    (measured on the first Linear, 8 x 6, 2 ranks; README "Data parallel")."""
    framework, results = ranks
    if framework != "torch":
        pytest.skip("FSDP is torch's")
    for result in results:
        # one FullyShardedDataParallel unit: the full weight inside the model's call; outside,
        # a full-shaped tensor whose storage is freed
        assert result["fsdp1_views"] == {
            "outside": ("Tensor", (8, 6), False),
            "forward_pre": ("Tensor", (8, 6), True),
            "forward": ("Tensor", (8, 6), True),
            "backward": ("Tensor", (8, 6), True),
        }
        # fully_shard: unsharded for forward pre-hooks only; FSDP's own post-forward (and, for
        # a module whose input needs no gradient, post-backward) reshards before unihook's
        # hooks run: a DTensor holding this rank's 4 rows
        assert result["fsdp2_views"] == {
            "outside": ("DTensor", (4, 6), True),
            "forward_pre": ("Parameter", (8, 6), True),
            "forward": ("DTensor", (4, 6), True),
            "backward": ("DTensor", (4, 6), True),
        }


@pytest.mark.parametrize("config", list(child.SHARED_CONFIGS))
def test_shared_outputs_merge_as_one_process(ranks: Any, config: str) -> None:
    """A model with outputs shared by every sample (a positional table broadcast over the
    batch, the same table through a Linear, a module called twice and in a tuple), a
    per-sample copy of a learned token, and per-sample outputs: both recipes report on every
    rank what one process reports on the global batch, with one row per rank, uneven batches,
    a seq-first layout with a GRU, per-rank padded lengths (GradientMonitor; the Linear's rows
    then round otherwise than one process's), the same rows on every rank, the loss computed
    inside the model, an Inf in the shared table."""
    framework, results = ranks
    settings = child.shared_config(config)
    want = child.shared_scenario(child.Framework(framework), config, None)
    first, second = (result["shared"][config] for result in results)
    assert first["stats"] == second["stats"] and first["monitor"] == second["monitor"]
    for rank, result in enumerate(results):
        got = result["shared"][config]
        assert len(got["monitor"]) == len(got["stats"]) == settings["steps"]
        for step in range(settings["steps"]):
            what = f"{framework} {config}, rank {rank}, step {step}"
            _same_norms(got["monitor"][step], want["monitor"][step], f"{what}, GradientMonitor")
            if not settings["stats"]:
                continue  # padded positions change the statistics of one process's batch
            stats, expected = dict(got["stats"][step]), dict(want["stats"][step])
            if settings["loss"]:  # README: a scalar reduced over the batch has no global value
                del stats[""], expected[""]
            _same_stats(stats, expected, f"{what}, ActivationStats")


@pytest.mark.parametrize("how", ["fsdp1", "fsdp2", "sharding"])
def test_shared_outputs_under_sharded_wrappers_merge_as_one_process(ranks: Any, how: str) -> None:
    """The positional model (a table shared by every sample, a per-sample copy, tuples) under
    torch's FSDP (one unit; fully_shard per Linear and the model) and paddle's fleet sharding:
    both recipes as one process on the global batch."""
    framework, results = ranks
    if f"{how}_shared" not in results[0]:
        pytest.skip(f"{how} is not a {framework} setup")
    want = child.shared_scenario(child.Framework(framework), "positional", None)
    for rank, result in enumerate(results):
        got = result[f"{how}_shared"]
        for step in range(child.STEPS):
            what = f"{framework} {how}, rank {rank}, step {step}"
            _same_norms(got["monitor"][step], want["monitor"][step], f"{what}, GradientMonitor")
            stats, expected = dict(got["stats"][step]), dict(want["stats"][step])
            _same_stats(stats, expected, f"{what}, ActivationStats")


def test_two_monitors_on_a_branch_taken_by_some_ranks_pair_their_merges(ranks: Any) -> None:
    """Two GradientMonitors watching different modules of a model whose branch depends on the
    rank's data: their hooks fire in another order on each rank, their merges run in the order
    the recipes were made, and each reports what one process reports on the global batch."""
    framework, results = ranks
    want = child.branches_scenario(child.Framework(framework), None)
    assert set(want["first"]) == {"a", "b"} and set(want["second"]) == {"a", "c"}
    for rank, result in enumerate(results):
        for which in ("first", "second"):
            _same_norms(result["branches"][which], want[which], f"{framework} rank {rank}")
            # the same order on every rank, one process's (each rank reached a module of the
            # branch the other did not: its own backward order first would differ by rank)
            assert list(result["branches"][which]) == list(want[which]), (rank, which)


def test_two_forwards_one_backward_merge_in_the_order_of_the_forwards(ranks: Any) -> None:
    """Two forwards, one backward, rank 1 leaving the second forward's loss term out: its
    parameters' gradients merge that forward there, after the first, as on rank 0 (each rank
    merged them in the order its hooks fired, pairing one forward's numbers with the
    other's), as one process on the rows whose loss counts."""
    framework, results = ranks
    want = child.skipped_loss_scenario(child.Framework(framework), None, 1)
    for rank, result in enumerate(results):
        got = result["skipped_loss"]
        assert len(got) == len(want) == 2, rank
        for entry, expected in zip(got, want):
            _same_norms(dict(entry), dict(expected), f"{framework} rank {rank}")


def test_what_the_ranks_decide_of_each_output(ranks: Any) -> None:
    """The kind the ranks agree on for each output tensor (module, call, position)."""
    from unihook.recipes import _shared as shared

    _, results = ranks
    sample, copy, common, reduced = shared.SAMPLE, shared.COPY, shared.SHARED, shared.REDUCED
    base = {
        ("", 0, 0): sample,
        ("embed", 0, 0): sample,
        ("pos", 0, 0): common,
        ("pos", 1, 0): common,
        ("cls", 0, 0): copy,
        ("mix", 0, 0): common,
        ("act", 0, 0): sample,
        ("act", 1, 0): common,
        ("pair", 0, 0): sample,
        ("pair", 0, 1): common,
        ("head", 0, 0): sample,
    }
    no_copy = {key: kind for key, kind in base.items() if key[0] != "cls"}
    expected = {
        "positional": base,
        "uneven": base,
        "lengths": base,
        "batch1": no_copy,
        "seq_first": {**no_copy, ("rnn", 0, 0): sample, ("rnn", 0, 1): sample},
        "loss_inside": {**base, ("", 0, 0): reduced},
        "same_inputs": {},  # decided anew at each forward: nothing tells data from parameters
    }
    for result in results:
        for config, kinds in expected.items():
            stats, monitor = result["shared"][config]["kinds"]
            assert stats == kinds, config
            # GradientMonitor hooks head's output once for the model returning it
            if not child.shared_config(config)["loss"]:
                kinds = {key: kind for key, kind in kinds.items() if key[0]}
            assert monitor == kinds, config


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_generated_models_merge_as_one_process(
    framework: str, runs: dict[tuple[str, Any], Run]
) -> None:
    """tests/distributed_fuzz.py: random models mixing per-sample and shared outputs (tables
    sliced or computed, a 0-d scale, per-sample copies, tuples, a dead layer, a module called
    on both), batch-first or seq-first, random splits and lengths per rank and per step (one
    row per rank, uneven, a rank without rows on torch), `every` 1 or 2, the loss inside the
    model or not: both recipes report what one process reports on the global batch."""
    code, output, _ = runs[framework, "fuzz"].wait()
    assert code == 0, output[-4000:]
    assert f"{framework} cases {FUZZ_CASES} failures 0" in output, output[-4000:]


@pytest.fixture(scope="module")
def joined(runs: dict[tuple[str, Any], Run]) -> list[dict[str, Any]]:
    """What each torch rank saw of `child.JOIN_SCENARIOS` (a collective waits 20 s at most)."""
    return _results(runs["torch", "join"])


@pytest.mark.parametrize(
    "scenario", ["recipes_first", "monitor_first", "every", "no_sync", "early_buffer", "throw"]
)
def test_recipes_in_join_report_the_batches_run(
    joined: list[dict[str, Any]], scenario: str
) -> None:
    """torch's Join with uneven batches (rank 0: 3, rank 1: 5; `no_sync`: 4 and 6, an SGD step
    every 2, the first under DDP's no_sync; `early_buffer`: 1 and 3, a buffer DDP broadcasts):
    the rank that ran out shadows the recipes' merges,
    and every rank (it too) reports what one process reports over the batches that ran, each
    iteration on the rows of the ranks that still had one (history: one entry per iteration of
    the ranks that ran it); then a step outside the Join merges as before. `throw`
    (throw_on_early_termination): every rank raises when rank 0 runs out, with the numbers of
    the iterations before."""
    config = child.JOIN_SCENARIOS[scenario]
    want = child.join_scenario(child.Framework("torch"), None, **config)
    first, second = (result[scenario] for result in joined)
    for part in ("stats", "monitor", "rows"):  # the same merge on every rank: the same bits
        assert first[part] == second[part], part
    if config.get("throw"):
        assert first["error"] == "RuntimeError: Rank 0 exhausted all inputs."
        assert second["error"].startswith("RuntimeError: Detected at least one rank")
    for rank, got in enumerate((first, second)):
        assert "error" not in got or config.get("throw"), got["error"]
        assert len(got["stats"]) == len(want["stats"]) > 1
        assert len(got["monitor"]) == len(want["monitor"]) == len(want["stats"])
        for step, (stats, norms) in enumerate(zip(want["stats"], want["monitor"])):
            what = f"{scenario}, rank {rank}, step {step}"
            _same_stats(got["stats"][step], stats, f"{what}, ActivationStats")
            _same_norms(got["monitor"][step], norms, f"{what}, GradientMonitor")
        rows = {row["name"]: row for row in got["rows"]}
        _same_stats(rows, {row["name"]: row for row in want["rows"]}, f"{scenario}, rows()")


def test_recipes_after_the_model_in_join_raise_on_every_rank(joined: list[dict[str, Any]]) -> None:
    """``Join([ddp, stats, monitor])``: a rank that ran out would wait in DDP's hook for the
    backward's all-reduces while the others wait in the recipes' merge at the end of the
    forward; every rank raises when the Join is built instead (DDP's `join_hook` finds the
    recipes not listed before it), before any collective."""
    for result in joined:
        got = result["model_first"]
        assert got["error"].startswith(
            "HookArgumentError: unihook (torch): ActivationStats merges the ranks' numbers of "
            "this DistributedDataParallel, so it must be in the list given to torch's Join, "
            "before the model"
        )
        assert got["stats"] == got["monitor"] == []
