"""The example stage runs against a real event stream and writes what it receives."""

import json

import trio

from pipeline.config import TransportSection
from pipeline.messages import GroupResult, Trajectory, TrajectoryStatus, Turn, WeightsPublished
from pipeline.profiling import Profiler
from pipeline.stage import Stage, StageContext, build_stage
from pipeline.transport import open_context


def _group(gid: int) -> GroupResult:
    turn = Turn(prompt_ids=[1], token_ids=[2, 3], logprobs=[-0.1, -0.2], action="go to fridge 1", policy_version=0)
    trajectory = Trajectory(rollout_index=0, turns=[turn], reward=1.0, success=True, status=TrajectoryStatus.COMPLETE)
    return GroupResult(group_id=gid, task_id=f"t{gid}", trajectories=[trajectory], cut=False)


async def test_writer_stage_writes_every_group(tmp_path):
    stage = build_stage("examples.jsonl_writer:JsonlGroupWriter", {"path": "out.jsonl"})
    assert isinstance(stage, Stage)
    addresses = TransportSection(events="inproc://example-events")
    async with open_context() as zmq:
        pub = zmq.socket("pub", addresses.events, bind=True)
        ctx = StageContext(zmq=zmq, addresses=addresses, run_dir=tmp_path, profiler=Profiler(enabled=False))
        async with trio.open_nursery() as nursery:
            await nursery.start(stage.run, ctx)
            with trio.fail_after(10):
                # PUB/SUB joins asynchronously: publish until the subscriber has seen the first group
                gid = 0
                while stage.written == 0:  # noqa: ASYNC110 (polling while publishing is the point)
                    await pub.send(_group(gid))
                    gid += 1
                    await trio.sleep(0.01)
                await pub.send(WeightsPublished(version=1, groups_trained=1, published_at=0.0))
                await pub.send(_group(1000))
                while stage.written < 2:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert rows[-1]["group_id"] == 1000
    assert rows[-1]["trajectories"][0]["actions"] == ["go to fridge 1"]
    assert all(r["type"] == "GroupResult" for r in rows)
