"""A read-only view of a host's file system seen through a directory (the DaemonSet's /host mount).

Every read returns a `Read`: the value, or the reason it could not be had. Nothing here raises for
a missing, unreadable or garbled file, because a validator that crashes labels nothing; the checks
turn reasons into `unknown` verdicts instead.

Paths are host paths ("/etc/os-release"). Symlinks are followed as the host would follow them:
an absolute target ("/usr/lib/os-release") is resolved under the host root, never against the
validator's own file system.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Generic, TypeVar

T = TypeVar("T")

_MAX_SYMLINKS = 40  # as the kernel's limit on symlinks followed in one lookup
_MAX_READ = 4 * 1024 * 1024  # no host file we read is larger; a bigger one is not what we expect


@dataclass(frozen=True)
class Read(Generic[T]):
    """A value read from the host, or why there is none."""
    value: T | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None

    @staticmethod
    def missing(reason: str) -> "Read":
        return Read(None, reason)


class HostView:
    """The host file system under `root`; `root` is "/" when run directly on the host."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    def _resolve(self, host_path: str) -> Read[Path]:
        """Map a host path to a local path, following symlinks inside the host root."""
        parts = list(PurePosixPath(host_path).parts[1:]) if host_path.startswith("/") else None
        if parts is None:
            return Read.missing(f"{host_path}: not an absolute host path")
        resolved: list[str] = []
        followed = 0
        while parts:
            part = parts.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            local = self.root.joinpath(*resolved, part)
            if local.is_symlink():
                followed += 1
                if followed > _MAX_SYMLINKS:
                    return Read.missing(f"{host_path}: too many levels of symbolic links")
                try:
                    target = os.readlink(local)
                except OSError as exc:
                    return Read.missing(f"{host_path}: {exc.strerror or exc}")
                target_parts = list(PurePosixPath(target).parts)
                if target.startswith("/"):
                    resolved = []
                    target_parts = target_parts[1:]
                parts = target_parts + parts
                continue
            resolved.append(part)
        return Read(self.root.joinpath(*resolved))

    def local_path(self, host_path: str) -> Path | None:
        resolved = self._resolve(host_path)
        return resolved.value if resolved.ok else None

    def exists(self, host_path: str) -> bool:
        path = self.local_path(host_path)
        return path is not None and path.exists()

    def is_dir(self, host_path: str) -> bool:
        path = self.local_path(host_path)
        return path is not None and path.is_dir()

    def read_bytes(self, host_path: str) -> Read[bytes]:
        resolved = self._resolve(host_path)
        if not resolved.ok:
            return resolved  # type: ignore[return-value]
        path = resolved.value
        try:
            with open(path, "rb") as handle:
                data = handle.read(_MAX_READ + 1)
        except FileNotFoundError:
            return Read.missing(f"{host_path}: not found")
        except IsADirectoryError:
            return Read.missing(f"{host_path}: is a directory, expected a file")
        except PermissionError:
            return Read.missing(f"{host_path}: permission denied")
        except OSError as exc:
            return Read.missing(f"{host_path}: {exc.strerror or exc}")
        if len(data) > _MAX_READ:
            return Read.missing(f"{host_path}: larger than {_MAX_READ} bytes, not the expected file")
        return Read(data)

    def read_text(self, host_path: str, *, allow_empty: bool = False) -> Read[str]:
        raw = self.read_bytes(host_path)
        if not raw.ok:
            return raw  # type: ignore[return-value]
        try:
            text = raw.value.decode("utf-8")
        except UnicodeDecodeError:
            return Read.missing(f"{host_path}: not UTF-8 text (garbled?)")
        if not allow_empty and not text.strip():
            return Read.missing(f"{host_path}: empty")
        return Read(text)

    def list_dir(self, host_path: str) -> Read[list[str]]:
        """Sorted entry names of a directory."""
        resolved = self._resolve(host_path)
        if not resolved.ok:
            return resolved  # type: ignore[return-value]
        try:
            return Read(sorted(os.listdir(resolved.value)))
        except FileNotFoundError:
            return Read.missing(f"{host_path}: not found")
        except NotADirectoryError:
            return Read.missing(f"{host_path}: is a file, expected a directory")
        except PermissionError:
            return Read.missing(f"{host_path}: permission denied")
        except OSError as exc:
            return Read.missing(f"{host_path}: {exc.strerror or exc}")

    def glob(self, host_dir: str, pattern: str) -> list[str]:
        """Host paths of the entries of `host_dir` whose names match `pattern`; [] if unreadable."""
        listing = self.list_dir(host_dir)
        if not listing.ok:
            return []
        base = host_dir.rstrip("/")
        return [f"{base}/{name}" for name in listing.value if fnmatch.fnmatchcase(name, pattern)]

    def link_target(self, host_path: str) -> Read[str]:
        """The target a symlink names (not resolved)."""
        parent = self.local_path(str(PurePosixPath(host_path).parent))
        if parent is None:
            return Read.missing(f"{host_path}: parent not readable")
        local = parent / PurePosixPath(host_path).name
        try:
            return Read(os.readlink(local))
        except FileNotFoundError:
            return Read.missing(f"{host_path}: not found")
        except OSError as exc:
            return Read.missing(f"{host_path}: not a symlink ({exc.strerror or exc})")
