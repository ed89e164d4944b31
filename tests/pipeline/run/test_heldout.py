"""Periodic held-out measures: which versions are measured, rows written, target and idleness as events."""

import trio

import pipeline.run.heldout as heldout
from pipeline.config import RunConfig
from pipeline.run.heldout import PeriodicHeldout
from stages.evaluate import EvalReport


class _Metrics:
    def __init__(self):
        self.rows = []

    def write(self, row):
        self.rows.append(row)


async def test_due_versions_are_measured_in_the_background_and_the_target_is_an_event(autojump_clock):
    measured, kept = [], []

    async def evaluate(version, state):
        measured.append((version, state["w"]))
        await trio.sleep(10.0)
        return {"seen": 0.3, "unseen": 0.5, "mean": 0.4 + 0.1 * version / 4}

    metrics = _Metrics()
    heldout = PeriodicHeldout(evaluate, 2, 6, metrics, None, on_row=lambda row, s: kept.append((row, s)), target=0.5)
    async with trio.open_nursery() as nursery:
        for version in range(1, 7):
            heldout.published(version, {"w": version}, wall_s=1.0, env_steps=100)
            heldout.start_if_due(version, nursery)
        await trio.testing.wait_all_tasks_blocked()
        assert not heldout.target_reached.is_set()
        await heldout.idle()
    assert sorted(measured) == [(2, 2), (4, 4)]  # every 2nd version; the last (6) is the job's after-measure
    rows = sorted(metrics.rows, key=lambda r: r["iteration"])  # concurrent measures end in either order
    assert [r["iteration"] for r in rows] == [2, 4] and rows[0]["heldout/mean"] == 0.45
    assert [s for _, s in kept] == [10.0, 10.0]
    assert heldout.target_reached.is_set()  # version 4 scored 0.5


async def test_a_row_is_stamped_when_its_weights_were_published_not_when_its_measure_finished(autojump_clock):
    # One evaluator: version 4's measure waits behind version 2's, then takes 10 s itself. Its row must say
    # where training was when version 4 was published (wall 8 s, 400 env steps), not 28 s.
    one_at_a_time = trio.Lock()

    async def evaluate(version, state):
        async with one_at_a_time:
            await trio.sleep(10.0)
        return {"mean": 0.5}

    metrics = _Metrics()
    heldout = PeriodicHeldout(evaluate, 2, 10, metrics, None, on_row=lambda row, s: None, target=0.5, range_name="valid")
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for version in (2, 4):
            await trio.sleep(4.0)
            heldout.published(version, {}, wall_s=trio.current_time() - start, env_steps=100 * version,
                              generated_tokens=None if version == 2 else 3000)
            heldout.start_if_due(version, nursery)
    rows = {r["iteration"]: r for r in metrics.rows}
    assert (rows[4]["wall_s"], rows[4]["env_steps"], rows[4]["generated_tokens"]) == (8.0, 400, 3000)
    assert "generated_tokens" not in rows[2]  # a backend that does not count tokens: no key, not a guess
    assert trio.current_time() - start == 24.0  # both measures finished long after version 4 was published
    assert rows[2]["heldout_range"] == rows[4]["heldout_range"] == "valid"


class _Policy:
    def __init__(self) -> None:
        self.versions: list[int] = []

    def load_weights(self, version, state) -> None:
        self.versions.append(version)


async def test_overlapping_periodic_evaluations_take_turns_on_the_one_evaluation_policy(monkeypatch, autojump_clock):
    # With a small eval.every an evaluation can still run when the next update asks for one; both used to
    # start the same policy server ("serve() is already running") and the run failed.
    built: list[_Policy] = []
    running = []

    def build_policy(cfg, suite, **options):
        built.append(_Policy())
        return built[-1]

    async def evaluate_heldout(policy, suite, splits, greedy):
        assert not running, "two evaluations on one policy at once"
        running.append(policy.versions[-1])
        await trio.sleep(5.0)
        running.pop()
        return {"heldout_seen": EvalReport(success=policy.versions[-1] / 10, per_family={}, mean_steps=1.0, episodes=())}

    monkeypatch.setattr(heldout.build, "policy", build_policy)
    monkeypatch.setattr(heldout, "evaluate_heldout", evaluate_heldout)
    evaluate = heldout.periodic_evaluator(RunConfig(), suite=None, splits={"heldout_seen": []}, built=[])
    scores = {}

    async def one(version):
        scores[version] = await evaluate(version, {})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, 1)
        nursery.start_soon(one, 2)
    assert len(built) == 1 and sorted(built[0].versions) == [1, 2]  # Trio starts the two in either order
    assert scores == {1: {"seen": 0.1}, 2: {"seen": 0.2}}
    assert trio.current_time() == 10.0  # one after the other
