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


def test_the_kl_reference_is_loaded_once_a_version_by_one_helper(tiny_policy, monkeypatch):
    """Issue 93: the resident trainer, a group member and a fit each loaded the reference
    their own way (and a member passed the reference as its policy). One helper now does,
    once per stored version, and nothing without a KL term."""
    from types import SimpleNamespace

    from stages.models import policy as policies
    from stages.training.loops import KLReference

    loads: list[str] = []
    real = policies.load_model
    monkeypatch.setattr(policies, "load_model", lambda path, **kw: loads.append(str(path)) or real(path, **kw))
    ref = SimpleNamespace(address="v0", local_path=lambda: tiny_policy)
    held = KLReference()
    assert held.logprobs(SimpleNamespace(kl_coef=0.0), ref, "cpu") is None and loads == []
    first = held.logprobs(SimpleNamespace(kl_coef=0.1), ref, "cpu")
    again = held.logprobs(SimpleNamespace(kl_coef=0.1), ref, "cpu")
    assert callable(first) and callable(again) and loads == [str(tiny_policy)]
    held.logprobs(SimpleNamespace(kl_coef=0.1), SimpleNamespace(address="v1", local_path=lambda: tiny_policy), "cpu")
    assert len(loads) == 2
