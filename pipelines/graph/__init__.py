"""The graph room: a spec's DAG of stages and its wiring (`dag`), the plan of steps
over iterations and what the catalog already holds (`plan`), `--to/--only/--from`
selections (`select`), `pipeline show` (`show`), and `load`: a spec file loaded and its
graph checked. Imports `pipelines.spec` only."""
