import random

from stages.envs.base import SPLITS
from stages.envs.household.text import listing, tokenize


def test_tokenize_lowercases_and_separates_punctuation():
    assert tokenize("You arrive at cabinet 3. On the cabinet 3, you see: a mug 1.") == [
        "you", "arrive", "at", "cabinet", "3", ".", "on", "the", "cabinet", "3", ",", "you", "see", ":", "a",
        "mug", "1", ".",
    ]


def test_listing_follows_alfworld():
    assert listing([]) == "nothing"
    assert listing(["mug 1"]) == "a mug 1"
    assert listing(["mug 1", "cup 2"]) == "a mug 1, and a cup 2"
    assert listing(["mug 1", "cup 2", "pan 1"]) == "a mug 1, a cup 2, and a pan 1"


def _cased_tokens(text: str) -> list[str]:
    for mark in ".,:":
        text = text.replace(mark, f" {mark} ")
    return text.split()


def test_vocabulary_covers_every_text_and_command(suite):
    vocabulary = set(suite.vocabulary())
    assert all(word == word.strip() and word for word in vocabulary)
    rng = random.Random(5)
    env = suite.make()
    seen: set[str] = set()
    for split in SPLITS:
        for i, task in enumerate(suite.tasks(split)[:150]):
            texts = [task.description]
            observation = env.reset(task)
            plan = suite.expert(task) if i % 2 else []
            for step in range(30):
                texts.append(observation.text)
                texts.extend(observation.admissible)
                action = plan[step] if step < len(plan) else rng.choice(observation.admissible)
                result = env.step(action)
                if result.done:
                    texts.append(result.observation.text)
                    break
                observation = result.observation
            for text in texts:
                seen.update(tokenize(text))
                seen.update(_cased_tokens(text))
    assert seen <= vocabulary, sorted(seen - vocabulary)
    # The vocabulary is not padded with much that never shows up.
    assert len(seen) >= 0.8 * len(vocabulary)
