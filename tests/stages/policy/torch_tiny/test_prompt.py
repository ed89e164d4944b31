from __future__ import annotations

from stages.policy.base import AgentContext
from stages.policy.torch_tiny import PromptFormat, WordTokenizer, parse_action

ADMISSIBLE = ("look", "go to shelf 1", "go to shelf 2", "take key from shelf 2")


def test_parse_exact_match() -> None:
    assert parse_action("go to shelf 2", ADMISSIBLE) == "go to shelf 2"
    assert parse_action("  take key from shelf 2 \nextra line", ADMISSIBLE) == "take key from shelf 2"


def test_parse_fuzzy_match() -> None:
    assert parse_action("go to shelf", ADMISSIBLE) in ("go to shelf 1", "go to shelf 2")
    assert parse_action("take key from shelf 1", ADMISSIBLE) == "take key from shelf 2"
    assert parse_action("Go To Shelf 2.", ADMISSIBLE) == "go to shelf 2"


def test_parse_falls_back_to_raw_text() -> None:
    assert parse_action("open drawer 1", ADMISSIBLE) == "open drawer 1"
    assert parse_action("go to shelf", ADMISSIBLE, fuzzy_cutoff=99) == "go to shelf"
    assert parse_action("anything", ()) == "anything"
    assert parse_action("", ADMISSIBLE) == ""


def _ctx(history_len: int, admissible=ADMISSIBLE) -> AgentContext:
    history = tuple(
        (f"you arrive at shelf {i % 2 + 1}.", f"go to shelf {i % 2 + 1}") for i in range(history_len)
    )
    return AgentContext("take the key", "you are in a room.", admissible, history)


def test_prompt_layout(fmt: PromptFormat, tokenizer: WordTokenizer) -> None:
    ids = fmt.build(_ctx(3))
    tok = tokenizer
    assert ids[:2] == [tok.bos_id, tok.task_id]
    assert ids[-1] == tok.act_id
    assert ids.count(tok.obs_id) == 3  # two history pairs (the window) + the current observation
    assert ids.count(tok.act_id) == 3
    assert tok.decode(ids) == (
        "take the key you arrive at shelf 2. go to shelf 2 you arrive at shelf 1. go to shelf 1 you are in a room."
    )
    assert fmt.completion("go to shelf 1") == [*tok.encode("go to shelf 1"), tok.eos_id]


def test_prompt_lists_admissible_commands_when_asked(tokenizer: WordTokenizer) -> None:
    fmt = PromptFormat(tokenizer, history=0, show_admissible=True, max_prompt_tokens=200)
    ids = fmt.build(_ctx(0))
    assert ids.count(tokenizer.cmds_id) == 1
    assert ids.count(tokenizer.sep_id) == len(ADMISSIBLE) - 1
    assert "go to shelf 1 go to shelf 2" in tokenizer.decode(ids)


def test_prompt_budget_drops_oldest_history_then_commands(tokenizer: WordTokenizer) -> None:
    full = PromptFormat(tokenizer, history=4, show_admissible=True, max_prompt_tokens=500)
    ctx = _ctx(4)
    n = len(full.build(ctx))
    for budget in range(12, n + 1):
        small = PromptFormat(tokenizer, history=4, show_admissible=True, max_prompt_tokens=budget)
        ids = small.build(ctx)
        assert len(ids) <= budget
        assert ids[-1] == tokenizer.act_id
        assert ids[0] == tokenizer.bos_id
    one_pair_less = PromptFormat(tokenizer, history=4, show_admissible=True, max_prompt_tokens=n - 1).build(
        ctx
    )
    assert one_pair_less.count(tokenizer.obs_id) == 4  # the oldest pair went first
    assert one_pair_less.count(tokenizer.cmds_id) == 1


def test_memory_keeps_each_earlier_action_once_after_its_observation_leaves_the_window(tokenizer: WordTokenizer) -> None:
    history = (
        ("you are in a room.", "go to shelf 1"),
        ("you arrive at shelf 1.", "go to shelf 2"),
        ("you arrive at shelf 2.", "go to shelf 1"),  # a repeat: remembered once
        ("you arrive at shelf 1.", "look"),
    )
    ctx = AgentContext("take the key", "you are in a room.", ADMISSIBLE, history)
    plain = PromptFormat(tokenizer, history=1, max_prompt_tokens=200).build(ctx)
    remembering = PromptFormat(tokenizer, history=1, max_prompt_tokens=200, memory=True).build(ctx)
    assert tokenizer.decode(plain) == "take the key you arrive at shelf 1. look you are in a room."
    assert tokenizer.decode(remembering) == (
        "take the key go to shelf 1 go to shelf 2 you arrive at shelf 1. look you are in a room."
    )
    assert remembering.count(tokenizer.act_id) == 4 and remembering.count(tokenizer.obs_id) == 2
    assert PromptFormat(tokenizer, history=8, max_prompt_tokens=200, memory=True).build(ctx) == PromptFormat(
        tokenizer, history=8, max_prompt_tokens=200
    ).build(ctx)  # nothing has left the window yet


def test_memory_outranks_old_pairs_but_not_the_latest_when_the_budget_is_short(tokenizer: WordTokenizer) -> None:
    ctx = _ctx(6)
    full = PromptFormat(tokenizer, history=3, max_prompt_tokens=500, memory=True, memory_keeps_pairs=1)
    n = len(full.build(ctx))
    for budget in range(12, n + 1):
        ids = PromptFormat(tokenizer, history=3, max_prompt_tokens=budget, memory=True, memory_keeps_pairs=1).build(ctx)
        assert len(ids) <= budget and ids[-1] == tokenizer.act_id
    short = PromptFormat(tokenizer, history=3, max_prompt_tokens=n - 1, memory=True, memory_keeps_pairs=1).build(ctx)
    assert short.count(tokenizer.obs_id) == 3  # the oldest pair went first, the memory stayed
    assert short.count(tokenizer.act_id) == full.build(ctx).count(tokenizer.act_id) - 1


def test_pin_first_keeps_the_first_observation_once_its_turn_left_the_window(tokenizer: WordTokenizer) -> None:
    history = (("you see shelf 1, shelf 2.", "go to shelf 1"), ("you arrive at shelf 1.", "go to shelf 2"))
    ctx = AgentContext("take the key", "you arrive at shelf 2.", ADMISSIBLE, history)
    fmt = PromptFormat(tokenizer, history=1, max_prompt_tokens=200, memory=True, pin_first=True)
    assert tokenizer.decode(fmt.build(ctx)) == (
        "take the key you see shelf 1, shelf 2. go to shelf 1 you arrive at shelf 1. go to shelf 2 you arrive at shelf 2."
    )
    in_window = PromptFormat(tokenizer, history=2, max_prompt_tokens=200, memory=True, pin_first=True)
    assert in_window.build(ctx) == PromptFormat(tokenizer, history=2, max_prompt_tokens=200).build(ctx)
    n = len(fmt.build(ctx))
    assert fmt.build(ctx).count(tokenizer.obs_id) == 3
    short = PromptFormat(tokenizer, history=1, max_prompt_tokens=n - 1, memory=True, pin_first=True, memory_keeps_pairs=1)
    assert short.build(ctx).count(tokenizer.obs_id) == 3  # the memory entry went, the pinned listing stayed


def test_pin_tokens_lets_the_pinned_listing_run_past_the_per_observation_cut(tokenizer: WordTokenizer) -> None:
    history = (("you see shelf 1, shelf 2, drawer 1.", "go to shelf 1"), ("you arrive at shelf 1.", "go to shelf 2"))
    ctx = AgentContext("take the key", "you arrive at shelf 2.", ADMISSIBLE, history)
    cut = PromptFormat(tokenizer, history=1, max_obs_tokens=4, memory=True, pin_first=True)
    assert "drawer" not in tokenizer.decode(cut.build(ctx))
    whole = PromptFormat(tokenizer, history=1, max_obs_tokens=4, memory=True, pin_first=True, pin_tokens=40)
    decoded = tokenizer.decode(whole.build(ctx))
    assert decoded.startswith("take the key you see shelf 1, shelf 2, drawer 1. go to shelf 1")
    assert decoded.endswith("go to shelf 2 you arrive at shelf")  # the other observations keep their 4-word cut
