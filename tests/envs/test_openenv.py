"""OpenEnv both ways, against the real ``openenv-core`` server: our environments played
by the package's own client equal the in-process play step by step; ``env: openenv``
plays a server like a local environment, trains from a spec, and fails as a served
environment does."""

from __future__ import annotations

import pytest

pytest.importorskip("openenv.core")  # the `openenv` extra

import envs
from catalog.query import query
from envs.base import EnvError, EnvFault
from tests.conftest import run_spec
from tests.fixtures.openenv_servers import failing, free_port, ours
from tests.stages.conftest import TINY_GRPO

SERVED = [
    ("sokoban", {"num_boxes": 1}),
    ("frozenlake", {}),
    ("bandit", {}),
    ("countdown", {}),
]
#: each environment's moves: action words and ones that are not, past the episode's end
MOVES = {
    "sokoban": ["Up", "left", "nonsense", "Down", "Right", "Right", "Up"],
    "frozenlake": ["Down", "bogus", "Right", "Down", "Right", "Down", "Right"],
    "bandit": ["nonsense", "Phoenix", "Dragon"],
    "countdown": ["two plus two", "(3 + 5) * 2", "1"],
}


@pytest.fixture(scope="module")
def servers():
    with ours(SERVED) as urls:
        yield dict(zip([name for name, _ in SERVED], urls))


@pytest.mark.parametrize("name", [name for name, _ in SERVED])
def test_the_packages_client_plays_ours_as_in_process(servers, name):
    from openenv.core import GenericEnvClient

    options = dict(SERVED)[name]
    for seed, split in ((7, "train"), (11, "validation")):
        local = envs.make(name, **options)
        with GenericEnvClient(base_url=servers[name]).sync() as client:
            first = client.reset(seed=seed, split=split)
            assert first.observation["text"] == local.reset(seed, split)
            assert first.observation["instructions"] == local.instructions
            assert (first.reward, first.done) == (None, False)
            for move in MOVES[name]:
                remote = client.step({"message": move})
                text, reward, done, info = local.step(move)
                seen = remote.observation
                assert (seen["text"], remote.reward, remote.done) == (text, reward, done), move
                assert (seen["success"], seen["action_valid"]) == (info["success"], info["action_valid"]), move
                assert seen["info"] == {k: v for k, v in info.items() if k not in ("success", "action_valid")}


def test_env_openenv_plays_a_server_as_the_local_environment(servers):
    remote = envs.make(
        "openenv", url=servers["sokoban"], splits=True, max_turns=5, max_actions_per_turn=5, max_actions_per_traj=10
    )
    local = envs.make("sokoban", num_boxes=1)
    assert remote.budget == local.budget
    for seed, split in ((3, "train"), (5, "validation"), (3, None)):
        assert remote.reset(seed, split) == local.reset(seed, split)
        assert remote.instructions == local.instructions
        for move in MOVES["sokoban"]:
            assert remote.step(move) == local.step(move)
        assert (remote.done, remote.success) == (local.done, local.success)
    remote.close()


def test_a_spec_trains_an_iteration_on_an_openenv_server(servers, spec_file, catalog):
    options = f"{{url: {servers['bandit']}, max_turns: 1}}"
    text = TINY_GRPO.replace("rollout: {env: bandit,", f"rollout: {{env: openenv, env_options: {options},")
    summary, _ = run_spec(spec_file(text.replace("iterations: 2", "iterations: 1")), catalog)
    assert summary.ran > 0
    rows = query(catalog, "select env, score, success, end_reason from trajectories").to_pylist()
    assert len(rows) == 4 and {r["env"] for r in rows} == {"openenv"}
    assert not any(r["end_reason"].startswith("env_fault") for r in rows)
    # the bandit's own rewards: a valid answer pays (the arms' payoffs), an invalid one nothing
    assert all(r["success"] == (r["score"] > 0) for r in rows)
    losses = query(catalog, "select value from metrics where name like 'actor/%loss%'").column(0).to_pylist()
    assert losses, "the update ran on what the server's episodes played"


LAKE = {"slippery": False, "render": "grid"}  # the default's lakes (starpo.yaml)
LAKE_YAML = "{slippery: false, render: grid}"


def test_a_run_through_an_openenv_server_samples_the_tokens_it_samples_in_process(spec_file, catalog, tmp_path):
    """The OpenEnv preset's claim at small scale: the same lakes through openenv-core's
    server and our client give the same prompts, the same sampled tokens and the same
    scores as the environment in process."""
    from catalog.store import Catalog
    from pipelines.graph.load import load_spec

    local = TINY_GRPO.replace("rollout: {env: bandit,", f"rollout: {{env: frozenlake, env_options: {LAKE_YAML},")
    local = local.replace(
        "agent: {max_new_tokens: 8}",
        "agent: {max_new_tokens: 8, max_turns: 3, max_actions_per_turn: 1, max_actions_per_traj: 3}",
    )
    with ours([("frozenlake", LAKE)]) as (url,):
        load_spec(
            "starpo-openenv-frozenlake.yaml", (f"rollout.env_options.url={url}", f"eval.env_options.openenv.url={url}")
        )
        options = f"{{url: {url}, max_turns: 3, max_actions_per_turn: 1, splits: true}}"
        served = local.replace(f"env: frozenlake, env_options: {LAKE_YAML}", f"env: openenv, env_options: {options}")
        run_spec(spec_file(served), catalog, ("run.iterations=1",))
    other = Catalog(str(tmp_path / "in-process"))
    run_spec(spec_file(local), other, ("run.iterations=1",))
    columns = "seed, split, token_ids, loss_mask, score, success, num_turns"
    rows = [query(c, f"select {columns} from trajectories order by seed, sample").to_pylist() for c in (catalog, other)]
    assert rows[0] and rows[0] == rows[1]


def test_our_loop_plays_an_answer_on_an_openenv_server_as_in_process():
    """An answer the agent loop parses goes to the server, which judges it: a move is
    taken as in process, and a word the server rejects is an invalid action (no step, the
    format penalty), as an invalid word is in process."""
    from dataclasses import asdict

    import pyarrow as pa

    from stages.agent.corpus import embedded_tokenizer
    from stages.agent.loop import AgentConfig
    from stages.agent.play import PlayJob, episode_specs, play_batch
    from tests.stages.endpoint.test_episodes import Saying

    tokenizer = embedded_tokenizer(600)
    agent = AgentConfig(think=False, history=0, max_turns=3, max_actions_per_turn=1, max_actions_per_traj=3)
    job = PlayJob(agent, agent.sampling(1.0), 0, 0)
    columns = ("seed", "score", "success", "num_actions", "format_valid_rate", "end_reason")
    with ours([("frozenlake", LAKE)]) as (url,):
        served = {"url": url, "max_turns": 3, "max_actions_per_turn": 1, "splits": True}
        for answer in ("Right</answer>", "Sideways</answer>"):
            engine = Saying(tokenizer, answer)
            rows = {}
            for name, options in (("frozenlake", LAKE), ("openenv", served)):
                specs = episode_specs(name, options, [3, 4, 5], 1)
                table = play_batch(engine, pa.Table.from_pylist([asdict(s) for s in specs]), job)
                rows[name] = [
                    {k: r[k] for k in columns} | {"turns": [t["valid"] for t in r["turns"]]} for r in table.to_pylist()
                ]
            assert rows["openenv"] == rows["frozenlake"], answer
            moved = sum(r["num_actions"] for r in rows["openenv"])
            assert moved > 0 if answer.startswith("Right") else moved == 0


def test_wrong_options_and_a_dead_server_are_one_line(servers):
    with pytest.raises(EnvError, match=r"the action has no field 'mesage' \(did you mean 'message'\?\)"):
        envs.make("openenv", url=servers["bandit"], action_key="mesage")
    with pytest.raises(EnvError, match=r"the observation has no field 'txt' \(did you mean 'text'\?\)"):
        envs.make("openenv", url=servers["bandit"], text_key="txt")
    with pytest.raises(EnvError, match=r"url must start with http:// or https://"):
        envs.make("openenv", url="ws://127.0.0.1:1")
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EnvFault, match=r"cannot reach the server"):
        envs.make("openenv", url=dead, retries=0, timeout=2)


def test_a_failing_step_costs_its_episode_and_the_session_limit_is_named():
    with failing("boom") as url:
        env = envs.make("openenv", url=url, retries=0)
        assert env.reset(4) == "say something (seed 4)"
        with pytest.raises(EnvFault, match=r"step: the server failed \(EXECUTION_ERROR: .*cannot say boom"):
            env.step("boom")
        assert env.reset(5) == "say something (seed 5)", "a new session after the fault"
        assert env.step("hello") == ("you said hello", 1.0, True, {"success": True, "action_valid": True})
        env.close()  # its session is freed
        held = [envs.make("openenv", url=url) for _ in range(8)]
        for h in held:
            h.reset(0)
        with pytest.raises(EnvFault, match=r"at its limit of sessions .* lower the rollout's max_batch"):
            env.reset(6)
        for h in [*held, env]:
            h.close()


def test_a_server_that_dies_after_the_check_ends_the_run_in_one_line(spec_file, catalog):
    from common.errors import StageFailed
    from pipelines.graph.load import load_spec
    from pipelines.run.progress import Quiet
    from pipelines.run.runner import Runner

    with ours([("bandit", {})]) as (url,):
        options = f"{{url: {url}, max_turns: 1, retries: 0, timeout: 2}}"
        text = TINY_GRPO.replace("rollout: {env: bandit,", f"rollout: {{env: openenv, env_options: {options},")
        runner = Runner(load_spec(spec_file(text)), catalog, Quiet())  # the check plays the server
    with pytest.raises(StageFailed, match=r"episodes failed in their environment .*cannot reach the server"):
        runner.run()
    assert not [k for k in catalog.result_keys() if k.startswith("rollout-")], "nothing half-written"


def test_serving_mistakes_are_one_line_and_exit_2(capsys):
    from envs.served import main

    for argv, said in (
        (["--protocol", "openenv", "--options", "[1]"], "--options: a JSON object"),
        (["--protocol", "openenv", "--env", "sokobn"], "unknown environment 'sokobn' (did you mean 'sokoban'?)"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and said in err and "\n" not in err


def test_a_servers_schema_is_read_once_a_run(servers, monkeypatch):
    import urllib.request

    reads = []
    real = urllib.request.urlopen
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    made = [envs.make("openenv", url=servers["frozenlake"]) for _ in range(3)]
    assert [r for r in reads if str(r).endswith("/schema")] == [servers["frozenlake"] + "/schema"]
    for env in made:
        env.close()
