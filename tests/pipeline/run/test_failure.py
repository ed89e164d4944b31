"""The failure paragraph names the cause: a policy that stopped because the run was failing is left out."""

from pathlib import Path

from pipeline.run.failure import failure_message
from pipeline.run.launch import ChildExited
from stages.policy.base import PolicyStopped


def test_a_stopped_policy_beside_the_failure_is_left_out():
    group = ExceptionGroup("phase", [PolicyStopped("cannot reach decoding worker 0: BrokenResourceError"),
                                     ChildExited("policy", "decoding worker 0 (Ray actor x on node 10.0.0.7) died")])
    message = failure_message(group, Path("runs/x"), "checkpoint at update 1 kept")
    assert "cannot reach decoding worker" not in message
    assert message.startswith("stage 'policy': decoding worker 0 (Ray actor x on node 10.0.0.7) died")
    assert message.endswith("continue with `python run.py resume runs/x`")


def test_a_stopped_policy_alone_is_still_named():
    message = failure_message(PolicyStopped("the decoding workers stopped before answering"), Path("r"), "no checkpoint")
    assert "PolicyStopped: the decoding workers stopped before answering" in message
