"""A GGUF file (llama.cpp's format) read into a plain transformers model.

transformers reads GGUF with ``gguf_file=`` (the `gguf` package), dequantising every
tensor, but refuses to ``save_pretrained`` a model loaded that way. So the model is
rebuilt from its config with the GGUF quantisation setting dropped, and the
dequantised weights are loaded into it, every key matched (strict): a plain model
that saves as safetensors and loads back with ``AutoModelForCausalLM`` alone, in
transformers or vLLM. No llama.cpp build is needed.

transformers parses the file once for the tokenizer, once for the config and once for
the tensors, and builds gguf's tensor-name map once a tensor; `_read_once` hands every
one of those calls the same parsed file and map (for SmolLM2-135M: ~20 CPU-seconds
less of ~30).
"""

from __future__ import annotations

import contextlib
import functools
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_ONE_AT_A_TIME = threading.Lock()


@contextlib.contextmanager
def _read_once() -> Iterator[None]:
    """Within the block, `gguf.GGUFReader` of a path already read gives that reader
    again, and `gguf.get_tensor_name_map` a map already built (transformers imports
    both from `gguf` where it calls them; both are only read). Restored after; one
    block at a time in the process."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def read(path: str | Path, mode: str = "r") -> Any:
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = reader(path, mode)  # type: ignore[arg-type]
        return readers[key]

    with _ONE_AT_A_TIME:
        gguf.GGUFReader, gguf.get_tensor_name_map = read, functools.cache(name_map)  # type: ignore[misc,assignment]
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map  # type: ignore[misc]


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
    with _read_once():
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
