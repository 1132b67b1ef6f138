def test_metric_sums_agree_on_their_names_before_summing(monkeypatch):
    """Issue 93: a worker whose share of the batch was empty reported only the gradient
    norm, and all-reduced a shorter list than its peer (gloo errors, or hangs until the
    group's timeout). The names are agreed first: both reduce lists of one length."""
    import torch
    import torch.distributed as dist

    from stages.training import worker

    peer = ["actor/entropy", "actor/grad_norm", "actor/pg_loss"]
    lengths: list[int] = []
    monkeypatch.setattr(worker, "world", lambda: (0, 2))
    monkeypatch.setattr(dist, "all_gather_object", lambda out, obj: out.__setitem__(slice(None), [obj, peer]))
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None: (lengths.append(len(t)), t.mul_(2)))
    monkeypatch.setattr(worker, "collective_device", lambda: torch.device("cpu"))
    empty = worker.Sums()
    empty.add("actor/grad_norm", 1.5)
    means = empty.means()
    assert lengths == [2 * len(peer)]
    assert set(means) == set(peer) and means["actor/grad_norm"] == 1.5 and means["actor/entropy"] == 0.0
