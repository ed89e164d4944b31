"""Calibrate in-flight gates on the default workload: precision / recall / savings per setting, with the ceiling.

    nice -n 10 python bench/calibrate_gate.py [--seeds 0 1 2] [--groups 128] [--out docs/gate_table.md]
                                              [--config FILE] [--set section.key=value ...] [--fresh]
                                              [--weights 'runs/NAME-s{seed}/checkpoints/policy.pt']

1. Collect (once per policy and seed, cached under runs/calibration/): `--groups` first-stage groups of
   G = rollout.group_size rollouts of train tasks (drawn by the seed from the allocator's pool), rolled out
   to the end by the real `RolloutStage` with nothing cut, with the policy's warm start for that seed. Every
   step's event (action, done, reward so far, admissible, new observation) and token count is recorded.
   The cache file is keyed by a hash of the policy's weights, so a changed warm start is collected anew.
   `--weights` rolls out with a run's published weights instead of the warm start (`{seed}` in the path is
   each seed's: a policy partway through its run, e.g. a checkpoint of the learn preset's).
2. Replay every group through each gate class (`gates.calibration`): each threshold gate once with a tau
   that never cuts; every (checkpoints, tau) is then a pure function of the recorded values.
3. Print, per gate, K schedule and tau: cuts, precision, recall (positive = zero reward variance over the
   COMPLETE members), fraction of env steps and generated tokens saved, the oracle saving (every
   zero-variance group cut at the first checkpoint) and the cost ratio (env steps per informative group
   kept, gated / ungated). The best setting per gate at precision >= --min-precision is chosen on the
   pooled seeds, and checked by leave-one-seed-out (chosen on two seeds, scored on the third).

`--zero-variance` instead scores the zero-variance gate (issue 57, `gates/zero_variance_offline.py`): its
models fitted on every seed but one at `--min-precision` and scored on the held-out seed (each seed in turn),
per checkpoint: cuts, precision, recall, env steps saved; `--fit-zero-variance FILE.json` also writes the
models fitted on every seed (the gate's `model` option starts from them).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import torch
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gates import build_gate  # noqa: E402
from gates.calibration import (  # noqa: E402
    Checkpoint,
    RecordedGroup,
    Score,
    Scorer,
    checkpoint_values,
    first_cut,
    replay_cut,
)
from gates.combined import combine  # noqa: E402
from pipeline.config import RolloutSection  # noqa: E402
from pipeline.messages import GroupResult, RolloutFailed, StepEvent, TrajectoryStatus  # noqa: E402
from pipeline.profiling import Profiler  # noqa: E402
from pipeline.run import build  # noqa: E402
from pipeline.run.before_cache import weights_digest  # noqa: E402
from pipeline.run.checks import load  # noqa: E402
from pipeline.rundir import configure_logging  # noqa: E402
from stages.rollout import RolloutStage  # noqa: E402

CACHE = Path("runs/calibration")
ROLLOUT = RolloutSection(max_error_rate=1.0)
"""Recording runs every trajectory to the end: no error-rate stop."""
SINGLE_KS = (3, 5, 8, 10, 12, 15, 20)
SCHEDULES = ((5, 10, 15, 20), (8, 12, 16, 20), (10, 15, 20, 25), (5, 10), (10, 20))
TAUS = tuple(round(0.05 * i, 2) for i in range(1, 20))


# --------------------------------------------------------------------------------------------------
# Collection


async def _collect_async(cfg, suite, policy, tasks, seed: int) -> list[RecordedGroup]:
    size = cfg.rollout.group_size
    send, recv = trio.open_memory_channel(10_000)
    stage = RolloutStage(suite, policy, {t.task_id: t for t in tasks}, ROLLOUT, send, profiler=Profiler(enabled=False))
    streams: dict[int, list[StepEvent | RolloutFailed]] = {}
    results: dict[int, GroupResult] = {}
    limit = trio.CapacityLimiter(max(1, cfg.rollout.slots // size))

    async def drain() -> None:
        async for message in recv:
            if isinstance(message, StepEvent | RolloutFailed):
                streams.setdefault(message.group_id, []).append(message)

    async def one(gid: int, task_id: str) -> None:
        async with limit:
            results[gid] = await stage.run_group(gid, task_id, size)
        print(f"\r  seed {seed}: {len(results)}/{len(tasks)} groups", end="", file=sys.stderr, flush=True)

    async with trio.open_nursery() as outer:
        await outer.start(policy.serve)
        async with trio.open_nursery() as inner:
            inner.start_soon(drain)
            async with send, trio.open_nursery() as groups:
                for gid, task in enumerate(tasks):
                    groups.start_soon(one, gid, task.task_id)
        outer.cancel_scope.cancel("collection finished")
    print(file=sys.stderr)
    return [_record(results[gid], streams.get(gid, []), seed) for gid in sorted(results)]


def _record(result: GroupResult, events: list, seed: int) -> RecordedGroup:
    trajectories = sorted(result.trajectories, key=lambda t: t.rollout_index)
    return RecordedGroup(
        task_id=result.task_id,
        seed=seed,
        events=events,
        tokens=[[len(turn.token_ids) for turn in t.turns] for t in trajectories],
        rewards=[t.reward for t in trajectories],
        complete=[t.status == TrajectoryStatus.COMPLETE for t in trajectories],
    )


def _served_key(cfg) -> str | None:
    """A served model's key (a backend with a model directory, e.g. vllm): its safetensors files and the
    policy section (its prompt options shape the rollouts); known before an engine starts. None for torch_tiny."""
    if cfg.policy.backend == "torch_tiny" or not cfg.policy.model:
        return None
    digest = hashlib.sha256(msgspec.json.encode(cfg.policy))
    for path in sorted(Path(cfg.policy.model).glob("*.safetensors")):
        with path.open("rb") as f:
            for block in iter(lambda f=f: f.read(1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()[:12]


def collect(overrides: Sequence[str], seed: int, n_groups: int, fresh: bool, config: str | None = None,
            weights: str | None = None) -> list[RecordedGroup]:
    cfg = load(config, [*overrides, f"run.seed={seed}"])
    torch.set_num_threads(cfg.run.torch_threads)  # as run_job: one intra-op thread unless configured
    suite = build.suite(cfg)
    key = _served_key(cfg)
    policy = build.policy(cfg, suite, workers=1) if key is None else None  # in this process, whatever policy.workers says
    if weights is not None:
        if policy is None:
            raise SystemExit("--weights is for the embedded policy (a served model's weights are its folder)")
        blob = Path(weights.format(seed=seed)).read_bytes()  # a run's checkpoints/policy.pt: tensors only
        policy.load_weights(1, torch.load(io.BytesIO(blob), weights_only=True))
        key = "w" + hashlib.sha256(blob).hexdigest()[:11]
    path = CACHE / f"groups-{cfg.env.name}-seed{seed}-n{n_groups}-{key or weights_digest(policy.trainable())[:12]}.msgpack"
    if path.exists() and not fresh:
        print(f"  seed {seed}: cached {path}", file=sys.stderr)
        return msgspec.msgpack.decode(path.read_bytes(), type=list[RecordedGroup])
    policy = policy or build.policy(cfg, suite, workers=1)
    pool = list(suite.tasks("train"))
    pool = pool[: cfg.env.train_tasks] if cfg.env.train_tasks else pool
    tasks = random.Random(seed).sample(pool, n_groups)
    try:
        groups = trio.run(_collect_async, cfg, suite, policy, tasks, seed)
    finally:
        policy.close()  # a served model's engine (vLLM) shuts down here (`Policy.close`)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.msgpack.encode(groups))
    print(f"  seed {seed}: wrote {path}", file=sys.stderr)
    return groups



# --------------------------------------------------------------------------------------------------
# Evaluation (pure functions of the recorded groups)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A threshold gate to calibrate: registered name, constructor options, schedules and taus to try."""

    gate: str
    options: dict
    schedules: tuple[tuple[int, ...], ...]
    taus: tuple[float, ...]

    def label(self) -> str:
        opts = " ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.gate}{' ' + opts if opts else ''}"

    def build(self, ks: Sequence[int], tau: float):
        return build_gate(self.gate, {**self.options, "k": ks[0], "tau": tau, "checkpoints": list(ks)})


@dataclass(frozen=True, slots=True)
class Row:
    gate: str
    ks: tuple[int, ...]
    tau: float | tuple[float, ...]
    score: Score

    def setting(self) -> str:
        return f"{self.gate} K={','.join(map(str, self.ks))} tau={self.tau}"


TAUS = tuple(round(0.05 * i, 2) for i in range(1, 20))
PREFIX_SCHEDULES = ((3,), (5,), (8,), (10,), (12,), (15,), (20,), (5, 10), (10, 20), (5, 10, 15, 20), (10, 15, 20, 25))
STALL_SCHEDULES = ((5,), (8,), (10,), (12,), (15,), (20,), (5, 10, 15, 20), (10, 15, 20), (10, 15, 20, 25), (8, 12, 16, 20))


def default_candidates() -> list[Candidate]:
    return [
        Candidate("prefix_edit_distance", {}, PREFIX_SCHEDULES, TAUS),
        *(Candidate("stall", {"window": w}, STALL_SCHEDULES, TAUS) for w in (3, 5, 8)),
    ]


def never_cut_values(c: Candidate, groups: Sequence[RecordedGroup]) -> list[list[Checkpoint]]:
    """[N groups][evaluations]: the candidate's value at every checkpoint of every schedule (one replay)."""
    ks = sorted({k for schedule in c.schedules for k in schedule})
    return [checkpoint_values(c.build(ks, 0.0), g) for g in groups]


def sweep(name: str, scorer: Scorer, values: Sequence[Sequence[Checkpoint]], schedules, taus) -> list[Row]:
    rows = []
    for ks in schedules:
        for tau in taus:
            cuts = [first_cut(v, tau, ks) for v in values]
            rows.append(Row(name, ks, tau, scorer.score(cuts, oracle_k=min(ks))))
    return rows


def combined_values(a: Sequence[Checkpoint], b: Sequence[Checkpoint], tau_a: float, tau_b: float, mode: str) -> list[Checkpoint]:
    """What `gates.combined` computes from two members' checkpoint values (cut iff value < 1)."""
    by_k = {c.k: c for c in b}
    return [Checkpoint(max(ca.event, by_k[ca.k].event), ca.k, combine([ca.value, by_k[ca.k].value], [tau_a, tau_b], mode))
            for ca in a if ca.k in by_k]


def sweep_combined(a: Candidate, b: Candidate, scorer: Scorer, va, vb, mode: str) -> list[Row]:
    schedules = [ks for ks in a.schedules if ks in b.schedules]
    rows = []
    for ta in a.taus:
        for tb in b.taus:
            values = [combined_values(x, y, ta, tb, mode) for x, y in zip(va, vb, strict=True)]
            for ks in schedules:
                cuts = [first_cut(v, 1.0, ks) for v in values]
                rows.append(Row(f"{mode}_of({a.label()}, {b.label()})", ks, (ta, tb), scorer.score(cuts, oracle_k=min(ks))))
    return rows


def best(rows: Sequence[Row], min_precision: float) -> Row | None:
    """The row that saves most env steps at precision >= min_precision (ties: lower cost ratio)."""
    ok = [r for r in rows if r.score.precision is not None and r.score.precision >= min_precision]
    return max(ok, key=lambda r: (round(r.score.steps_saved, 4), -(r.score.cost_ratio or 9.0)), default=None)


def _f(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{x:.0%}" if pct else f"{x:.2f}"


HEADER = ("| setting | cuts | TP | FP | precision | recall | env steps saved | tokens saved | oracle | cost ratio |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def fmt_row(row: Row) -> str:
    s = row.score
    return (f"| {row.setting()} | {s.cuts} | {s.tp} | {s.fp} | {_f(s.precision)} | {_f(s.recall)} | "
            f"{_f(s.steps_saved, True)} | {_f(s.tokens_saved, True)} | {_f(s.oracle_steps_saved, True)} | {_f(s.cost_ratio)} |")


@dataclass(frozen=True, slots=True)
class Family:
    """One gate family to sweep: `rows(indices)` scores its whole grid on those groups, `gate(row)` builds
    the real gate of a row (to check the offline sweep against a replay of the gate itself)."""

    label: str
    rows: Callable[[Sequence[int]], list[Row]]
    gate: Callable[[Row], object]


def families(groups: Sequence[RecordedGroup], candidates: Sequence[Candidate], combine_pairs: bool) -> list[Family]:
    values = {c.label(): never_cut_values(c, groups) for c in candidates}

    def single(c: Candidate) -> Family:
        v = values[c.label()]
        return Family(c.label(), lambda idx: sweep(c.label(), Scorer([groups[i] for i in idx]), [v[i] for i in idx], c.schedules, c.taus),
                      lambda row: c.build(row.ks, row.tau))

    def pair(a: Candidate, b: Candidate, mode: str) -> Family:
        va, vb = values[a.label()], values[b.label()]

        def gate(row: Row):
            members = [{"name": a.gate, "tau": row.tau[0], **a.options}, {"name": b.gate, "tau": row.tau[1], **b.options}]
            return build_gate(f"{mode}_of", {"k": row.ks[0], "tau": 1.0, "checkpoints": list(row.ks), "gates": members})

        return Family(f"{mode}_of({a.label()}, {b.label()})",
                      lambda idx: sweep_combined(a, b, Scorer([groups[i] for i in idx]), [va[i] for i in idx], [vb[i] for i in idx], mode),
                      gate)

    out = [single(c) for c in candidates]
    if combine_pairs:
        prefix = [c for c in candidates if c.gate == "prefix_edit_distance"]
        others = [c for c in candidates if c.gate != "prefix_edit_distance"]
        out += [pair(p, o, mode) for p in prefix for o in others for mode in ("all", "any")]
    return out


def check_against_real_gate(family: Family, row: Row, groups: Sequence[RecordedGroup]) -> None:
    """The offline sweep must agree with a replay of the real configured gate (every group's cut and savings)."""
    cuts = [replay_cut(family.gate(row), g) for g in groups]
    real = Scorer(groups).score(cuts, oracle_k=min(row.ks))
    if real != row.score:
        raise AssertionError(f"offline sweep and the real gate disagree for {row.setting()}: {row.score} vs {real}")


def summary_line(groups: Sequence[RecordedGroup]) -> str:
    labels = [g.label() for g in groups]
    per_rollout = sum(sum(g.lengths()) for g in groups) / sum(g.size for g in groups)
    all_fail = sum(1 for g, x in zip(groups, labels, strict=True) if x and max(g.rewards) == 0)
    return (f"{len(groups)} groups (seeds {sorted({g.seed for g in groups})}), G={groups[0].size}: "
            f"{sum(1 for x in labels if x)} zero-variance ({all_fail} all-fail), {sum(1 for x in labels if x is False)} mixed, "
            f"{sum(1 for x in labels if x is None)} unlabelled; {per_rollout:.1f} env steps per rollout on average")


def report(groups: Sequence[RecordedGroup], fams: Sequence[Family], min_precision: float) -> str:
    everything = list(range(len(groups)))
    out = [summary_line(groups)]
    chosen = [HEADER]
    loso = ["| gate | held-out seed | chosen on the other seeds | precision | recall | env steps saved | cost ratio |",
            "|---|---|---|---|---|---|---|"]
    for fam in fams:
        rows = fam.rows(everything)
        out += ["", f"### {fam.label}: best per schedule at precision >= {min_precision}", HEADER]
        for ks in dict.fromkeys(r.ks for r in rows):
            row = best([r for r in rows if r.ks == ks], min_precision)
            out.append(fmt_row(row) if row else f"| {fam.label} K={','.join(map(str, ks))}: none reaches it | | | | | | | | | |")
        top = best(rows, min_precision)
        if top is not None:
            check_against_real_gate(fam, top, groups)
            chosen.append(fmt_row(top))
            if isinstance(top.tau, float):
                out += ["", f"tau sweep at K={','.join(map(str, top.ks))}:", HEADER]
                out += [fmt_row(r) for r in rows if r.ks == top.ks and r.score.cuts]
        loso += _leave_one_seed_out(fam, groups, min_precision)
    out += ["", f"### Chosen per gate (most env steps saved at precision >= {min_precision}; checked against a replay of the real gate)",
            *chosen, "", "### Leave one seed out (choose on two seeds, score on the third)", *loso]
    return "\n".join(out)


def _leave_one_seed_out(fam: Family, groups: Sequence[RecordedGroup], min_precision: float) -> list[str]:
    lines = []
    seeds = sorted({g.seed for g in groups})
    for held in seeds:
        fit = [i for i, g in enumerate(groups) if g.seed != held]
        test = [i for i, g in enumerate(groups) if g.seed == held]
        top = best(fam.rows(fit), min_precision)
        if top is None:
            lines.append(f"| {fam.label} | {held} | none reaches precision {min_precision} | | | | |")
            continue
        s = next(r.score for r in fam.rows(test) if r.ks == top.ks and r.tau == top.tau)
        lines.append(f"| {fam.label} | {held} | K={','.join(map(str, top.ks))} tau={top.tau} | {_f(s.precision)} | "
                     f"{_f(s.recall)} | {_f(s.steps_saved, True)} | {_f(s.cost_ratio)} |")
    return lines


def zero_variance_report(groups: Sequence[RecordedGroup], cfg, min_precision: float, out: Path | None) -> str:
    """The zero_variance gate left one seed out: fitted on the other seeds' groups, scored on this seed's (with
    one seed: its even-numbered groups against its odd ones, then the other way round, named seed.0 / seed.1)."""
    from gates.zero_variance import ZeroVarianceGate
    from gates.zero_variance_offline import fit_offline, replay, score_offline

    suite = build.suite(cfg)
    tasks = {t.task_id: t for t in suite.tasks("train")}
    options = ZeroVarianceGate.Options(min_precision=min_precision)
    seeds = sorted({g.seed for g in groups})
    by_seed = {s: [g for g in groups if g.seed == s] for s in seeds}
    if len(seeds) == 1:  # two folds of the one seed
        only = by_seed.pop(seeds[0])
        by_seed = {f"{seeds[0]}.{half}": only[half::2] for half in (0, 1)}
        seeds = sorted(by_seed)
    replayed = {s: replay(by_seed[s], tasks, options) for s in seeds}
    lines = [f"zero_variance gate, min_precision {min_precision}, fitted on the other seeds, scored on each:",
             "| seed | k | cuts | precision | recall | env steps saved |", "|---|---|---|---|---|---|"]
    for held in seeds if len(seeds) > 1 else []:
        train = [r for s in seeds if s != held for r in replayed[s][0]]
        saved = fit_offline(train, replayed[held][1], options)
        scores, total = score_offline(saved, by_seed[held], replayed[held][0])
        for k, sc in scores.items():
            precision = f"{sc.true_positive / sc.cut:.2f}" if sc.cut else "-"
            recall = f"{sc.true_positive / sc.positives:.2f}" if sc.positives else "-"
            lines.append(f"| {held} | {k} | {sc.cut} | {precision} | {recall} | {sc.steps_saved / total:.1%} |")
    if out is not None:
        saved = fit_offline([r for s in seeds for r in replayed[s][0]], replayed[seeds[0]][1], options)
        out.write_bytes(msgspec.json.encode(saved))
        lines.append(f"models fitted on seeds {seeds} written to {out}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--groups", type=int, default=96, help="groups per seed")
    parser.add_argument("--min-precision", type=float, default=0.8)
    parser.add_argument("--no-combinations", action="store_true", help="skip the all_of / any_of sweeps (slow)")
    parser.add_argument("--out", type=Path, default=None, help="also write the tables (markdown) here")
    parser.add_argument("--fresh", action="store_true", help="collect again even if a recording is cached")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override, as run.py")
    parser.add_argument("--config", help="TOML config file, as run.py (e.g. configs/smollm2.toml)")
    parser.add_argument("--weights", help="roll out with these weights (a run's checkpoints/policy.pt; {seed}: each seed's)")
    parser.add_argument("--zero-variance", action="store_true", help="score the zero_variance gate, leave one seed out")
    parser.add_argument("--fit-zero-variance", type=Path, help="write its models fitted on every seed (JSON)")
    args = parser.parse_args(argv)
    configure_logging(None)
    groups = [g for seed in args.seeds
              for g in collect(args.overrides, seed, args.groups, args.fresh, args.config, args.weights)]
    if args.zero_variance or args.fit_zero_variance:
        text = zero_variance_report(groups, load(args.config, args.overrides), args.min_precision, args.fit_zero_variance)
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
        return
    text = report(groups, families(groups, default_candidates(), not args.no_combinations), args.min_precision)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
