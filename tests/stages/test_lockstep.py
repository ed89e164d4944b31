"""The lockstep driver: every episode gets one decision per step until it ends; contexts carry history."""

from __future__ import annotations

from stages.lockstep import play_lockstep
from tests.stages.policy.fake_suite import FindSuite


def test_each_episode_plays_until_it_ends_and_decisions_see_only_running_episodes() -> None:
    suite = FindSuite(max_steps=4, per_split=3)
    tasks = list(suite.tasks("train"))
    calls: list[tuple[int, list[int]]] = []

    def decide(step, live, contexts, envs):  # noqa: ANN001, ANN202
        calls.append((step, list(live)))
        assert [len(c.history) for c in contexts] == [step] * len(live)
        if step == 0:  # task 0 is solved by its expert plan, the others wander
            return [suite.expert(tasks[0])[0] if i == 0 else "look" for i in live]
        return [suite.expert(tasks[0])[1] if i == 0 else "look" for i in live]

    episodes = play_lockstep(suite, tasks, decide)
    assert [e.task for e in episodes] == tasks
    assert [e.won for e in episodes] == [True, False, False]
    assert [e.steps for e in episodes] == [2, 4, 4]
    assert episodes[0].actions == tuple(suite.expert(tasks[0]))
    assert calls == [(0, [0, 1, 2]), (1, [0, 1, 2]), (2, [1, 2]), (3, [1, 2])]
