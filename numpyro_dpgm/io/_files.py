"""The file layer of :mod:`numpyro_dpgm.io`: header and version, checksum, layout, atomic
writes, and reads that check all of them."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._version import __version__

#: The version this library writes, and the newest it reads.
FORMAT_VERSION = 1
MEASUREMENTS_FORMAT = "numpyro_dpgm.measurements"
MODEL_FORMAT = "numpyro_dpgm.model"
LEDGER_FORMAT = "numpyro_dpgm.ledger"


class FileFormatError(ValueError):
    """A file is not a readable measurements / model file (wrong kind, newer version, corrupt)."""


def expect_format(condition: bool, message: str) -> None:
    if not condition:
        raise FileFormatError(message)


def _library_version() -> str:
    return __version__


def _canonical(body: Mapping[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _layout(doc: Mapping[str, Any]) -> str:
    """JSON text with one top-level key per line and one list item (a measurement, a clique,
    a ledger entry) per line; arrays stay on their item's line."""

    def dumps(v: Any) -> str:
        return json.dumps(v, ensure_ascii=False, allow_nan=False)

    lines = []
    for k, v in doc.items():
        if isinstance(v, list) and v:
            inner = ",\n".join(f"  {dumps(item)}" for item in v)
            lines.append(f" {dumps(k)}: [\n{inner}\n ]")
        else:
            lines.append(f" {dumps(k)}: {dumps(v)}")
    return "{\n" + ",\n".join(lines) + "\n}"


def write_document(path: str | Path, kind: str, body: dict[str, Any]) -> Path:
    """Serialise fully, then write atomically: nothing is left behind on failure."""
    path = Path(path)
    doc = {"format": kind, "version": FORMAT_VERSION, "library_version": _library_version()}
    doc.update(body)
    checksum = "sha256:" + hashlib.sha256(_canonical(doc).encode()).hexdigest()
    text = _layout({**doc, "checksum": checksum})
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise FileNotFoundError(f"cannot write {path}: folder {parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _read(path: str | Path, kind: str) -> dict[str, Any]:
    path = Path(path)
    what = {MEASUREMENTS_FORMAT: "measurements", MODEL_FORMAT: "model"}.get(kind, "ledger")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} file {path} does not exist") from None
    except UnicodeDecodeError:
        raise FileFormatError(f"{path} is not a {what} file (not UTF-8 text)") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise FileFormatError(f"{path} is corrupt or not a {what} file (invalid JSON at line "
                              f"{err.lineno}: {err.msg})") from None
    if not isinstance(doc, dict) or "format" not in doc:
        raise FileFormatError(f"{path} is not a {what} file (no 'format' header)")
    if doc["format"] != kind:
        raise FileFormatError(f"{path} is a {doc['format']!r} file, not a {what} file ({kind!r})")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FileFormatError(f"{path} has an invalid format version {version!r}")
    if version > FORMAT_VERSION:
        raise FileFormatError(
            f"{path} has format version {version}, newer than this numpyro_dpgm "
            f"({_library_version()}) reads (up to {FORMAT_VERSION}); upgrade numpyro_dpgm"
        )
    checksum = doc.pop("checksum", None)
    actual = "sha256:" + hashlib.sha256(_canonical(doc).encode()).hexdigest()
    if checksum != actual:
        raise FileFormatError(f"{path} is corrupt: its checksum does not match its content")
    return doc


def _body(path: Path, doc: dict[str, Any], keys: set[str]) -> None:
    header = {"format", "version", "library_version"}
    missing = sorted(keys - set(doc))
    extra = sorted(set(doc) - keys - header)
    if missing or extra:
        raise FileFormatError(f"{path} is corrupt: missing {missing}, unexpected {extra}")


def load_document(path: str | Path, kind: str, keys: set[str], parse: Any) -> Any:
    doc = _read(path, kind)
    _body(Path(path), doc, keys)
    try:
        return parse(doc)
    except FileFormatError as err:
        raise FileFormatError(f"{path} is corrupt: {err}") from None
    except (TypeError, ValueError, KeyError) as err:
        raise FileFormatError(f"{path} is corrupt: {err}") from None
