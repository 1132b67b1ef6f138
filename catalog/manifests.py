"""What a manifest may contain, checked on every read.

A manifest is data written by a run, but a catalog is also a folder anyone with
access can edit (a shared disk, a bucket). Everything read from one is therefore
checked before it is used: names that become SQL identifiers or paths are names
(`NAME`, `IDENTIFIER`), file paths stay inside their result folder, numbers are
numbers, and the whole manifest still has the digest written into it when it was
committed (`DIGEST`: a flipped digit in a metric, or a ``files`` key made unreadable,
is found on every read, not only by `pipeline verify`). A manifest that fails is
*damaged*: readers skip it and say so, a run moves it aside and computes the result
again, `pipeline verify` names it.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from pathlib import Path
from typing import Any

from common.errors import CatalogError

#: a name that becomes a path: run, sweep, trial, result key, node, output. Letters and
#: digits of any script (``expérience``, ``実験``), in Unicode's composed form (NFC: one
#: name, one spelling), '_', '.' and '-'; never starting with '.' or '-'
NAME = re.compile(r"^\w[\w.-]{0,127}\Z")
#: a name that becomes a SQL identifier (a table output's view)
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
_FILE_PART = re.compile(r"^[A-Za-z0-9_.=-]{1,255}\Z")
_SHA256 = re.compile(r"^[0-9a-f]{64}\Z")
_ADDRESS = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}/[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}(\[\d{1,6}/\d{1,6}\])?\Z")


#: the manifest's own field holding the SHA-256 of the rest of it (`digest`)
DIGEST = "digest"
#: when manifests began to hold their digest (``committed_at``, seconds since the epoch):
#: one committed since without it is damaged
DIGEST_SINCE = 1_795_800_000


def digest(manifest: dict[str, Any]) -> str:
    """The SHA-256 of `manifest` without its `DIGEST` field, as canonical JSON."""
    rest = {k: v for k, v in manifest.items() if k != DIGEST}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB blocks."""
    hashed = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            hashed.update(chunk)
    return hashed.hexdigest()


class ManifestError(CatalogError):
    """A manifest that cannot be read or does not have the form `check` requires."""


def is_name(text: object) -> bool:
    """Whether `text` is safe as one path component (`NAME`, and never ``.``/``..``)."""
    return (
        isinstance(text, str)
        and bool(NAME.match(text))
        and text.strip(".") != ""
        and unicodedata.is_normalized("NFC", text)
    )


def is_relative_file(text: object) -> bool:
    """A file path inside a result folder: '/'-separated safe parts, no '..'."""
    if not isinstance(text, str) or not text:
        return False
    parts = text.split("/")
    return all(_FILE_PART.match(p) and p.strip(".") != "" for p in parts)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fail(key: str, what: str) -> ManifestError:
    return ManifestError(f"result {key}: manifest.json {what}")


def parse(data: bytes, key: str) -> dict[str, Any]:
    """The manifest of result `key` from its bytes; `ManifestError` if it is not
    readable JSON of the form the catalog writes."""
    try:
        manifest = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _fail(key, f"is not readable JSON ({str(exc).split(':')[0]})") from None
    if not isinstance(manifest, dict):
        raise _fail(key, "is not a JSON object")
    check(manifest, key)
    return manifest


def check(m: dict[str, Any], key: str) -> None:
    """Raise `ManifestError` naming the first field of `m` that is not as written."""
    if m.get("key") != key:
        raise _fail(key, "names another key")
    if m.get("version") is not None and (not isinstance(m["version"], int) or isinstance(m["version"], bool)):
        raise _fail(key, "has an invalid version")
    for field in ("stage", "node", "run"):
        if m.get(field) is not None and not is_name(m[field]):
            raise _fail(key, f"has an invalid {field}")
    if m.get("iteration") is not None and not (
        isinstance(m["iteration"], int) and not isinstance(m["iteration"], bool)
    ):
        raise _fail(key, "has an invalid iteration")
    if m.get("seconds") is not None and not _number(m["seconds"]):
        raise _fail(key, "has an invalid seconds")
    inputs = m.get("inputs", {})
    if not isinstance(inputs, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and _ADDRESS.match(v) for k, v in inputs.items()
    ):
        raise _fail(key, "has invalid inputs")
    metrics = m.get("metrics", {})
    if not isinstance(metrics, dict) or not all(isinstance(k, str) and _number(v) for k, v in metrics.items()):
        raise _fail(key, "has invalid metrics (names and numbers expected)")
    outputs = m.get("outputs")
    if not isinstance(outputs, dict):
        raise _fail(key, "has no outputs")
    for name, out in outputs.items():
        if not is_name(name) or not isinstance(out, dict) or out.get("kind") not in ("table", "artifact"):
            raise _fail(key, f"has an invalid output {json.dumps(name)[:40]}")
        files = out.get("files")
        if not isinstance(files, list) or not all(is_relative_file(f) for f in files):
            raise _fail(key, f"output '{name}' has invalid files")
        view = out.get("view")
        if view is not None and not (isinstance(view, str) and IDENTIFIER.match(view)):
            raise _fail(key, f"output '{name}' has an invalid view name")
        selects = out.get("selects")
        if selects is not None and not (isinstance(selects, str) and _ADDRESS.match(selects)):
            raise _fail(key, f"output '{name}' has an invalid selection")
        if "rows" in out and not (isinstance(out["rows"], int) and out["rows"] >= 0):
            raise _fail(key, f"output '{name}' has an invalid row count")
    files = m.get("files", {})
    if not isinstance(files, dict):
        raise _fail(key, "has an invalid file list")
    for rel, want in files.items():
        if (
            not is_relative_file(rel)
            or not isinstance(want, dict)
            or not isinstance(want.get("bytes"), int)
            or not (isinstance(want.get("sha256"), str) and _SHA256.match(want["sha256"]))
        ):
            raise _fail(key, f"has an invalid entry for file {json.dumps(rel)[:60]}")
    if DIGEST not in m:
        committed = m.get("committed_at")
        if isinstance(committed, (int, float)) and committed >= DIGEST_SINCE:  # its digest's key damaged, or removed
            raise _fail(key, "has no digest, which every manifest committed since 2026-11-27 holds")
        return  # committed before manifests held their digest: as read
    if m[DIGEST] != digest(m):
        raise _fail(key, "differs from what was committed (its digest does not match: edited or damaged)")
    unlisted = [f"{name}/{f}" for name, out in outputs.items() for f in out["files"] if f"{name}/{f}" not in files]
    if unlisted:
        raise _fail(key, f"lists no size and SHA-256 for {unlisted[0]}")
