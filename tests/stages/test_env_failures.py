"""A run against a served environment that fails now and then: the broken episodes are
dropped and counted, their groups handled, the warning kept in the run's events, and the
run goes on (`stages.agent.play.drop_faults`)."""

from __future__ import annotations

import math
import re

import pytest

from catalog.query import query
from tests.conftest import run_spec
from tests.envs.test_served import flaky_server
from tests.stages.conftest import TINY_GRPO


@pytest.fixture
def flaky():
    srv = flaky_server("drop", every=7)  # the connection closed without an answer, one request in 7
    yield srv
    srv.stop()


def test_a_run_on_a_flaky_served_env_drops_what_failed_and_goes_on(spec_file, catalog, flaky):
    served = f"{{url: {flaky.url}, env: bandit, timeout: 5, retries: 0}}"
    path = spec_file(TINY_GRPO.replace("rollout: {env: bandit,", f"rollout: {{env: served, env_options: {served},"))
    summary, display = run_spec(path, catalog)
    assert summary.ran > 0
    failures = query(catalog, "select iteration, value from metrics where name = 'rollout/env_failures'").to_pylist()
    assert sorted(r["iteration"] for r in failures) == [0, 1] and sum(r["value"] for r in failures) >= 1
    rows = query(catalog, "select end_reason from trajectories").column(0).to_pylist()
    assert len(rows) == 8 - sum(r["value"] for r in failures)  # dropped ones are not stored, nor trained on
    assert not any(r.startswith("env_fault") for r in rows)
    # the groups planned travel with the table: an Online-k slice follows group edges (catalog.datasets)
    from catalog.datasets import GROUPS_KEY

    for key in (k for k in catalog.result_keys() if k.startswith("rollout-")):
        assert catalog.ref(key, "trajectories").read().schema.metadata[GROUPS_KEY] == b"2"
    advantages = query(catalog, "select value from metrics where name like 'adv/%'").column(0).to_pylist()
    assert advantages and all(math.isfinite(v) for v in advantages)
    # a group left with one member: its one episode is its own baseline, an advantage of 0
    batches = [k for k in catalog.result_keys() if k.startswith("advantage-")]
    sizes = {}
    for key in batches:
        batch = catalog.ref(key, "batch").read(["group", "advantages"]).to_pylist()
        for row in batch:
            sizes.setdefault((key, row["group"]), []).append(row["advantages"])
    alone = [adv for adv in sizes.values() if len(adv) == 1]
    assert alone and all(set(adv[0]) == {0.0} for adv in alone), sizes
    events = query(catalog, "select rule, metric, message from events").to_pylist()
    assert any(e["rule"] == "rollout" and e["metric"] == "rollout/env_failures" for e in events)
    assert any("episodes dropped" in e["message"] and "connection" in e["message"] for e in events)
    assert any("episodes dropped" in w for w in display.warnings)
    assert any(re.search(r"by seed: served \d+: 1 of 2", w) for w in display.warnings), display.warnings


def test_past_the_share_the_spec_allows_the_stage_fails_in_one_line(spec_file, catalog, flaky):
    from common.errors import StageFailed

    served = f"{{url: {flaky.url}, env: bandit, timeout: 5, retries: 0}}"
    text = TINY_GRPO.replace("rollout: {env: bandit,", f"rollout: {{env: served, env_options: {served},")
    with pytest.raises(StageFailed, match=r"episodes failed in their environment \(more than 0 of them\)"):
        run_spec(spec_file(text), catalog, ("rollout.max_env_failures=0",))
