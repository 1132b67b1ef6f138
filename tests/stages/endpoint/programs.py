"""Agent programs the agent-mode tests run, each written against the `openai` client."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from typing import Any

import openai

from examples.agents import frozenlake_chat


def client(task: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)


def ask(task: Any, messages: list[dict[str, Any]]) -> str:
    reply = client(task).chat.completions.create(model=task.model, messages=messages, max_tokens=6)
    return reply.choices[0].message.content or ""


def forgetful(task: Any) -> None:
    """Three calls, each with only the current state: its history rewritten every time."""
    for _ in range(3):
        ask(task, [{"role": "user", "content": task.env.render()}])
        task.env.step("Left")


def editing(task: Any) -> None:
    """Sends its answers back edited (stripped and shouted): the chat is not the one sampled."""
    messages = [{"role": "user", "content": task.env.render()}]
    for _ in range(2):
        text = ask(task, messages)
        task.env.step("Down")
        messages += [{"role": "assistant", "content": text.strip().upper() + "!"}, {"role": "user", "content": "and?"}]


def mixed(task: Any) -> Any:
    """Sample 0 plays well; samples 1-5 each fail in one of the ways that cost an episode."""
    kind = task.sample
    if kind == 0:
        return frozenlake_chat.play(task)
    if kind == 1:
        ask(task, [{"role": "user", "content": "hi"}])
        raise ValueError("the agent's own bug")
    if kind == 2:
        ask(task, [{"role": "user", "content": "hi"}])
        time.sleep(5)  # past its time limit
    if kind == 3:
        return None  # no call at all
    if kind == 4:
        with contextlib.suppress(openai.BadRequestError):  # a malformed request: a role the API does not have
            client(task).chat.completions.create(model=task.model, messages=[{"role": "robot", "content": "x"}])
        task.env.step("Left")
        return None
    ask(task, [{"role": "user", "content": "hi"}])
    task.env.step("Left")
    return "no score"  # `score` below gives no number for it


def score(task: Any, result: Any) -> Any:
    """A reward function: the environment's success, except for a result it cannot score."""
    return None if result == "no score" else float(task.env.success)


def snooping(task: Any) -> dict[str, Any]:
    """Records what it was given and what the endpoint says of another episode's path."""
    root, _, _ = task.base_url.partition("/e/")
    other = f"{root}/e/not-a-token/v1/chat/completions"
    request = urllib.request.Request(other, data=b"{}", headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request)
        status = 200
    except urllib.error.HTTPError as exc:
        status = exc.code
    first = task.env.render()
    ask(task, [{"role": "user", "content": first}])
    task.env.step("Right")
    return {"first": first, "status": status}


def grader(task: Any) -> Any:
    """A task-record agent: asks the policy the record's question once, and answers with the
    record's own `answer` where the sample is even (a wrong one where it is odd)."""
    ask(task, [{"role": "user", "content": task.record["prompt"]}])
    return task.record["answer"] if task.sample % 2 == 0 else "wrong"


def graded(task: Any, result: Any) -> float:
    """A reward function reading the task record: 1 for its answer, else 0."""
    return float(result == task.record["answer"])


def main() -> None:
    """A command program (``python -m tests.stages.endpoint.programs``): the chat loop of
    `frozenlake_chat` through ``AGENT_ENV_URL``; prints its task as its result."""
    import os

    task = json.loads(os.environ["AGENT_TASK"])
    env_url = os.environ["AGENT_ENV_URL"]
    oai = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    key = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}  # the env routes take the same key
    state = json.load(urllib.request.urlopen(urllib.request.Request(env_url, headers=key)))
    messages = [{"role": "user", "content": state["observation"]}]
    for _ in range(2):
        reply = oai.chat.completions.create(model=os.environ["AGENT_MODEL"], messages=messages, max_tokens=5)
        body = json.dumps({"action": "Right"}).encode()
        step = urllib.request.Request(f"{env_url}/step", data=body, headers={"Content-Type": "application/json", **key})
        state = json.load(urllib.request.urlopen(step))
        messages += [{"role": "assistant", "content": reply.choices[0].message.content}]
        messages += [{"role": "user", "content": state["observation"]}]
    print("some log line")
    print(json.dumps({"seed": task["seed"], "sample": task["sample"]}))


def _raw(task: Any, body: bytes) -> int:
    """POST `body` as it is to the chat route; the status."""
    request = urllib.request.Request(
        f"{task.base_url}/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {task.api_key}"},
    )
    try:
        urllib.request.urlopen(request)
        return 200
    except urllib.error.HTTPError as exc:
        return exc.code


def hostile(task: Any) -> Any:
    """Sample 0 sends a lone surrogate in its content, 1 in its stop strings, 2 a chat
    that the test's template refuses (content "refuse me"), 3 a tool whose parameters
    are not an object, 4 a tool result for a call never made; the rest play one turn."""
    kind = task.sample
    hello = {"role": "user", "content": "hi"}
    if kind == 0:
        return _raw(task, b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}')
    if kind == 1:
        return _raw(task, b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": ["\\udc00"]}')
    if kind == 2:
        return _raw(task, json.dumps({"model": "m", "messages": [{"role": "user", "content": "refuse me"}]}).encode())
    if kind == 3:
        tool = {"type": "function", "function": {"name": "move", "parameters": "direction"}}
        return _raw(task, json.dumps({"model": "m", "messages": [hello], "tools": [tool]}).encode())
    if kind == 4:
        chat = [hello, {"role": "tool", "tool_call_id": "call_9_9", "content": "moved"}]
        return _raw(task, json.dumps({"model": "m", "messages": chat}).encode())
    ask(task, [{"role": "user", "content": task.env.render()}])
    task.env.step("Left")
    return None


def stubborn() -> None:
    """A command program that makes one call, whatever its answer sleeps a minute, and
    writes its process id where ``STUBBORN_PID`` says (to see that it was stopped)."""
    import os

    with open(os.environ["STUBBORN_PID"], "a") as out:
        out.write(f"{os.getpid()}\n")
    with contextlib.suppress(Exception):
        openai.OpenAI(max_retries=0).chat.completions.create(
            model=os.environ["AGENT_MODEL"], messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
    time.sleep(60)


if __name__ == "__main__":
    import sys

    stubborn() if sys.argv[1:] == ["stubborn"] else main()
