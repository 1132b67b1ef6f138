"""The vLLM engine's GPU path, seen on CPU: a stand-in `vllm` module records what the
engine asks of vLLM 0.32's API (the range pyproject.toml allows), with the engine told
it runs on a GPU. What it holds: CUDA graphs on, sleep mode between plays, weights from
the trainer's memory through ``reload_weights(weights_iterator=...)``, and the memory
share asked for. The real engine on CPU is tested by tests/stages/engines/test_vllm.py
(.ci/vllm); this is the part a CPU cannot run."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from stages.engines import EngineSettings, VLLMSettings
from stages.engines import vllm as engine_module
from stages.engines.hosts import EngineHost, from_memory


class FakeLLM:
    made: ClassVar[list[FakeLLM]] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs, self.calls = kwargs, []
        FakeLLM.made.append(self)

    def get_tokenizer(self) -> Any:
        return types.SimpleNamespace(eos_token_id=0)

    def collective_rpc(self, method: str, kwargs: dict[str, Any]) -> None:
        self.calls.append((method, kwargs))

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache", {}))

    def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", {"level": level}))

    def wake_up(self, tags: Any = None) -> bool:
        self.calls.append(("wake_up", {}))
        return True


@pytest.fixture
def on_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("vllm")
    fake.LLM = FakeLLM  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(engine_module, "_on_cpu", lambda: False)
    FakeLLM.made.clear()


def _checkpoint(tmp_path: Path, dtype: str = "bfloat16") -> Path:
    (tmp_path / "config.json").write_text(f'{{"dtype": "{dtype}"}}')
    return tmp_path


def test_on_a_gpu_the_engine_asks_for_cuda_graphs_sleep_mode_and_its_memory_share(on_gpu, tmp_path):
    engine = engine_module.VLLMEngine(_checkpoint(tmp_path), **dict(VLLMSettings(0.35, None, True).options()))
    kwargs = FakeLLM.made[0].kwargs
    assert kwargs["enforce_eager"] is False and kwargs["enable_sleep_mode"] is True
    assert kwargs["gpu_memory_utilization"] == 0.35 and kwargs["dtype"] == "bfloat16"
    assert engine.sleeps


def test_weights_from_memory_reload_in_place_after_waking_and_the_engine_sleeps_after_a_play(on_gpu, tmp_path):
    engine = engine_module.VLLMEngine(_checkpoint(tmp_path), sleep=True)
    llm = FakeLLM.made[0]
    engine.rest()
    engine.load_state({"w": "tensor"})
    assert [c[0] for c in llm.calls] == ["sleep", "wake_up", "reload_weights", "reset_prefix_cache"]
    method, kwargs = llm.calls[2]
    assert (method, kwargs) == ("reload_weights", {"weights_iterator": [("w", "tensor")], "is_checkpoint_format": True})
    assert not engine.asleep
    engine.load_weights(tmp_path)  # from files: the same API, by path
    assert llm.calls[-2] == ("reload_weights", {"weights_path": str(tmp_path)})

    class Host(EngineHost):
        def _bring(self, policy: Any) -> Any:
            return engine

    Host("vllm").run(None, lambda e: None)
    assert llm.calls[-1] == ("sleep", {"level": 1})  # a trainer on the same GPU gets its memory back


def test_on_cpu_the_engine_keeps_eager_mode_no_sleep_and_loads_files(monkeypatch, tmp_path):
    fake = types.ModuleType("vllm")
    fake.LLM = FakeLLM  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(engine_module, "_on_cpu", lambda: True)
    FakeLLM.made.clear()
    engine = engine_module.VLLMEngine(_checkpoint(tmp_path, "float32"), sleep=True)
    assert FakeLLM.made[0].kwargs["enforce_eager"] is True and "enable_sleep_mode" not in FakeLLM.made[0].kwargs
    with pytest.raises(NotImplementedError, match="on CPU loads checkpoints"):
        engine.load_state({})


def test_which_engines_take_the_trainers_tensors():
    assert EngineSettings("hf").takes_tensors
    assert EngineSettings("vllm", actors=1, actor_gpus=0.5).takes_tensors
    assert not EngineSettings("vllm", actors=1).takes_tensors

    class Cfg:
        def __init__(self, settings: EngineSettings) -> None:
            self.settings = settings

        def engine_settings(self) -> EngineSettings:
            return self.settings

    assert from_memory(Cfg(EngineSettings("vllm", actors=1, actor_gpus=1.0))) == ("policy",)
    assert from_memory(Cfg(EngineSettings("vllm", actors=1))) == ()
