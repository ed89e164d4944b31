"""Sealed frames: only a message of three frames (tag, header, payload), the tag under the run's secret for this
stream, unseals; and only once per sender counter."""

from pipeline.sealing import HEADER, TAG_BYTES, Sealer, Unsealer, frame_tag, new_secret, stream_of


def test_only_the_payload_tagged_under_the_secret_for_this_stream_unseals():
    secret, other, payload = new_secret(), new_secret(), b"\x81\xa1k\x01"
    stream = stream_of("ipc:///tmp/x/steps")
    sealed = Sealer(secret, stream).seal(payload)
    assert secret != other and len(sealed[0]) == TAG_BYTES and len(sealed[1]) == HEADER.size
    assert Unsealer(secret, stream).unseal(sealed) == (payload, "")
    assert Unsealer(other, stream).unseal(sealed) == (None, "bad_token")  # another run's secret
    assert Unsealer(secret, stream_of("ipc:///tmp/x/results")).unseal(sealed) == (None, "bad_token")  # another stream
    assert Unsealer(secret, stream).unseal([payload]) == (None, "bad_token")  # bare
    assert Unsealer(secret, stream).unseal([sealed[0], sealed[1], b"x"]) == (None, "bad_token")  # a tag of other bytes
    assert Unsealer(secret, stream).unseal([*sealed, b""]) == (None, "bad_token")  # four frames
    assert Unsealer(secret, stream).unseal([frame_tag(secret, stream, b"", payload), b"", payload]) == (None, "bad_token")


def test_a_replayed_frame_is_refused_and_senders_are_counted_apart():
    secret, stream = new_secret(), stream_of("tcp://127.0.0.1:5555")
    first, second = Sealer(secret, stream), Sealer(secret, stream)
    check = Unsealer(secret, stream)
    a1, a2, b1 = first.seal(b"a1"), first.seal(b"a2"), second.seal(b"b1")
    assert check.unseal(a1) == (b"a1", "") and check.unseal(b1) == (b"b1", "")  # each sender's own counter
    assert check.unseal(a1) == (None, "replayed")
    assert check.unseal(a2) == (b"a2", "") and check.unseal(a1) == (None, "replayed") and check.unseal(b1) == (None, "replayed")


def test_a_stream_is_its_path_or_its_tcp_port():
    assert stream_of("tcp://0.0.0.0:5555") == stream_of("tcp://10.0.0.7:5555") != stream_of("tcp://10.0.0.7:5556")
    assert stream_of("ipc:///tmp/a/steps") != stream_of("ipc:///tmp/a/results")
