"""The output folder and the manifests on disk: reading, and writing atomically.

Layer: I/O. Every write goes to a temporary file in the same folder, is fsynced and then
renamed over the target, so a reader (a server reloading its certificate, ``kubectl``)
sees the old file or the new one, never half of one. A file whose bytes would not change
is not written at all, so its mtime stays put. Must make no decisions about certificates:
``certs.renew`` does that.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from certs.manifests import ManifestError, set_ca_bundle
from certs.renew import OutFile

SECRET_MODE = 0o600
PUBLIC_MODE = 0o644
MANIFEST_SUFFIXES = (".yaml", ".yml")


class StoreError(Exception):
    """A file that cannot be read or written; the message names it."""


@dataclass(frozen=True, slots=True)
class Written:
    written: tuple[str, ...]
    """Files whose contents changed."""
    tightened: tuple[str, ...]
    """Private keys that were readable by others and are now 0600."""


@dataclass(frozen=True, slots=True)
class ManifestsPatched:
    changed: tuple[Path, ...]
    webhooks: int
    notes: tuple[str, ...]


def read_files(folder: Path, names: Iterable[str]) -> dict[str, bytes]:
    """The contents of those of ``names`` that exist in ``folder``."""
    found: dict[str, bytes] = {}
    for name in names:
        path = folder / name
        try:
            found[name] = path.read_bytes()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None
    return found


def write_files(folder: Path, files: Iterable[OutFile], existing: dict[str, bytes]) -> Written:
    """Write what changed; make sure every private key on disk is 0600."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create {folder}: {exc.strerror or exc}") from None
    written: list[str] = []
    tightened: list[str] = []
    for file in files:
        path = folder / file.name
        mode = SECRET_MODE if file.secret else PUBLIC_MODE
        if existing.get(file.name) != file.data:
            write_atomic(path, file.data, mode)
            written.append(file.name)
        elif file.secret and _tighten(path):
            tightened.append(file.name)
    return Written(written=tuple(written), tightened=tuple(tightened))


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data`` in one rename; the file has ``mode`` from its birth."""
    folder = path.parent
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise StoreError(f"cannot write in {folder}: {exc.strerror or exc}") from None
    try:
        try:
            # mkstemp makes the file 0600 already; fchmod widens certificates to 0644
            # before a byte is written, and never widens a key.
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None
    _fsync_dir(folder)


def patch_manifests(folder: Path, ca_bundle: str) -> ManifestsPatched:
    """Set the caBundle in every YAML file under ``folder`` that holds a webhook configuration."""
    if not folder.is_dir():
        raise StoreError(f"{folder} is not a folder")
    changed: list[Path] = []
    notes: list[str] = []
    webhooks = 0
    for path in sorted(p for p in folder.rglob("*") if p.suffix in MANIFEST_SUFFIXES):
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise StoreError(f"cannot read {path}: {exc}") from None
        try:
            patch = set_ca_bundle(text, ca_bundle)
        except ManifestError as exc:
            raise StoreError(f"{path}: {exc}") from None
        webhooks += patch.webhooks
        notes += [f"{path}: {note}" for note in patch.notes]
        if patch.text != text:
            write_atomic(path, patch.text.encode("utf-8"), stat.S_IMODE(path.stat().st_mode))
            changed.append(path)
    return ManifestsPatched(changed=tuple(changed), webhooks=webhooks, notes=tuple(notes))


def _tighten(path: Path) -> bool:
    current = stat.S_IMODE(path.stat().st_mode)
    if current & 0o077 == 0:
        return False
    os.chmod(path, current & 0o700)
    return True


def _fsync_dir(folder: Path) -> None:
    # The rename is durable only once the directory entry is on disk too.
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
