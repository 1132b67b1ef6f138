"""Ray Data settings shared by the stages that use it."""

from __future__ import annotations


def quiet() -> None:
    """No progress bars or per-dataset log lines in the run's display."""
    import logging

    import ray.data

    for name in ("ray.data", "ray.train", "ray.tune"):
        logging.getLogger(name).setLevel(logging.ERROR)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
