"""MLflow: a store inside the run folder by default (`mlflow/mlflow.db`, artifacts in `mlflow/artifacts/`),
or any tracking URI (a server, a shared database).

    mlflow ui --backend-store-uri sqlite:///runs/default/mlflow/mlflow.db

The default store is an SQLite file because MLflow 3 keeps its plain-folder store (`./mlruns`) in
maintenance mode and refuses it unless `MLFLOW_ALLOW_FILE_STORE=true` is set; a `file://` URI works with
that variable. Metrics at step = learner version (every metrics row, held-out curves, the summary as
`summary/...`), the resolved config as parameters (`section.key`), profile.png and learning_curve.png as
artifacts under `images/`. A resumed run reopens the run id `trackers.json` kept and appends; parameters
it changed (`--set`) are recorded as tags `resumed.<key>` (MLflow parameters cannot change).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from pathlib import Path

import msgspec

from . import TrackerRun
from ._rows import flat_params

BATCH = 100
"""MLflow takes at most 100 parameters per log_batch call."""


class MlflowTracker:
    extra = "mlflow"
    requires = ("mlflow", "sqlalchemy", "alembic")

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        tracking_uri: str = ""
        """"" = `sqlite:///<run folder>/mlflow/mlflow.db` with artifacts in `<run folder>/mlflow/artifacts`."""
        experiment: str = "rollcut"
        run_name: str = ""
        """"" = the run folder's name."""

    def __init__(self, options: Options, *, run: TrackerRun) -> None:
        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its store set-up logs each migration at INFO
        logging.getLogger("alembic").setLevel(logging.WARNING)
        store = run.run_dir / "mlflow"
        if options.tracking_uri:
            uri, artifacts = options.tracking_uri, None
        else:
            store.mkdir(exist_ok=True)
            uri, artifacts = f"sqlite:///{(store / 'mlflow.db').resolve()}", (store / "artifacts").resolve().as_uri()
        self.tracking_uri = uri
        self._client = MlflowClient(tracking_uri=uri)
        params = flat_params(run.config)
        if run.resume_id:
            self.run_id = run.resume_id
            self._client.update_run(self.run_id, status="RUNNING")
            self._resumed_params(params)
        else:
            experiment = self._client.get_experiment_by_name(options.experiment)
            experiment_id = (experiment.experiment_id if experiment is not None
                             else self._client.create_experiment(options.experiment, artifact_location=artifacts))
            self.run_id = self._client.create_run(experiment_id, run_name=options.run_name or run.name).info.run_id
            self._log_params(params)

    def log_row(self, values: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[Metric(metric_key(k), v, now, step) for k, v in values.items()])

    def log_summary(self, figures: Mapping[str, float], step: int) -> None:
        self.log_row(figures, step)

    def log_image(self, name: str, path: Path, step: int) -> None:
        self._client.log_artifact(self.run_id, str(path), artifact_path="images")

    def close(self, ok: bool) -> None:
        self._client.set_terminated(self.run_id, status="FINISHED" if ok else "KILLED")

    def _log_params(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(metric_key(k), v[:_max_param_length()]) for k, v in params.items()]
        for lo in range(0, len(items), BATCH):
            self._client.log_batch(self.run_id, params=items[lo : lo + BATCH])

    def _resumed_params(self, params: Mapping[str, str]) -> None:
        """Parameters new since the run started are logged; changed ones become `resumed.<key>` tags."""
        logged = self._client.get_run(self.run_id).data.params
        limit = _max_param_length()
        self._log_params({k: v for k, v in params.items() if metric_key(k) not in logged})
        for key, value in params.items():
            if metric_key(key) in logged and logged[metric_key(key)] != value[:limit]:
                self._client.set_tag(self.run_id, f"resumed.{metric_key(key)}", value[:limit])


def metric_key(key: str) -> str:
    """`key` with what MLflow refuses in names (anything but letters, digits, `_ - . / space`) as `_`."""
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", key)


def _max_param_length() -> int:
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    return int(MAX_PARAM_VAL_LENGTH)
