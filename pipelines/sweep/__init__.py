"""The sweep room: a sweep file (a base spec and a search space, `file`) and its trials,
each a run, under Ray Tune (`tune`). Imports `pipelines.spec`, `graph` and `run`."""
