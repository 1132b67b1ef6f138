"""stages/agent/chat.py: the opening of a chat, encoded once per text."""

from __future__ import annotations

from stages.agent.chat import Chat


def test_an_opening_is_encoded_once_and_handed_out_as_a_new_list(tokenizer, monkeypatch):
    chat = Chat(tokenizer, think=False)
    calls = []
    encode = chat.encode
    monkeypatch.setattr(chat, "encode", lambda text: calls.append(text) or encode(text))
    a = chat.first("Goal: 1 Down.")
    a.append(-1)  # the caller's list is its own
    b = chat.first("Goal: 1 Down.")
    assert b == a[:-1] and len(calls) == 1
    assert chat.first("Goal: 2 Down.") != b and len(calls) == 2


def test_the_memo_starts_again_when_full(tokenizer, monkeypatch):
    chat = Chat(tokenizer, think=False)
    monkeypatch.setattr(Chat, "KEEP", 3)
    texts = [f"state {i}" for i in range(5)]
    fresh = [Chat(tokenizer, think=False).first(t) for t in texts]
    assert [chat.first(t) for t in texts] == fresh
    assert len(chat._opened) <= 3


def test_openings_encoded_in_one_call_are_the_ids_of_first(tokenizer):
    chat = Chat(tokenizer, think=True)
    users = ["Goal: 1 Down.", "State:\n__P_\n_O_G", "", "Question: What is one step Left of you?"]
    shot = ("Turn 1: a worked example", "<think>x</think><answer>Left</answer>")
    assert chat.first_many(users) == [chat.first(u) for u in users]
    assert chat.first_many(users, [shot, None, shot, None]) == [
        chat.first(u, s) for u, s in zip(users, [shot, None] * 2)
    ]
    assert chat.first_many([]) == []
