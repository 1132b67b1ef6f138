"""The policy: a Hugging Face causal LM and its tokenizer, kept as checkpoints.

A policy artifact is a plain Hugging Face directory (``save_pretrained``,
safetensors, tokenizer files) plus ``policy.json`` with its version: 0 for the
initial/warm-started policy, +1 per update. It loads back with
``AutoModelForCausalLM.from_pretrained(dir)``, with no code from this project; the
embedded tokenizer with ``PreTrainedTokenizerFast.from_pretrained(dir)``
(`load_tokenizer`): ``AutoTokenizer`` would rebuild it as the model type's (Qwen2's
pre-tokenizer and normaliser), which splits the text differently.

The embedded default is a small Qwen2-architecture model built from a config
(seeded) with the tokenizer of `stages.models.tokenizer`: it runs on a laptop CPU and
needs no download. Any local model directory (e.g. Qwen2.5-0.5B-Instruct), a GGUF
file (`stages.models.gguf_file`) or a model the package registry carries, by its name
(`stages.models.packaged`: ``smollm2-135m-instruct``), goes through the same code via
``path:``.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from common import live
from common.config import ConfigProblem, param
from stages.models.chat_templates import template_text
from stages.models.gguf_file import is_gguf, load_gguf, load_gguf_tokenizer
from stages.models.lora import LoraSettings
from stages.models.packaged import PACKAGED, fetch, fetched, is_packaged, packaged

POLICY_FILE = "policy.json"
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+\Z")


#: the largest embedded model (built from its config): 10B parameters are 40 GB in
#: float32 before the optimizer's 80
MAX_EMBEDDED_PARAMETERS = 10_000_000_000


@dataclass(frozen=True)
class EmbeddedModel:
    """Sizes of the embedded Qwen2-architecture model (about 1M parameters)."""

    hidden_size: int = param(128, "width of the residual stream", ge=32)
    layers: int = param(4, "transformer blocks", ge=1)
    heads: int = param(4, "attention heads; hidden_size / heads >= 32 (vLLM's CPU attention needs it)", ge=1)
    kv_heads: int = param(2, "key/value heads (grouped-query attention); divides heads", ge=1)
    intermediate_size: int = param(384, "MLP width", ge=1)
    vocab_size: int = param(1024, "target BPE vocabulary of the embedded tokenizer", ge=300)
    max_positions: int = param(4096, "longest sequence the model accepts (tokens)", ge=128)
    tie_embeddings: bool = param(
        True,
        "share the input embedding and the output head (False: a separate "
        "head, which left the warm start's plateau sooner in experiments/warmstart.py)",
    )
    init_std: float = param(
        0.02,
        "std of the initial weights (Hugging Face's initializer_range; 0.05 left the warm start's "
        "plateau sooner in experiments/warmstart.py)",
        gt=0.0,
        le=1.0,
    )

    def __post_init__(self) -> None:
        if self.hidden_size % self.heads or self.hidden_size // self.heads < 32:
            raise ConfigProblem(
                "heads", f"hidden_size / heads must be a whole number >= 32, got {self.hidden_size} / {self.heads}"
            )
        if self.heads % self.kv_heads:
            raise ConfigProblem("kv_heads", f"must divide heads ({self.heads}), got {self.kv_heads}")
        params = self.parameters()
        if params > MAX_EMBEDDED_PARAMETERS:
            raise ConfigProblem(
                "hidden_size",
                f"this model would have about {params / 1e9:,.0f}B parameters; an embedded model may have at most "
                f"{MAX_EMBEDDED_PARAMETERS / 1e9:.0f}B (train a larger one from its checkpoint: model.path)",
            )

    def block_parameters(self) -> int:
        """About how many parameters the transformer blocks have (attention and MLP)."""
        head = self.hidden_size // max(self.heads, 1)
        attention = self.hidden_size * head * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        return self.layers * (attention + mlp)

    def parameters(self) -> int:
        """About how many parameters the model has (embeddings, attention, MLP)."""
        return self.block_parameters() + self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)


@dataclass(frozen=True)
class ModelConfig:
    """`model:` — which causal LM is the initial policy."""

    path: str | None = param(
        None,
        "the initial model: a local Hugging Face model directory, a .gguf file, a packaged model's name "
        "(smollm2-135m-instruct: fetched from the package registry by pip), or a hub id where the network "
        "allows; None: the embedded default",
    )
    embedded: EmbeddedModel = param(EmbeddedModel(), "sizes of the embedded default (ignored with path)")
    dtype: Literal["float32", "bfloat16", "float16"] = param(
        "float32", "weights dtype of the saved checkpoints (paper: bfloat16 on GPU)"
    )
    lora: LoraSettings | None = param(
        None, "train a LoRA adapter instead of every weight (None: full fine-tuning; {} for the defaults)"
    )
    trust_remote_code: bool = param(
        False,
        "run the Python code a model folder ships (its config's auto_map); off: such a folder is refused",
    )
    chat_template: str | None = param(
        None,
        "the chat template for a model whose files have none (a base checkpoint): chatml or gemma, or a Jinja "
        "template's text; None: the model's own (gemma3-270m: gemma)",
    )

    def __post_init__(self) -> None:
        if self.chat_template is not None:
            if self.path is None:
                raise ConfigProblem("chat_template", "the embedded model has its own template; set it with model.path")
            try:
                template_text(self.chat_template)
            except ValueError as exc:
                raise ConfigProblem("chat_template", str(exc)) from None
        if self.path is None or is_packaged(self.path) or _HUB_ID.match(self.path):
            return
        local = Path(self.path).expanduser()
        if is_gguf(local):
            if not local.is_file():
                raise ConfigProblem("path", f"'{self.path}': no such GGUF file")
            return
        if not local.is_dir():
            raise ConfigProblem(
                "path",
                f"'{self.path}' is not a model directory, a .gguf file or a packaged model (expected a folder "
                f"with config.json, e.g. a Qwen2.5-0.5B-Instruct download, or one of: {', '.join(PACKAGED)})",
            )
        config = local / "config.json"
        if config.is_file() and "auto_map" in json.loads(config.read_text()) and not self.trust_remote_code:
            raise ConfigProblem(
                "path",
                f"'{self.path}' asks to run its own code (config.json has auto_map); "
                "set model.trust_remote_code: true to allow it",
            )

    def template(self) -> str | None:
        """The template to give the model's tokenizer (`stages.models.chat_templates`): the
        spec's, else a packaged model's own, else None (the files' own)."""
        if self.chat_template is not None or self.path is None or not is_packaged(self.path):
            return self.chat_template
        return packaged(self.path).chat_template

    def local_path(self, log: Callable[[str], None] | None = None) -> str | None:
        """Where `path` is on this machine: a packaged model's file, fetched first when
        `log` is given (else None while it is missing), or `path` itself."""
        if self.path is None or not is_packaged(self.path):
            return self.path
        found = fetched(self.path)
        if found is None and log is not None:
            found = fetch(self.path, log)
        return None if found is None else str(found)


def _quiet() -> None:
    """No per-file progress bars from transformers in stage output."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


def build_embedded(cfg: EmbeddedModel, seed: int, tokenizer: Any) -> tuple[Any, Any]:
    """A freshly initialised embedded model for `tokenizer` (the embedded one:
    `stages.agent.corpus.embedded_tokenizer(cfg.vocab_size)`), and the tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    _quiet()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=cfg.tie_embeddings,
        initializer_range=cfg.init_std,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config), tokenizer


#: tokenizer classes that mean "tokenizer.json as saved" (the embedded tokenizer)
_AS_SAVED = ("TokenizersBackend", "PreTrainedTokenizerFast")
#: what loading adds to tokenizer_config.json (left out when saving, so that a saved
#: tokenizer is byte-identical to the one it was loaded from)
_LOAD_ONLY = ("is_local", "local_files_only")


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of a checkpoint directory, GGUF file (or hub id), padding on the
    left: the embedded one exactly as saved, any other through ``AutoTokenizer``. A
    run loads the same tokenizer files many times (engine, trainer, every stored
    version, each a copy of the same files); from the second time on it gets a copy of
    the first (`_Tokenizers`)."""
    digest = tokenizer_digest(path)
    memo = live.slot("tokenizers", _Tokenizers)
    if digest is not None and (kept := memo.get(digest)) is not None:
        kept.name_or_path = str(path)  # where this one was read from, not the first
        return kept
    tokenizer = _read_tokenizer(path)
    if digest is not None:
        memo.put(digest, tokenizer)
    return tokenizer


def _read_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if is_gguf(path):
        return load_gguf_tokenizer(path)
    config = Path(path) / "tokenizer_config.json"
    name = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    loader: Any = PreTrainedTokenizerFast if name in _AS_SAVED else AutoTokenizer
    tokenizer = loader.from_pretrained(str(path))
    tokenizer.padding_side = "left"
    return tokenizer


#: the files of a checkpoint directory a tokenizer is read from (by name)
_TOKENIZER_FILE = re.compile(
    r"^(tokeniz|special_tokens|added_tokens|vocab|merges|chat_template|spiece|sentencepiece)|\.(jinja|model|py|tiktoken)$"
)


def tokenizer_digest(path: str | Path) -> str | None:
    """A digest of what the tokenizer at `path` is read from: the tokenizer's files
    (names and bytes) and the model type in ``config.json``; a GGUF file by its path,
    size and change time. Two checkpoints of one model (every version of a run) have
    the same. None for a hub id or a path that is not there."""
    p = Path(path).expanduser()
    h = hashlib.sha256()
    try:
        if p.is_file():
            st = p.stat()
            h.update(f"{p.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode())
            return h.hexdigest()
        if not p.is_dir():
            return None
        for f in sorted(p.iterdir()):
            if f.is_file() and _TOKENIZER_FILE.search(f.name):
                h.update(f.name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
        config = p / "config.json"
        if config.is_file():
            h.update(b"model_type\0" + str(json.loads(config.read_text()).get("model_type")).encode())
    except (OSError, ValueError):
        return None
    return h.hexdigest()


class _Tokenizers:
    """Tokenizers the run loaded, by `tokenizer_digest`, kept pickled: each load
    after the first unpickles its own copy (callers may set attributes on theirs),
    about a third of a load's cost for Qwen2.5's 152k-token vocabulary (2.0 CPU-s).
    At most `KEEP` are kept; the run's `Live` slot ``tokenizers`` (closing it forgets
    them)."""

    KEEP = 4

    def __init__(self) -> None:
        self.kept: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def get(self, digest: str) -> Any | None:
        with self.lock:
            kept = self.kept.get(digest)
        return None if kept is None else pickle.loads(kept)  # bytes this process pickled

    def put(self, digest: str, tokenizer: Any) -> None:
        kept = pickle.dumps(tokenizer)
        with self.lock:
            self.kept[digest] = kept
            while len(self.kept) > self.KEEP:
                self.kept.pop(next(iter(self.kept)))

    def close(self) -> None:
        with self.lock:
            self.kept.clear()


def load_policy(
    path: str | Path, device: str = "cpu", dtype: str | None = None, trust_remote_code: bool = False
) -> tuple[Any, Any]:
    """Model and tokenizer from a checkpoint directory, a GGUF file (or hub id)."""
    _quiet()
    if is_gguf(path):
        return _gguf(path, device, dtype)
    tokenizer = load_tokenizer(path)
    return load_model(path, device, dtype, trust_remote_code), tokenizer


def load_model(path: str | Path, device: str = "cpu", dtype: str | None = None, trust_remote_code: bool = False) -> Any:
    """The model alone (`load_policy` without the tokenizer, whose loading costs 0.5-2
    CPU-seconds for a real model's vocabulary: a reference model or a scorer has no use
    for it)."""
    import torch
    from transformers import AutoModelForCausalLM

    _quiet()
    if is_gguf(path):
        return _gguf(path, device, dtype)[0]
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=getattr(torch, dtype) if dtype else "auto", trust_remote_code=trust_remote_code
    )
    declared = declared_dtype(path)
    if dtype and declared and declared != dtype:  # trained in `dtype`, saved declaring the checkpoint's own
        model.compute_dtype = declared
    return model.to(device)


def declared_dtype(path: str | Path) -> str | None:
    """The dtype a checkpoint's config.json declares (what `dtype="auto"` loads it in):
    the spec's `model.dtype`, also for versions whose tensors were trained and stored in
    float32 (`save_policy`)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return None
    settings = json.loads(config.read_text())
    value = settings.get("dtype") or settings.get("torch_dtype")
    return str(value) if value else None


def engine_state(model: Any) -> dict[str, Any]:
    """A trained model's weights for the engines, on the CPU and in the dtype its
    checkpoint declares (`compute_dtype`): at bfloat16, half the bytes a float32 copy puts
    in the object store, and what the engine casts them to when it loads them anyway."""
    import torch

    dtype = getattr(torch, str(getattr(model, "compute_dtype", "") or "float32"))
    return {
        k: v.detach().to("cpu", dtype=dtype if v.is_floating_point() else v.dtype, copy=True)
        for k, v in model.state_dict().items()
    }


def training_device() -> str:
    """Where a stage that fine-tunes in the driver (warm start, pretraining) trains: the
    GPU where there is one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _gguf(path: str | Path, device: str, dtype: str | None) -> tuple[Any, Any]:
    model, tokenizer = load_gguf(path, dtype or "float32")
    return model.to(device), tokenizer


def save_policy(model: Any, tokenizer: Any, out: Path, version: int, **info: Any) -> None:
    """Write a policy artifact (see the module docstring)."""
    _quiet()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    compute = getattr(model, "compute_dtype", None)
    if compute:  # float32 tensors, declared in model.dtype: engines load them in it, trainers in float32
        settings = json.loads((out / "config.json").read_text())
        settings.update({k: compute for k in ("dtype", "torch_dtype") if k in settings} or {"dtype": compute})
        (out / "config.json").write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    config = out / "tokenizer_config.json"
    if config.is_file():
        settings = json.loads(config.read_text())
        if any(k in settings for k in _LOAD_ONLY):
            kept = {k: v for k, v in settings.items() if k not in _LOAD_ONLY}
            config.write_text(json.dumps(kept, indent=2, ensure_ascii=False) + "\n")
    (out / POLICY_FILE).write_text(json.dumps({"version": version, **info}, indent=1, sort_keys=True))


def policy_version(path: str | Path) -> int:
    """The version recorded in a policy artifact."""
    return int(json.loads((Path(path) / POLICY_FILE).read_text())["version"])
