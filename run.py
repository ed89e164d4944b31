"""rollcut command line.

    python run.py                                  # the embedded default: household env + tiny torch policy, CPU
    python run.py --config configs/ab_gate_off.toml
    python run.py --set gate.enabled=false --set run.name=ungated
    python run.py pretrain                         # behaviour-clone (or load the cached) warm start, report held-out success
    python run.py profile runs/default             # print the per-stage table of an existing run
    python run.py check --config FILE.toml         # validate a config and print it resolved
    python run.py make-model models/tiny-llama     # a small local Llama + tokenizer for policy.backend=vllm

Exit codes: 0 done, 2 bad configuration or usage, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="run.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="train", choices=["train", "pretrain", "profile", "check"])
    parser.add_argument("run_dir", nargs="?", help="run folder (for `profile`)")
    parser.add_argument("--config", help="TOML config file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--out", help="parent folder of run folders (same as --set run.out=DIR)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["make-model"]:
        from stages.policy.vllm import make_model_main

        return make_model_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "profile":
        return _profile(args.run_dir)
    if args.run_dir is not None:
        print(f"run.py {args.command}: unexpected argument {args.run_dir!r}", file=sys.stderr)
        return 2

    import trio

    from pipeline.config import ConfigError, dump_toml
    from pipeline.job import load, run_job

    overrides = list(args.overrides) + ([f"run.out={_toml_str(args.out)}"] if args.out else [])
    try:
        cfg = load(args.config, overrides)
    except ConfigError as exc:
        print(f"run.py: {exc}", file=sys.stderr)
        return 2
    if args.command == "check":
        print(dump_toml(cfg))
        return 0
    try:
        if args.command == "pretrain":
            trio.run(_pretrain, cfg)
        else:
            result = trio.run(run_job, cfg)
            print(f"\nrun folder: {result.run_dir}\n")
            print((result.run_dir / "summary.md").read_text())
    except (KeyboardInterrupt, BaseExceptionGroup) as exc:
        # Trio delivers Ctrl-C inside the root nursery, so it may arrive wrapped in an exception group.
        if isinstance(exc, BaseExceptionGroup) and exc.subgroup(KeyboardInterrupt) is None:
            raise
        print("\nrun.py: interrupted; every stage was cancelled and closed", file=sys.stderr)
        return 130
    return 0


async def _pretrain(cfg) -> None:  # noqa: ANN001
    import trio

    from pipeline.job import build_policy, build_suite, evaluate_heldout, heldout_tasks
    from pipeline.rundir import configure_logging

    configure_logging(None)
    suite = build_suite(cfg)
    policy = await trio.to_thread.run_sync(build_policy, cfg, suite)
    for split, report in (await evaluate_heldout(policy, suite, heldout_tasks(cfg, suite), cfg.eval.greedy)).items():
        families = ", ".join(f"{f} {v:.0%}" for f, v in sorted(report.per_family.items()))
        print(f"{split}: success {report.success:.1%} over {len(report.episodes)} tasks ({families})")


def _profile(run_dir: str | None) -> int:
    if run_dir is None:
        print("run.py profile: give a run folder, e.g. `python run.py profile runs/default`", file=sys.stderr)
        return 2
    from pipeline.profiling import load_report

    try:
        report = load_report(Path(run_dir))
    except FileNotFoundError as exc:
        print(f"run.py profile: {exc}", file=sys.stderr)
        return 2
    print(report.table_markdown())
    return 0


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


if __name__ == "__main__":
    sys.exit(main())
