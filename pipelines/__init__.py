"""The declarative layer: spec loading and checking, the DAG, the runner and the
`pipeline` CLI. Nothing imports this package except the CLI entry point and tests."""
