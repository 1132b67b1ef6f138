"""The `hf` engine: transformers ``generate`` on a left-padded batch (CPU default).

Multi-turn rollouts send, each turn, prompts that extend the previous turn's
prompt + response. The engine keeps the previous call's key/value cache and, when
every new prompt extends a distinct row of the previous batch, feeds only the new
tokens (the gap between a row's old tokens and its new ones is masked out; position
ids follow the mask). This is prefix caching, as vLLM does it, and saves
re-encoding the whole chat every turn (most of a turn's compute on CPU).

When the prompts extend no earlier row (each turn its own prompt, `agent.history:
k`, and every first turn), the engine keeps the key/value cache of the prefix all
the prompts share (the system prompt and instructions: most of a prompt's tokens
with ``history: 0``), computed once for one row and reused by every later call
that starts with it, and feeds each row only what follows it.
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from common import live
from stages.engines.base import Completion, SamplingParams


def left_pad(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids left-padded to one width, and their attention mask."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s) :] = 1
    return ids, mask


@dataclass
class _Batch:
    """The previous call's state: each row's real tokens, the padded ids and mask
    the cache was computed on, and the cache (which lacks the last token)."""

    rows: list[tuple[int, ...]]
    ids: torch.Tensor
    mask: torch.Tensor
    cache: Any


#: the shortest shared prefix worth a cache of its own (tokens)
MIN_SHARED_PREFIX = 8


def shared_prefix(prompts: list[list[int]]) -> int:
    """The length of the prefix every prompt shares, leaving each at least one token."""
    first = prompts[0]
    n = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        k = 0
        while k < n and p[k] == first[k]:
            k += 1
        n = k
    return max(n, 0)


#: transformers' generation settings that would change the distribution sampled from, each
#: set off (`Sampler` applies the temperature, top-k and top-p itself)
NEUTRAL: dict[str, Any] = {
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "min_length": 0,
    "min_new_tokens": None,
    "exponential_decay_length_penalty": None,
    "sequence_bias": None,
}


class Sampler:
    """The one logits processor of a `generate` call: scales by the temperature (0:
    greedy, scale 1), applies top-k and top-p, and keeps each step's log-softmax(logits /
    T) only until the next step names the token sampled from it. So the sampled tokens'
    log-probs cost one step's [batch, vocab] at a time, not the [batch, steps, vocab]
    logits transformers' ``output_logits`` keeps (10 GB at 128 rows x 128 steps over
    Qwen2.5's 151,936 tokens). The temperature stays a float32 Python number."""

    def __init__(self, width: int, temperature: float, top_k: int, top_p: float) -> None:
        self.width, self.scale = width, temperature if temperature > 0 else 1.0
        self.top_k, self.top_p = top_k, top_p
        self.prev: torch.Tensor | None = None
        self.picked: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.picked.append(self.prev.gather(-1, input_ids[:, -1:])[:, 0])
        scaled = scores.float() / self.scale
        self.prev = torch.log_softmax(scaled, dim=-1)
        if self.top_k:
            kth = torch.topk(scaled, min(self.top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if self.top_p < 1:
            ordered, order = torch.sort(scaled, descending=False)
            drop = ordered.softmax(-1).cumsum(-1) <= 1 - self.top_p
            drop[:, -1] = False  # the most likely token always stays
            scaled = scaled.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        return scaled

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """The log-probs [batch, steps] of the tokens sampled after column `width`."""
        if self.prev is not None and sequences.shape[1] > self.width + len(self.picked):
            self.picked.append(self.prev.gather(-1, sequences[:, self.width + len(self.picked), None])[:, 0])
            self.prev = None
        if not self.picked:
            return torch.zeros((sequences.shape[0], 0))
        return torch.stack(self.picked, dim=1)


class HFEngine:
    """Holds a causal LM and its tokenizer loaded from a policy checkpoint."""

    def __init__(self, policy_dir: Path, device: str = "auto", prefix_cache: bool = True) -> None:
        from stages.models.policy import load_policy

        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        self.model, self.tokenizer = load_policy(policy_dir, device=self.device)
        self.policy_dir = Path(policy_dir)
        self.model.eval()
        from transformers import GenerationConfig

        # the checkpoint's generation_config.json fills no setting `generate` leaves unset (NEUTRAL)
        self.model.generation_config = GenerationConfig()
        self.prefix_cache = prefix_cache
        self._last: _Batch | None = None
        self._shared: tuple[tuple[int, ...], Any] | None = None  # a shared prefix and its one-row cache
        self._stop_criteria: dict[tuple[str, ...], Any] = {}  # stop strings -> their criterion (`_criteria`)

    def load_weights(self, policy_dir: Path) -> bool:
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for f in sorted(Path(policy_dir).glob("*.safetensors")):
            state.update(load_file(str(f), device=self.device))
        self.load_state(state, str(policy_dir))
        return True

    def load_state(self, state: dict[str, Any], source: str = "the weights given") -> None:
        """Load a policy's tensors by name (from a checkpoint, or from the trainer's memory)."""
        result = self.model.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
        if set(result.missing_keys) - tied or result.unexpected_keys:
            raise ValueError(
                f"{source} do not fit the engine's model: missing "
                f"{sorted(set(result.missing_keys) - tied)[:3]}, unexpected {result.unexpected_keys[:3]}"
            )
        if tied:
            self.model.tie_weights()
        self._last = self._shared = None

    def _pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def _inputs(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Input ids, attention mask and a reusable cache (or None) for `prompts`."""
        pad, last = self._pad_id(), self._last
        reuse = self._match(prompts) if last is not None and self.prefix_cache else None
        if reuse is None:
            return self._from_shared(prompts) if self.prefix_cache else (*left_pad(prompts, pad), None)
        assert last is not None
        index = torch.tensor(reuse, dtype=torch.long)
        ids, mask = left_pad([p[len(last.rows[j]) :] for p, j in zip(prompts, reuse)], pad)
        last.cache.batch_select_indices(index.to(self.device))
        return (torch.cat([last.ids[index], ids], dim=1), torch.cat([last.mask[index], mask], dim=1), last.cache)

    def _from_shared(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Inputs that start from the cache of the prefix all `prompts` share: the
        prefix once per row, then each row's rest left-padded (the gap is masked out)."""
        # the split is this batch's own shared prefix, whatever was kept: the samples are a
        # function of the batch and the weights, not of the calls before (a resumed run
        # replays a batch in a fresh engine)
        n = shared_prefix(prompts)
        if n < MIN_SHARED_PREFIX:
            return (*left_pad(prompts, self._pad_id()), None)
        head_ids, kept = tuple(prompts[0][:n]), self._shared
        if kept is None or kept[0] != head_ids:
            prefix = torch.tensor([head_ids], dtype=torch.long, device=self.device)
            kept = self._shared = (head_ids, self.model(input_ids=prefix, use_cache=True).past_key_values)
        rows = len(prompts)
        cache = copy.deepcopy(kept[1])
        cache.batch_select_indices(torch.zeros(rows, dtype=torch.long, device=self.device))
        ids, mask = left_pad([p[n:] for p in prompts], self._pad_id())
        head = torch.tensor(head_ids, dtype=torch.long).expand(rows, n)
        return torch.cat([head, ids], dim=1), torch.cat([torch.ones_like(head), mask], dim=1), cache

    def _match(self, prompts: list[list[int]]) -> list[int] | None:
        """For each prompt, the distinct previous row it extends (None if any has none)."""
        assert self._last is not None
        rows = {row: j for j, row in enumerate(self._last.rows)}
        lengths = sorted({len(r) for r in rows}, reverse=True)
        found: list[int] = []
        for p in prompts:
            j = next((rows[tuple(p[:n])] for n in lengths if n < len(p) and tuple(p[:n]) in rows), None)
            if j is None:
                return None
            found.append(j)
        return found if len(set(found)) == len(found) else None

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        if not prompts:
            return []
        ids, mask, cache = self._inputs(prompts)
        self._last = None
        width = ids.shape[1]
        greedy = params.temperature == 0
        stops = self._stops(params)
        devices = [torch.device(self.device)] if self.device.startswith("cuda") else []
        with torch.random.fork_rng(devices=devices, device_type="cuda"):  # the process's RNG is left as it was
            torch.manual_seed(params.seed)
            out = self._sample(ids, mask, cache, params, greedy, stops)
        new = out.sequences[:, width:].cpu()
        logp = out.recorder.finish(out.sequences).cpu()
        completions = [self._trim(new[i].tolist(), logp[i].tolist(), stops) for i in range(len(prompts))]
        if self.prefix_cache:
            gen_mask = torch.zeros_like(new)
            for i, c in enumerate(completions):
                gen_mask[i, : len(c.token_ids)] = 1
            self._last = _Batch(
                rows=[tuple(p) + tuple(c.token_ids) for p, c in zip(prompts, completions)],
                ids=out.sequences.cpu(),
                mask=torch.cat([mask, gen_mask], dim=1),
                cache=out.past_key_values,
            )
        return completions

    @torch.no_grad()
    def score(self, prompts: list[list[int]], responses: list[list[int]], temperature: float) -> list[list[float]]:
        """The responses' log-probs under the policy, by the training's own forward pass
        (`stages.models.forward.sampled_logprobs`) on prompt + response."""
        from stages.models.forward import sampled_logprobs

        if not prompts:
            return []
        seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self._pad_id(), dtype=torch.long)
        attention, mask = torch.zeros_like(ids), torch.zeros_like(ids)
        for i, (p, s) in enumerate(zip(prompts, seqs)):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            attention[i, : len(s)] = 1
            mask[i, len(p) : len(s)] = 1
        temps = torch.full((len(seqs),), float(temperature))
        logp, _ = sampled_logprobs(
            self.model, ids.to(self.device), attention.to(self.device), mask.to(self.device), temps.to(self.device)
        )
        return [logp[i, len(p) : len(s)].cpu().tolist() for i, (p, s) in enumerate(zip(prompts, seqs))]

    def _stops(self, params: SamplingParams) -> tuple[list[int], list[str]]:
        """What ends a row: token ids (the end-of-turn token, and each stop string that is
        one token of the vocabulary, e.g. the embedded tokenizer's ``</answer>``) and the
        other stop strings, which are matched on the decoded text."""
        ids = [] if self.tokenizer.eos_token_id is None else [self.tokenizer.eos_token_id]
        texts = []
        for s in params.stop:
            one = self.tokenizer.encode(s, add_special_tokens=False)
            if len(one) == 1 and self.tokenizer.decode(one) == s:
                ids.append(one[0])
            else:
                texts.append(s)
        return ids, texts

    def _sample(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        cache: Any,
        params: SamplingParams,
        greedy: bool,
        stops: tuple[list[int], list[str]],
    ) -> Any:
        from transformers import LogitsProcessorList

        stop_ids, stop_texts = stops
        recorder = Sampler(ids.shape[1], 0.0 if greedy else params.temperature, params.top_k, params.top_p)
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            past_key_values=cache,
            do_sample=not greedy,
            # every processing step is `Sampler`'s: each of transformers' own is set off here, so a
            # model's generation_config.json (a repetition penalty, a top-k of 50) changes nothing
            **NEUTRAL,
            logits_processor=LogitsProcessorList([recorder]),
            max_new_tokens=params.max_new_tokens,
            eos_token_id=stop_ids or None,
            pad_token_id=self._pad_id(),
            stopping_criteria=self._criteria(stop_texts),
            return_dict_in_generate=True,
            use_cache=True,
        )
        out.recorder = recorder
        return out

    def _criteria(self, stop_texts: list[str]) -> Any:
        """transformers' stop-string criterion for `stop_texts`, built once per run for
        the engine's tokenizer (`_StopTables`). ``generate(stop_strings=...)`` builds it on
        every call: a table over the whole vocabulary (0.4 CPU-s for SmolLM2's 49k tokens,
        1.7-2.0 for Qwen2.5's 152k), whose cache in transformers never hits because a fast
        tokenizer's ``get_vocab()`` lists the vocabulary in another order each time."""
        from transformers import StoppingCriteriaList
        from transformers.generation.stopping_criteria import StopStringCriteria

        if not stop_texts:
            return None
        key = tuple(stop_texts)
        if key not in self._stop_criteria:
            tables = live.slot("stop tables", _StopTables)
            self._stop_criteria[key] = tables.get(
                self._vocabulary, key, lambda: StopStringCriteria(self.tokenizer, list(key))
            )
            while len(self._stop_criteria) > _StopTables.KEEP:  # as many as the run keeps: bounded
                self._stop_criteria.pop(next(iter(self._stop_criteria)))
        return StoppingCriteriaList([self._stop_criteria[key]])

    @functools.cached_property
    def _vocabulary(self) -> str | None:
        """The digest of the engine's tokenizer files (what a stop string's table depends
        on), computed when a table is first needed: most engines never need one."""
        from stages.models.policy import tokenizer_digest

        return tokenizer_digest(self.policy_dir)

    def _trim(self, tokens: list[int], logprobs: list[float], stops: tuple[list[int], list[str]]) -> Completion:
        """Cut a row after its first stop token or stop string (`_stops`; what follows is padding)."""
        stop_ids, stop_texts = stops
        end, finished = len(tokens), False
        first = next((i for i, t in enumerate(tokens) if t in stop_ids), None)
        if first is not None:
            end, finished = first + 1, True
        if stop_texts:
            for n in range(1, end + 1):
                if any(s in self.tokenizer.decode(tokens[:n]) for s in stop_texts):
                    end, finished = n, True
                    break
        return Completion(tokens[:end], logprobs[:end], finished)


class _StopTables:
    """Stop-string criteria the run built, by tokenizer (`tokenizer_digest`) and stop
    strings: every engine of the run on the same tokenizer (each policy version's, an
    engine rebuilt after a restart) shares one instead of building its table again. The
    criterion keeps no state between calls. The run's `Live` slot ``stop tables``."""

    KEEP = 8

    def __init__(self) -> None:
        self.kept: dict[tuple[str, tuple[str, ...]], Any] = {}
        self.lock = threading.Lock()

    def get(self, vocabulary: str | None, stops: tuple[str, ...], build: Callable[[], Any]) -> Any:
        if vocabulary is None:
            return build()
        with self.lock:
            if (vocabulary, stops) not in self.kept:
                self.kept[(vocabulary, stops)] = build()
                while len(self.kept) > self.KEEP:
                    self.kept.pop(next(iter(self.kept)))
            return self.kept[(vocabulary, stops)]

    def close(self) -> None:
        with self.lock:
            self.kept.clear()
