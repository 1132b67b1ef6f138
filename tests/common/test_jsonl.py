"""JSON Lines read back whatever text a message holds (issue 93: U+2028, U+2029 and U+0085
are valid unescaped in JSON, and `str.splitlines` split transcripts at them)."""

from __future__ import annotations

import json

from common import jsonl
from envs.records import _records
from stages.endpoint import chats

ODD = "a\u2028b\u2029c\u0085d\x1ce\x1df\x1eg\x0bh\x0ci"


def test_transcripts_and_records_with_line_separators_in_their_text_read_back(tmp_path):
    chat = [{"role": "user", "content": ODD}, {"role": "assistant", "content": "ok " + ODD}]
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps({"messages": chat}, ensure_ascii=False) + "\r\n", encoding="utf-8")
    _, (got,) = chats.read(str(path))
    assert [m["content"] for m in got] == [ODD, "ok " + ODD]
    records = tmp_path / "records.jsonl"
    rows = [{"prompt": ODD, "answer": "1"}, {"prompt": "plain", "answer": "2"}]
    records.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert _records(records, "prompt")[0][0]["prompt"] == ODD
    assert jsonl.lines("{}\r\n{}\n") == ["{}", "{}", ""]
