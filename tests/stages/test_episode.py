"""play_episode: the one agent loop. Turns are recorded before the step they lead to, `on_step` sees every
step with the reward so far, the step limit ends an episode, and a failure or a cancel leaves the episode
holding what was done."""

import pytest
import trio

from stages.envs.base import Observation, StepResult, Task
from stages.episode import Episode, EpisodeStep, play_episode, state_anchor
from stages.policy.base import ActResult

TASK = Task(task_id="t0", family="demo", description="reach the door", split="train")


class Corridor:
    """Position 0..length; 'forward' moves on (reward 0.5 per move), 'wait' stays; done at the door."""

    def __init__(self, length=3, fail_at=None):
        self.length, self.fail_at, self.at, self.closed = length, fail_at, 0, False
        self.actions = []

    def reset(self, task):
        self.at = 0
        return Observation(text="at 0", admissible=("forward", "wait"))

    def step(self, action):
        self.actions.append(action)
        if self.fail_at is not None and len(self.actions) == self.fail_at:
            raise RuntimeError("the floor gave way")
        moved = action == "forward"
        self.at += moved
        done = self.at >= self.length
        return StepResult(Observation(text=f"at {self.at}", admissible=("forward", "wait")), 0.5 * moved, done, done)

    def close(self):
        self.closed = True


class ScriptPolicy:
    """Plays a fixed list of actions; remembers each context and the greedy flag; `delay` seconds per act."""

    version = 3

    def __init__(self, actions, delay=0.0):
        self.actions, self.delay = list(actions), delay
        self.contexts, self.greedy = [], []

    async def act(self, context, *, greedy=False):
        await trio.sleep(self.delay)
        self.contexts.append(context)
        self.greedy.append(greedy)
        action = self.actions[len(self.contexts) - 1]
        return ActResult(action, action, [len(self.contexts)], [7, 8], [-0.5, -0.25], self.version)


async def test_plays_to_done_and_reports_every_step():
    env, policy, steps = Corridor(), ScriptPolicy(["forward", "wait", "dance", "forward", "forward"]), []

    async def on_step(step: EpisodeStep) -> None:
        steps.append(step)

    episode = await play_episode(policy, env, TASK, 10, on_step=on_step)
    assert episode.done and episode.won and episode.steps == 5 and episode.reward == 1.5
    assert [t.action for t in episode.turns] == env.actions == ["forward", "wait", "dance", "forward", "forward"]
    assert [t.admissible for t in episode.turns] == [True, True, False, True, True]
    assert [t.prompt_ids for t in episode.turns] == [[1], [2], [3], [4], [5]]
    assert all(t.policy_version == 3 and t.token_ids == [7, 8] for t in episode.turns)
    assert [s.step_index for s in steps] == [0, 1, 2, 3, 4]
    assert [s.reward for s in steps] == [0.5, 0.5, 0.5, 1.0, 1.5]
    assert [s.done for s in steps] == [False, False, False, False, True]
    assert [s.new_observation for s in steps] == [True, False, False, True, True]
    assert [s.turn for s in steps] == episode.turns
    # the prompt carries the task, the current observation and every earlier (observation, action) pair
    last = policy.contexts[-1]
    assert last.task == "reach the door" and last.observation == "at 2"
    assert last.history == (("at 0", "forward"), ("at 1", "wait"), ("at 1", "dance"), ("at 1", "forward"))
    assert policy.greedy == [False] * 5


async def test_the_step_limit_ends_the_episode_and_the_last_step_says_done():
    env, policy, steps = Corridor(length=10), ScriptPolicy(["forward"] * 10), []

    async def on_step(step: EpisodeStep) -> None:
        steps.append(step.done)

    episode = await play_episode(policy, env, TASK, 4, greedy=True, on_step=on_step)
    assert episode.done and not episode.won and episode.steps == 4 and episode.reward == 2.0
    assert steps == [False, False, False, True]
    assert policy.greedy == [True] * 4


async def test_the_env_step_hook_takes_every_step():
    env, policy, hooked = Corridor(length=2), ScriptPolicy(["forward", "forward"]), []

    async def env_step(e, action):
        hooked.append(action)
        return e.step(action)

    episode = await play_episode(policy, env, TASK, 5, env_step=env_step)
    assert hooked == ["forward", "forward"] and episode.won


async def test_a_failing_step_propagates_and_keeps_the_turn_that_led_to_it():
    env, policy, episode = Corridor(fail_at=2), ScriptPolicy(["forward"] * 5), Episode()
    with pytest.raises(RuntimeError, match="floor gave way"):
        await play_episode(policy, env, TASK, 5, episode=episode)
    assert episode.steps == 2 and episode.reward == 0.5 and not episode.done


async def test_a_cancel_leaves_the_episode_as_far_as_it_got(autojump_clock):
    policy, episode = ScriptPolicy(["forward"] * 10, delay=1.0), Episode()
    with trio.move_on_after(3.5):
        await play_episode(policy, Corridor(length=10), TASK, 10, episode=episode)
    assert episode.steps == 3 and episode.reward == 1.5 and not episode.done
    assert trio.current_time() == 3.5


async def test_each_turn_records_its_step_reward_and_the_anchor_of_the_state_it_acted_in():
    env, policy = Corridor(length=2), ScriptPolicy(["wait", "forward", "forward"])
    episode = await play_episode(policy, env, TASK, max_steps=5)
    assert [t.reward for t in episode.turns] == [0.0, 0.5, 0.5]
    first, second, third = (t.anchor for t in episode.turns)
    assert first == second == state_anchor("at 0", ("forward", "wait"))  # waiting left the agent where it was
    assert third == state_anchor("at 1", ("forward", "wait")) != first
    assert state_anchor("at 0", ("forward",)) != first  # the commands on offer are part of the state
