from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stages.policy.torch_tiny import WordTokenizer
from stages.policy.torch_tiny._tokenizer import SPECIALS, split_words

WORDS = ["go", "to", "cabinet", "1", "12", "mug", "take", "from", "you", "see", "a", "Kitchen"]


def test_split_words_keeps_punctuation_and_newlines() -> None:
    assert split_words("a mug 1, here.\nok") == ["a", "mug", "1", ",", "here", ".", "\n", "ok"]


def test_ids_are_specials_then_sorted_pieces() -> None:
    tok = WordTokenizer.from_vocabulary(["take mug", "go to cabinet 1"])
    assert tok.words[: len(SPECIALS)] == SPECIALS
    pieces = tok.words[len(SPECIALS) :]
    assert list(pieces) == sorted(pieces)
    assert {"take", "mug", "go", "to", "cabinet", "1", ",", "."} <= set(pieces)


@given(st.lists(st.sampled_from(WORDS), min_size=1, max_size=20))
def test_round_trip_of_space_separated_words(words: list[str]) -> None:
    tok = WordTokenizer.from_vocabulary(WORDS)
    text = " ".join(words)
    assert tok.decode(tok.encode(text)) == text


def test_round_trip_of_prose_with_punctuation_and_lines() -> None:
    tok = WordTokenizer.from_vocabulary(WORDS)
    text = "you see a mug 1, a cabinet 12.\ngo to cabinet 1 (a Kitchen)!"
    assert tok.decode(tok.encode(text)) == text


def test_unknown_words_become_unk_and_case_falls_back_to_lower() -> None:
    tok = WordTokenizer.from_vocabulary(WORDS)
    ids = tok.encode("Take the mug")
    assert ids == [tok.token_id("take"), tok.unk_id, tok.token_id("mug")]
    assert tok.decode(ids) == "take <unk> mug"


def test_decode_drops_markers_and_stops_nothing() -> None:
    tok = WordTokenizer.from_vocabulary(WORDS)
    ids = [tok.bos_id, tok.act_id, *tok.encode("go to cabinet 1"), tok.eos_id, tok.pad_id]
    assert tok.decode(ids) == "go to cabinet 1"


def test_save_and_load_json(tmp_path) -> None:
    tok = WordTokenizer.from_vocabulary(WORDS)
    tok.save(tmp_path / "tok.json")
    loaded = WordTokenizer.load(tmp_path / "tok.json")
    assert loaded.words == tok.words
    assert loaded.encode("take mug 12 from cabinet 1") == tok.encode("take mug 12 from cabinet 1")
