"""Weights & Biases: offline by default (the run folder's `wandb/`; `wandb sync` uploads it later), online
once the user has logged in.

Each metrics row is one `log` call with `iteration` (the learner version) as its x axis (`define_metric`),
so held-out rows, which finish after later updates, land at their own version. The resolved config is the
W&B config, the summary's figures go to the run summary (`summary/...`), profile.png and
learning_curve.png are logged as images. A resumed run calls `wandb.init(id=..., resume="allow")` with the
id `trackers.json` kept: online it appends to the same run; offline it writes a second folder of the same
run id under `wandb/`, and `wandb sync` of both uploads one run.
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

import msgspec

from . import TrackerRun
from ._rows import STEP

MODES = ("auto", "offline", "online")


class WandbTracker:
    extra = "wandb"
    requires = ("wandb",)

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        project: str = "rollcut"
        entity: str = ""
        """"" = the logged-in user's default entity."""
        mode: str = "auto"
        """"auto": `WANDB_MODE` if set, else online when logged in (`WANDB_API_KEY`, or the netrc entry
        `wandb login` writes), else offline; or "offline" / "online"."""
        name: str = ""
        """The W&B run name ("" = the run folder's name)."""
        group: str = ""
        tags: list[str] = []
        dir: str = ""
        """Where W&B writes its `wandb/` folder ("" = the run folder)."""
        capture_console: bool = False
        """Also record the run's stdout / stderr in W&B (the run folder's events.jsonl has every event)."""

        def __post_init__(self) -> None:
            if self.mode not in MODES:
                raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")

    def __init__(self, options: Options, *, run: TrackerRun) -> None:
        import wandb

        self.mode = wandb_mode(options.mode, os.environ, logged_in=_logged_in(os.environ))
        self._run = wandb.init(
            project=options.project, entity=options.entity or None, name=options.name or run.name,
            group=options.group or None, tags=list(options.tags) or None, dir=str(Path(options.dir or run.run_dir)),
            mode=self.mode, config=dict(run.config), id=run.resume_id, resume="allow" if run.resume_id else None,
            settings=wandb.Settings(console="auto" if options.capture_console else "off", silent=True),
        )
        self.run_id = self._run.id
        self._run.define_metric(STEP)
        self._run.define_metric("*", step_metric=STEP)

    def log_row(self, values: Mapping[str, float], step: int) -> None:
        self._run.log({STEP: step, **values})

    def log_summary(self, figures: Mapping[str, float], step: int) -> None:
        self._run.summary.update(dict(figures))

    def log_image(self, name: str, path: Path, step: int) -> None:
        import wandb

        self._run.log({STEP: step, f"images/{name}": wandb.Image(str(path))})

    def close(self, ok: bool) -> None:
        self._run.finish(exit_code=0 if ok else 1)


def wandb_mode(option: str, environ: Mapping[str, str], *, logged_in: bool) -> str:
    """The W&B mode a run uses: an explicit option; for "auto", `WANDB_MODE` if set, else online only when
    the user has logged in."""
    if option != "auto":
        return option
    if environ.get("WANDB_MODE"):
        return environ["WANDB_MODE"]
    return "online" if logged_in else "offline"


def _logged_in(environ: Mapping[str, str]) -> bool:
    """An API key is at hand without asking the network: `WANDB_API_KEY`, or the netrc entry for the W&B
    host (`WANDB_BASE_URL`, default api.wandb.ai) that `wandb login` writes."""
    if environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False
