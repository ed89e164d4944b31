"""TensorBoard: event files in the run folder (`tensorboard/`), written by torch's `SummaryWriter`.

    tensorboard --logdir runs/default/tensorboard

Scalars at step = learner version: every metrics row's numbers, held-out curves (`heldout/...`), the
summary (`summary/...`); the resolved config as text (`config`); profile.png and learning_curve.png as
images (their PNG bytes, unchanged). A resumed run writes a new event file in the same folder from the
checkpoint's version on: `purge_step` makes TensorBoard drop what the first file held after it, as
metrics.jsonl drops those rows.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import Path

import msgspec

from . import TrackerRun


class TensorBoardTracker:
    extra = "tensorboard"
    requires = ("tensorboard",)

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        log_dir: str = ""
        """Where the event files go ("" = the run folder's `tensorboard/`)."""

    def __init__(self, options: Options, *, run: TrackerRun) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(options.log_dir) if options.log_dir else run.run_dir / "tensorboard"
        self.run_id = str(self.log_dir)
        purge = None if run.resume_step is None else run.resume_step + 1
        self._writer = SummaryWriter(str(self.log_dir), purge_step=purge, flush_secs=10)
        config = "\n".join("    " + line for line in run.config_toml.splitlines())  # a Markdown code block
        self._writer.add_text("config", config, global_step=run.resume_step or 0)
        self._writer.flush()

    def log_row(self, values: Mapping[str, float], step: int) -> None:
        for key, value in values.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()  # one row per update: cheap, and a live TensorBoard sees it at once

    def log_summary(self, figures: Mapping[str, float], step: int) -> None:
        self.log_row(figures, step)

    def log_image(self, name: str, path: Path, step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        data = path.read_bytes()
        width, height = png_size(data)
        image = Summary.Image(height=height, width=width, colorspace=4, encoded_image_string=data)
        self._writer.file_writer.add_summary(Summary(value=[Summary.Value(tag=f"images/{name}", image=image)]), step)
        self._writer.flush()

    def close(self, ok: bool) -> None:
        self._writer.close()


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's header. Raises ValueError for anything else."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    width, height = struct.unpack(">II", data[16:24])
    return width, height
