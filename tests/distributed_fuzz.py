"""The generated attack on the recipes' data-parallel merge (README "Per sample or shared"):
random models (per-sample Linear / Tanh / ReLU layers, a dead ReLU layer, positional tables
sliced or computed from a parameter, a table without a batch dimension, a 0-d scale, a
per-sample copy of a token, tuples, a module called on per-sample and on shared tensors, an
embedding of timesteps drawn with the same seed on every rank: per sample, equal on every
rank), in
batch-first or seq-first layout, with random batch splits and lengths per rank and per step
(one row per rank, uneven, a rank without rows on torch, per-rank padding), `every=1` or 2,
the loss inside the model (0-d or `[1]`) or not: both recipes on `WORLD` gloo ranks against one
process on the global batch (the ranks' rows side by side, padded with loss coefficients 0).

    python tests/distributed_fuzz.py {torch|paddle} OUTDIR CASES SEED [--same-inputs]

Exits 1 when a case differs. `--same-inputs` also generates ranks given the same rows, where
README's rule 4 decides by shapes alone (reported apart, as documented). UNIHOOK_FUZZ_WORLD
sets the number of ranks (2). A case where README says the ranks cannot tell is excused only
in the modules that condition is about (`_excused`), never where the ranks disagree or the
entries differ from one process's.
"""

from __future__ import annotations

import os
import pickle
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import distributed_child as c  # noqa: E402

from unihook.recipes import ActivationStats, GradientMonitor  # noqa: E402

F, D = 3, 4
LR = 0.05
WORLD = int(os.environ.get("UNIHOOK_FUZZ_WORLD", "2"))


def spec(rng: np.random.Generator, framework: str, same: bool) -> dict[str, Any]:
    found = _spec(rng, framework, same)
    steps = []  # each step its own split and lengths (a last partial batch, per-step padding)
    for _ in range(found["steps"]):
        if rng.random() < 0.5 and not found["same"]:
            other = _spec(rng, framework, same)
            steps.append((other["batches"], other["lengths"]))
        else:
            steps.append((found["batches"], found["lengths"]))
    found["per_step"] = steps
    if any(min(b) < 2 for b, _ in steps):
        found["blocks"] = [b for b in found["blocks"] if b not in ("copy", "dead", "zeros")]
        found["blocks"] = found["blocks"] or ["linear"]
    if any(max(b) < 2 for b, _ in steps):  # (README: equal on every rank at one row per rank)
        found["blocks"] = [b for b in found["blocks"] if b != "temb"] or ["linear"]
    return found


def _spec(rng: np.random.Generator, framework: str, same_inputs: bool) -> dict[str, Any]:
    seq = bool(rng.random() < 0.3)
    batches = [int(rng.choice([1, 2, 3, 5])) for _ in range(WORLD)]
    if rng.random() < 0.4:
        batches = [batches[0]] * WORLD
    elif rng.random() < 0.15 and framework == "torch":  # (paddle 3.3.1 cannot backward those)
        batches[int(rng.integers(WORLD))] = 0  # a rank without rows
    lengths = [int(rng.choice([2, 4, 5])) for _ in range(WORLD)]
    if rng.random() < 0.6:
        lengths = [lengths[0]] * WORLD
    same = same_inputs and rng.random() < 0.15 and len(set(batches)) == 1 and len(set(lengths)) == 1
    allowed = ["linear", "act", "table", "gen", "pair", "mix", "relu", "scale"]
    if not seq and min(batches) >= 2:
        # (README: a per-sample copy at one row per rank or seq-first; an output equal on
        # every rank at one row per rank; a zero table in a seq-first model)
        allowed += ["copy", "dead", "zeros", "temb"]
    blocks = [str(b) for b in rng.choice(allowed, size=int(rng.integers(2, 7)))]
    return {
        "seq": seq,
        "batches": batches,
        "lengths": lengths,
        "same": same,
        "blocks": blocks,
        "reuse": bool(rng.random() < 0.5),  # one act module for every "act" block
        "loss": bool(rng.random() < 0.2),
        "loss_shape": [(), (1,)][int(rng.integers(2))],  # (paddle code often returns [1])
        "every": int(rng.choice([1, 1, 2])),
        "steps": 3,
    }


def build(fw: c.Framework, s: dict[str, Any]) -> Any:
    torch_ = fw.name == "torch"
    nn = fw.t.nn if torch_ else fw.p.nn
    base = nn.Module if torch_ else nn.Layer
    seq = s["seq"]
    longest = max(max(lengths) for _, lengths in s["per_step"]) + 1

    def parameter(owner: Any, shape: tuple[int, ...]) -> Any:
        if torch_:
            return fw.t.nn.Parameter(fw.t.zeros(shape))
        return owner.create_parameter(list(shape))

    class Table(base):  # [1, S, D] / [S, 1, D]: a slice of a parameter
        def __init__(self) -> None:
            super().__init__()
            self.w = parameter(self, (longest, 1, D) if seq else (1, longest, D))

        def forward(self, x: Any) -> Any:
            return self.w[: x.shape[0]] if seq else self.w[:, : x.shape[1]]

    class Gen(base):  # computed from a parameter: Linear(seed) [1, S, D] / [S, 1, D]
        def __init__(self) -> None:
            super().__init__()
            self.seed = parameter(self, (longest, 1, D) if seq else (1, longest, D))
            self.lin = nn.Linear(D, D)

        def forward(self, x: Any) -> Any:
            part = self.seed[: x.shape[0]] if seq else self.seed[:, : x.shape[1]]
            return self.lin(part)

    class Mix(base):  # [S, D], no batch dim at all (broadcast over the batch)
        def __init__(self) -> None:
            super().__init__()
            self.w = parameter(self, (longest, D))

        def forward(self, x: Any) -> Any:
            if seq:  # [S, 1, D]
                return self.w[: x.shape[0]].unsqueeze(1)
            return self.w[: x.shape[1]]

    class Copy(base):  # [B, 1, D]: a learned token repeated per sample
        def __init__(self) -> None:
            super().__init__()
            self.t = parameter(self, (1, 1, D))

        def forward(self, x: Any) -> Any:
            shape = (x.shape[0], 1, D)
            return self.t.expand(*shape) if torch_ else self.t.expand(list(shape))

    class Scale(base):  # a 0-d parameter: shared
        def __init__(self) -> None:
            super().__init__()
            self.s = parameter(self, ())

        def forward(self) -> Any:
            return self.s

    class Dead(base):  # zeros for every sample: a dead ReLU layer
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(D, D)
            self.relu = nn.ReLU()

        def forward(self, h: Any) -> Any:
            return self.relu(self.lin(h) - 1000.0)

    class Pair(base):
        def forward(self, a: Any, b: Any) -> Any:
            return a * 1.25, b * 0.75

    class Temb(base):  # timesteps [B] -> [B, 1, D]: per sample, equal on every rank
        def __init__(self) -> None:
            super().__init__()
            self.inp, self.act, self.out = nn.Linear(1, D), nn.Tanh(), nn.Linear(D, D)

        def forward(self, t: Any) -> Any:
            return self.out(self.act(self.inp(t.reshape([-1, 1, 1]))))

    class Net(base):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(F, D)
            self.shared_act = nn.Tanh()
            layers = []
            for kind in s["blocks"]:
                if kind == "linear":
                    layers.append(nn.Linear(D, D))
                elif kind == "act":
                    layers.append(self.shared_act if s["reuse"] else nn.Tanh())
                elif kind == "relu":
                    layers.append(nn.ReLU())
                elif kind == "table":
                    layers.append(Table())
                elif kind == "gen":
                    layers.append(Gen())
                elif kind == "mix":
                    layers.append(Mix())
                elif kind == "copy":
                    layers.append(Copy())
                elif kind == "pair":
                    layers.append(Pair())
                elif kind == "scale":
                    layers.append(Scale())
                elif kind == "dead":
                    layers.append(Dead())
                elif kind == "zeros":
                    layers.append(Table())
                elif kind == "temb":
                    layers.append(Temb())
                else:
                    raise ValueError(kind)
            self.blocks = nn.LayerList(layers) if not torch_ else nn.ModuleList(layers)
            self.head = nn.Linear(D, 2)

        def forward(self, x: Any, coefficients: Any = None, t: Any = None) -> Any:
            h = self.embed(x)
            shared = None
            for kind, layer in zip(s["blocks"], self.blocks):
                if kind in ("linear", "act", "relu"):
                    h = layer(h)
                elif kind in ("table", "gen", "mix"):
                    shared = layer(x)
                    h = h + shared
                elif kind in ("copy", "zeros"):
                    h = h + layer(x)
                elif kind == "scale":
                    h = h * layer()
                elif kind == "dead":
                    h = h + layer(h)
                elif kind == "temb":
                    h = h + layer(t)
                elif kind == "pair":
                    other = shared if shared is not None else h
                    a, b = layer(h, other)
                    h = a + b
            if shared is not None and s["reuse"]:
                h = h + self.shared_act(shared)  # the shared act also on a shared tensor
            out = self.head(h)
            if coefficients is None:
                return out
            loss = (out * coefficients).sum()
            return loss.reshape(list(s.get("loss_shape", ())))

    model = Net()
    rng = np.random.default_rng(11)
    zeros = {
        id(p)
        for kind, layer in zip(s["blocks"], model.blocks)
        if kind == "zeros"
        for p in layer.parameters()
    }
    for param in model.parameters():
        value = rng.normal(0, 0.6, tuple(param.shape)).astype(np.float32)
        if id(param) in zeros:
            value[...] = 0
        if torch_:
            with fw.t.no_grad():
                param.copy_(fw.t.from_numpy(value))
        else:
            param.set_value(value)
    return model


def _timesteps(s: dict[str, Any], rank: int | None, step: int) -> np.ndarray:
    """Each rank's timesteps drawn with the same seed (the first of one stream: equal on every
    rank where the batches are), the global batch's the ranks' side by side."""
    batches = s["per_step"][step][0]
    stream = np.random.default_rng(1000 + step).random(max(batches)).astype(np.float32)
    if rank is not None:
        return stream[: batches[rank]]
    return np.concatenate([stream[:b] for b in batches])


def _data(s: dict[str, Any], rank: int | None, step: int) -> tuple[np.ndarray, np.ndarray]:
    batches, lengths = s["per_step"][step]
    rng = np.random.default_rng(len(s["blocks"]) * 7 + sum(batches) + 100 * step)
    total, longest = sum(batches), max(lengths)
    x = rng.normal(0, 1, (total, longest, F)).astype(np.float32)
    co = rng.normal(0, 1, (total, longest, 2)).astype(np.float32)
    if s["same"]:
        for r in range(1, len(batches)):
            x[r * batches[0] : (r + 1) * batches[0]] = x[: batches[0]]
            co[r * batches[0] : (r + 1) * batches[0]] = co[: batches[0]]
    return c.rank_rows(x, co, batches, lengths, rank, s["seq"])


def run(fw: c.Framework, s: dict[str, Any], rank: int | None) -> dict[str, Any]:
    model = build(fw, s)
    wrapped = model if rank is None else fw.wrap(model)
    optimizer = fw.optimizer(wrapped, LR if rank is not None else LR / WORLD)
    every = s.get("every", 1)
    with (
        ActivationStats(wrapped, every=every) as stats,
        GradientMonitor(wrapped, every=every) as monitor,
    ):
        for step in range(s["steps"]):
            x, co = _data(s, rank, step)
            extra = {"t": fw.tensor(_timesteps(s, rank, step))} if "temb" in s["blocks"] else {}
            if s["loss"]:
                loss = wrapped(fw.tensor(x), fw.tensor(co), **extra)
            else:
                loss = (wrapped(fw.tensor(x), **extra) * fw.tensor(co)).sum()
            loss.backward()
            optimizer.step()
            fw.zero_grad(optimizer)
        return {
            "stats": stats.history,
            "monitor": list(monitor.history),
            "kinds": dict(monitor._slots.kinds),
        }


def rank_main(
    rank: int, framework: str, out: str, port: int, cases: int, seed: int, same: bool
) -> None:
    warnings.filterwarnings("ignore")
    fw = c.Framework(framework)
    if framework == "torch":
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
        )
    else:
        import paddle.distributed as pdist

        pdist.init_parallel_env()
        rank = pdist.get_rank()
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(cases):
        s = spec(rng, framework, same)
        found.append((s, run(fw, s, rank)))
    with open(f"{out}/rank{rank}.pkl", "wb") as f:
        pickle.dump(found, f)
    if framework == "torch":
        c.close_torch_rank()


def _paddle(framework: str, out: str, port: int, cases: int, seed: int, same: bool) -> None:
    rank_main(-1, framework, out, port, cases, seed, same)


def _differing(got: Any, want: Any, compare: Any) -> set[str]:
    """The modules whose numbers in one history entry differ from one process's ("*" where
    the entries name other modules)."""
    if sorted(got) != sorted(want):
        return {"*"}
    differing = set()
    for name in want:
        try:
            compare({name: got[name]}, {name: want[name]}, name)
        except AssertionError:
            differing.add(name)
    return differing


def _excused(s: dict[str, Any], want: dict[str, Any]) -> tuple[set[str] | None, str]:
    """The modules whose numbers README "Per sample or shared" says the ranks cannot get right
    in case `s` (None: any module), and why; an empty set where it says nothing."""
    # the same inputs on every rank (the shapes decide)
    if s["same"]:
        return None, "the same inputs"
    # a dead data path (no gradient reaches the embedding: every output is a function of the
    # parameters alone, a per-sample one too) with one row on a rank or a seq-first layout
    dead = any(not entry.get("embed") for entry in want["monitor"])
    one_row = any(min(batches) < 2 for batches, _ in s["per_step"])
    if dead and (s["seq"] or one_row):
        return None, "a dead data path"
    excused: set[str] = set()
    why = []
    # a loss of shape [1] where every rank has one row (a per-sample output's shape): the
    # model's own output
    if s["loss"] and s["loss_shape"] and any(max(b) == 1 for b, _ in s["per_step"]):
        excused.add("")
        why.append("a [1] loss at one row per rank")
    # timesteps equal on every rank while their batches differ (their prefixes are): the
    # timestep embedding's modules
    if "temb" in s["blocks"] and any(len(set(b)) > 1 for b, _ in s["per_step"]):
        why.append("timesteps equal on every rank")
        for i, kind in enumerate(s["blocks"]):
            if kind == "temb":
                excused |= {f"blocks.{i}{part}" for part in ("", ".inp", ".act", ".out")}
    # a shared table `[S, D]` whose S is every rank's batch, its module given the same tensors
    # on every rank while the timesteps are equal on every rank: the shared act on a Mix's
    # output (the last table the blocks made)
    tables = [kind for kind in s["blocks"] if kind in ("table", "gen", "mix")]
    if (
        "temb" in s["blocks"]
        and s["reuse"]
        and tables[-1:] == ["mix"]
        and any(b == lengths for b, lengths in s["per_step"])
    ):
        excused.add("shared_act")
        why.append("an [S, D] table with S the batch beside equal timesteps")
    return excused, ", ".join(why)


def check(framework: str, out: str) -> int:
    import test_distributed as t

    def close(a: Any, b: Any, what: str) -> None:  # float32 sums over different splits
        if a is None or b is None:
            assert a is None and b is None, what
            return
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=what)

    t.close = close

    fw = c.Framework(framework)
    got = [pickle.load(open(f"{out}/rank{r}.pkl", "rb")) for r in range(WORLD)]
    failures = documented = 0
    for (s, first), (_, second) in zip(got[0], got[-1]):
        want = run(fw, s, None)
        # Every rank reports the same, and as many entries as one process: never excused.
        problem = ""
        if first["stats"] != second["stats"] or first["monitor"] != second["monitor"]:
            problem = "the ranks differ"
        elif len(first["monitor"]) != len(want["monitor"]):
            problem = "monitor entries"
        elif len(first["stats"]) != len(want["stats"]):
            problem = "stats entries"
        differing: set[str] = set()
        for step in range(len(want["monitor"]) if not problem else 0):
            differing |= _differing(first["monitor"][step], want["monitor"][step], t._same_norms)
            lengths = s["per_step"][step * s["every"]][1]
            if len(set(lengths)) == 1:  # padded rows change one process's stats
                a, b = dict(first["stats"][step]), dict(want["stats"][step])
                if s["loss"]:
                    del a[""], b[""]
                differing |= _differing(a, b, t._same_stats)
        if not problem and not differing:
            continue
        excused, why = _excused(s, want)
        # Excused per module: only the modules the documented condition is about
        if not problem and (excused is None or differing <= excused):
            documented += 1
            print("DOCUMENTED", why, sorted(differing), s)
            continue
        failures += 1
        print("FAIL", problem or sorted(differing), s, first["kinds"])
    print(
        framework,
        "cases",
        len(got[0]),
        "failures",
        failures,
        f"({documented} off as README documents, only in the modules it is about: the same "
        "inputs, a dead data path, a [1] loss at one row per rank, timesteps equal on every "
        "rank while their batches differ, an [S, D] table with S the batch beside equal "
        "timesteps)",
    )
    return failures


if __name__ == "__main__":
    same = "--same-inputs" in sys.argv
    framework, out, cases_, seed_ = (a for a in sys.argv[1:] if a != "--same-inputs")
    cases, seed = int(cases_), int(seed_)
    os.makedirs(out, exist_ok=True)
    port = c.run_port()
    # (as many processes as the world the ranks join: with the harness's own 2, a world of 3
    # waited for its third rank forever)
    if framework == "torch":
        c.spawn(rank_main, (framework, out, port, cases, seed, same), framework, port, WORLD)
    else:
        c.spawn(_paddle, (framework, out, 0, cases, seed, same), framework, port, WORLD)
    sys.exit(1 if check(framework, out) else 0)
