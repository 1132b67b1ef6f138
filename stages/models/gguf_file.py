"""A GGUF file (llama.cpp's format) read into a plain transformers model.

transformers reads GGUF with ``gguf_file=`` (the `gguf` package), dequantising every
tensor, but refuses to ``save_pretrained`` a model loaded that way. So the model is
rebuilt from its config with the GGUF quantisation setting dropped, and the
dequantised weights are loaded into it, every key matched (strict): a plain model
that saves as safetensors and loads back with ``AutoModelForCausalLM`` alone, in
transformers or vLLM. No llama.cpp build is needed.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any


def is_gguf(path: str | Path) -> bool:
    return Path(path).suffix.lower() == ".gguf"


def load_gguf_tokenizer(path: str | Path) -> Any:
    """The tokenizer (with its chat template) a GGUF file holds, padding on the left."""
    from transformers import AutoTokenizer

    p = Path(path).expanduser()
    tokenizer = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    tokenizer.padding_side = "left"
    return tokenizer


def load_gguf(path: str | Path, dtype: str = "float32") -> tuple[Any, Any]:
    """A plain (unquantised) causal LM and its tokenizer from a GGUF file."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    p = Path(path).expanduser()
    logging.disable_progress_bar()
    tokenizer = load_gguf_tokenizer(p)
    with contextlib.redirect_stderr(io.StringIO()):  # transformers' GGUF reader draws its own progress bar
        loaded = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    if getattr(config, "tie_word_embeddings", False):
        plain.tie_weights()
    plain.generation_config = loaded.generation_config
    return plain.to(getattr(torch, dtype)), tokenizer
