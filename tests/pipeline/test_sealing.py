"""Sealed frames: only a message of two frames, the first the second's tag under the run's secret, unseals."""

from pipeline.sealing import TAG_BYTES, frame_tag, new_secret, unseal


def test_only_the_payload_tagged_under_the_secret_unseals():
    secret, other, payload = new_secret(), new_secret(), b"\x93\x01\x02\x03"
    assert secret != other and len(frame_tag(secret, payload)) == TAG_BYTES
    assert unseal(secret, [frame_tag(secret, payload), payload]) == payload
    assert unseal(secret, [frame_tag(other, payload), payload]) is None  # another run's secret
    assert unseal(secret, [payload]) is None  # bare
    assert unseal(secret, [frame_tag(secret, b"x"), payload]) is None  # a tag of other bytes
    assert unseal(secret, [frame_tag(secret, payload), payload, b""]) is None  # three frames
