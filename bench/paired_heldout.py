"""Held-out success of two measures paired by task: which tasks one won and the other did not.

    python bench/paired_heldout.py --before warm.json --after runs/smollm2-choose
    python bench/paired_heldout.py --before runs/a:after --after runs/b:after

Each side is an episodes file, `FILE[:before|after]`: a run's `heldout_episodes.json` (its measures before and
after GRPO; the run folder names it) or what `run.py pretrain --episodes FILE` writes (one measure, as `before`). `--before` reads
`before` and `--after` reads `after` unless told otherwise. The tasks measured on both sides (matched by split
and task id) are compared: the change in success with the Student-t 95 % interval of the per-task differences
(`pipeline/run/summary.py` `paired_change`, what a run's `summary.json` `heldout_change` holds), the tasks gained
and lost, and the same per family. Two files of different task ranges share no task: that is an error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.run.summary import EPISODES_FILE, fmt_change, paired_change, reports_from_json  # noqa: E402
from stages.evaluate import EvalReport, summarize  # noqa: E402


class EpisodesError(ValueError):
    """An episodes file that cannot be read as a side of the comparison."""


def read_side(spec: str, default: str) -> tuple[str, dict[str, EvalReport]]:
    """`FILE[:before|after]` -> (its task range, its reports per split)."""
    path, _, key = spec.rpartition(":") if spec.endswith((":before", ":after")) else (spec, "", default)
    if Path(path).is_dir():  # a run folder: its heldout_episodes.json
        path = str(Path(path) / EPISODES_FILE)
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise EpisodesError(f"{path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise EpisodesError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get(key), dict):
        kept = sorted(k for k in ("before", "after") if isinstance(data, dict) and isinstance(data.get(k), dict))
        raise EpisodesError(f"{path}: no `{key}` measure (it holds: {', '.join(kept) or 'none'}); "
                            "an episodes file is a run's heldout_episodes.json or what `run.py pretrain --episodes` writes")
    return str(data.get("range", "?")), reports_from_json(data[key])


def common(before: dict[str, EvalReport], after: dict[str, EvalReport]) -> tuple[dict[str, EvalReport], dict[str, EvalReport]]:
    """Both sides cut to the tasks measured on both (matched by split and task id), in `after`'s order."""
    kept = {(s, e.task_id) for s, r in before.items() for e in r.episodes} & {(s, e.task_id) for s, r in after.items() for e in r.episodes}
    first = {(s, e.task_id): e for s, r in before.items() for e in r.episodes}
    out_before = {s: summarize([first[s, e.task_id] for e in r.episodes if (s, e.task_id) in kept]) for s, r in after.items()}
    out_after = {s: summarize([e for e in r.episodes if (s, e.task_id) in kept]) for s, r in after.items()}
    return out_before, out_after


def by_family(reports: dict[str, EvalReport]) -> dict[str, dict[str, EvalReport]]:
    """The same reports split by task family: family -> split -> report."""
    families = sorted({e.family for r in reports.values() for e in r.episodes})
    return {f: {s: summarize([e for e in r.episodes if e.family == f]) for s, r in reports.items()} for f in families}


def won(reports: dict[str, EvalReport]) -> int:
    return sum(e.won for r in reports.values() for e in r.episodes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, metavar="FILE|RUN_DIR[:before|after]")
    parser.add_argument("--after", required=True, metavar="FILE|RUN_DIR[:before|after]")
    args = parser.parse_args(argv)
    try:
        (range_before, before), (range_after, after) = read_side(args.before, "before"), read_side(args.after, "after")
    except EpisodesError as exc:
        print(f"paired_heldout: {exc}", file=sys.stderr)
        return 2
    before, after = common(before, after)
    change = paired_change(before, after)
    if change is None:
        print(f"paired_heldout: no task measured on both sides (ranges {range_before!r} and {range_after!r})", file=sys.stderr)
        return 2
    print(f"range {range_after}: {fmt_change(change)}")
    print("| family | tasks | won before | won after | change, points [95 % t] | gained | lost |")
    print("|---|---|---|---|---|---|---|")
    after_families = by_family(after)
    for family, family_before in by_family(before).items():
        pair = paired_change(family_before, after_families[family])
        assert pair is not None  # both sides hold the same tasks
        low, high = pair["ci95"]
        interval = "" if low is None else f" [{100 * low:+.1f}, {100 * high:+.1f}]"
        print(f"| {family} | {pair['tasks']} | {won(family_before)} | {won(after_families[family])} | "
              f"{100 * pair['change']:+.1f}{interval} | {pair['gained']} | {pair['lost']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
