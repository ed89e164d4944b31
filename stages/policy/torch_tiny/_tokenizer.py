"""A word-level tokenizer built from an environment's language (`EnvSuite.vocabulary()`).

Text is split into words (`\\w+`), single punctuation marks and newlines. The vocabulary is the fixed list
of special tokens followed by the sorted set of pieces found in the suite's vocabulary plus common
punctuation, so the same suite always yields the same ids. A word that is not in the vocabulary is tried
lower-cased, then becomes `<unk>`.

`decode` joins words with single spaces and attaches punctuation the way English prose writes it, so
`decode(encode(text)) == text` for text in that canonical spacing (every environment message is).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

PAD, BOS, EOS, UNK, NL = "<pad>", "<bos>", "<eos>", "<unk>", "<nl>"
TASK, OBS, ACT, CMDS, SEP = "<task>", "<obs>", "<act>", "<cmds>", "<sep>"
SPECIALS = (PAD, BOS, EOS, UNK, NL, TASK, OBS, ACT, CMDS, SEP)
"""Fixed ids 0..9: padding, sequence marks, newline, and the prompt's section markers."""

PUNCTUATION = tuple(".,;:!?'\"()-/")
_PIECE = re.compile(r"\n|\w+|[^\w\s]")
_NO_SPACE_BEFORE = frozenset(".,;:!?)")
_NO_SPACE_AFTER = frozenset("(")
FORMAT = "rollcut.word_tokenizer/1"


def split_words(text: str) -> list[str]:
    """`"a mug 1, here.\\n"` -> `["a", "mug", "1", ",", "here", ".", "\\n"]`."""
    return _PIECE.findall(text)


class WordTokenizer:
    """Word-level tokenizer; ids 0..len(SPECIALS)-1 are the special tokens."""

    def __init__(self, words: Sequence[str]) -> None:
        if tuple(words[: len(SPECIALS)]) != SPECIALS:
            raise ValueError("a tokenizer's word list must start with the special tokens")
        if len(set(words)) != len(words):
            raise ValueError("a tokenizer's word list has duplicates")
        self.words: tuple[str, ...] = tuple(words)
        self._ids = {w: i for i, w in enumerate(self.words)}
        self.pad_id, self.bos_id, self.eos_id, self.unk_id, self.nl_id = range(5)
        self.task_id, self.obs_id, self.act_id, self.cmds_id, self.sep_id = range(5, 10)

    @classmethod
    def from_vocabulary(cls, vocabulary: Iterable[str]) -> WordTokenizer:
        """Every piece of every vocabulary entry, plus punctuation, sorted after the specials."""
        pieces = {p for entry in vocabulary for p in split_words(entry) if p != "\n"}
        pieces.update(PUNCTUATION)
        pieces.difference_update(SPECIALS)
        return cls([*SPECIALS, *sorted(pieces)])

    def __len__(self) -> int:
        return len(self.words)

    def token_id(self, piece: str) -> int:
        if piece == "\n":
            return self.nl_id
        found = self._ids.get(piece)
        if found is None:
            found = self._ids.get(piece.lower(), self.unk_id)
        return found

    def encode(self, text: str) -> list[int]:
        return [self.token_id(p) for p in split_words(text)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; pad/bos/eos and the section markers are dropped, `<nl>` becomes a newline."""
        out: list[str] = []
        glue = True  # no space before the first piece or after a newline / opening bracket
        for i in ids:
            if i == self.nl_id:
                out.append("\n")
                glue = True
                continue
            if i < len(SPECIALS) and i != self.unk_id:
                continue
            piece = self.words[i]
            if not glue and piece not in _NO_SPACE_BEFORE:
                out.append(" ")
            out.append(piece)
            glue = piece in _NO_SPACE_AFTER
        return "".join(out)

    # ----------------------------------------------------------------------------------------------
    # Persistence

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "words": list(self.words)})

    @classmethod
    def from_json(cls, text: str) -> WordTokenizer:
        data = json.loads(text)
        if data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} tokenizer (format {data.get('format')!r})")
        return cls(data["words"])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> WordTokenizer:
        return cls.from_json(Path(path).read_text())
