"""A checkpoint's manifest: the size and SHA-256 of every file it holds, written last and
checked before anything is read, so a damaged file is an error naming it."""

from __future__ import annotations

import hashlib
import json
import os
import warnings

MANIFEST_FILE = "manifest.json"


def unreadable(path: str, name: str, error: Exception) -> ValueError:
    """The error for ``name`` in checkpoint ``path`` that ``error`` kept from being read."""
    return ValueError(
        f"checkpoint {path}: {name} cannot be read ({type(error).__name__}: {error}); the file is truncated, "
        "was changed, or was not written by comlrl"
    )


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def folder_files(folder: str) -> list[str]:
    """Every file under ``folder`` but the manifest, as sorted relative paths with ``/``."""
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            if relative != MANIFEST_FILE:
                found.append(relative)
    return sorted(found)


def write_manifest(folder: str) -> None:
    """``folder/manifest.json``: the size and SHA-256 of every other file in ``folder``."""
    files = {}
    for relative in folder_files(folder):
        path = os.path.join(folder, relative)
        files[relative] = {"size": os.path.getsize(path), "sha256": file_sha256(path)}
    with open(os.path.join(folder, MANIFEST_FILE), "w", encoding="utf-8") as f:
        json.dump({"files": files}, f, indent=1)


def verify_checkpoint(path: str) -> None:
    """Check every file of checkpoint ``path`` against its manifest; the error names the
    first file that is missing, has another size, or other bytes. A checkpoint written
    before manifests existed is read with a warning that it cannot be verified."""
    try:
        with open(os.path.join(path, MANIFEST_FILE), encoding="utf-8") as f:
            files = json.load(f)["files"]
        files = {str(relative): (int(entry["size"]), str(entry["sha256"])) for relative, entry in files.items()}
    except FileNotFoundError:
        warnings.warn(f"checkpoint {path} has no {MANIFEST_FILE}: its files cannot be verified", stacklevel=2)
        return
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise unreadable(path, MANIFEST_FILE, error) from error
    for relative, (expected_size, expected_sha256) in files.items():
        file = os.path.join(path, relative)
        if not os.path.isfile(file):
            raise ValueError(f"checkpoint {path} is damaged: {relative} is missing")
        size = os.path.getsize(file)
        if size != expected_size:
            raise ValueError(f"checkpoint {path} is damaged: {relative} has {size} bytes, {expected_size} were written")
        if file_sha256(file) != expected_sha256:
            raise ValueError(
                f"checkpoint {path} is damaged: {relative} differs from what was written (SHA-256 mismatch); "
                "resume from an earlier checkpoint"
            )
