def test_a_name_with_a_trailing_newline_is_refused_everywhere_a_pattern_checks_it():
    """`$` matches before a final newline; every name pattern ends with `\\Z` instead
    (issue 93: "get_weather\\n" passed the tool-name check and reached the prompt)."""
    import re

    from catalog import manifests
    from pipelines.spec.build import NODE_NAME
    from stages.endpoint.messages import FUNCTION_NAME

    for pattern, good in (
        (manifests.NAME, "run-1"),
        (manifests.IDENTIFIER, "trajectories"),
        (FUNCTION_NAME, "get_weather"),
        (NODE_NAME, "rollout"),
    ):
        assert pattern.match(good) and not pattern.match(good + "\n"), pattern.pattern
    assert manifests.is_name("run") and not manifests.is_name("run\n")
    assert all(not p.pattern.endswith("$") for p in vars(manifests).values() if isinstance(p, re.Pattern))
