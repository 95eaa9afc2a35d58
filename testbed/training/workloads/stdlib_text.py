"""Real text that exists on every machine: the Python standard library's own sources.

Why: the language-model workload must need no download and must read the
same bytes on every host of a run.  The stdlib directory comes from
``sysconfig.get_paths()["stdlib"]`` of the interpreter running the worker;
all hosts of one run share that interpreter (one machine) or should run the
same Python version (several machines: the corpus ``fingerprint`` tells if
they did not).

File selection is deterministic and independent of the file system's
listing order: candidate files are sorted by the SHA-1 of their path
relative to the stdlib root; held-out files are taken first from that order
until ``eval_chars`` is reached, training files from the rest until
``train_chars``.  Held-out text therefore comes from files never trained on.

A *domain* is a named set of stdlib packages/modules (``DOMAINS``), so a
multi-expert model can give each expert different text (PGCS builds on
this); ``None`` means the whole library minus tests and bundled packages.

Characters map onto a fixed 98-symbol vocabulary (tab, newline, printable
ASCII, and 0 for anything else), so every domain and every Python version
share one vocabulary and models are interchangeable.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = ["DOMAINS", "VOCAB", "VOCAB_SIZE", "Corpus", "stdlib_files", "stdlib_corpus", "encode", "decode"]

# Domains are chosen from modules present in Python 3.10 to 3.13.
DOMAINS: dict[str, tuple[str, ...]] = {
    "asyncio": ("asyncio",),
    "email": ("email",),
    "web": ("http", "urllib", "wsgiref", "html", "xmlrpc"),
    "xml": ("xml",),
    "concurrency": ("concurrent", "multiprocessing", "threading.py", "queue.py", "sched.py", "selectors.py"),
    "testing": ("unittest", "doctest.py", "pdb.py", "bdb.py", "trace.py"),
    "imports": ("importlib", "pkgutil.py", "zipimport.py", "runpy.py", "modulefinder.py"),
    "text": ("json", "re", "tomllib", "csv.py", "string.py", "textwrap.py", "difflib.py", "configparser.py"),
    "core": ("*.py",),  # top-level modules only
}

_EXCLUDE_DIRS = {"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages", "idlelib",
                 "lib2to3", "ensurepip", "turtledemo"}

VOCAB: str = "\t\n" + "".join(chr(c) for c in range(32, 127))  # index + 1 = token id; 0 = unknown
VOCAB_SIZE: int = len(VOCAB) + 1
_LUT = np.zeros(128, dtype=np.int64)  # ASCII lookup; non-ASCII -> 0
for _i, _ch in enumerate(VOCAB):
    _LUT[ord(_ch)] = _i + 1


def encode(text: str) -> np.ndarray:
    """Characters -> int64 token ids (unknown and non-ASCII characters -> 0)."""
    raw = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    out = np.zeros_like(raw)
    ascii_mask = raw < 128
    out[ascii_mask] = _LUT[raw[ascii_mask]]
    return out


def decode(ids: np.ndarray | list[int]) -> str:
    return "".join(VOCAB[i - 1] if 0 < i <= len(VOCAB) else "\ufffd" for i in np.asarray(ids).tolist())


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _excluded(rel: Path) -> bool:
    return any(part in _EXCLUDE_DIRS for part in rel.parts[:-1])


@lru_cache(maxsize=32)
def stdlib_files(domain: str | None = None) -> tuple[str, ...]:
    """Relative paths of the domain's ``.py`` files, sorted by SHA-1 of the path (deterministic)."""
    root = stdlib_root()
    if domain is None:
        found = [p.relative_to(root) for p in root.rglob("*.py")]
    else:
        if domain not in DOMAINS:
            raise KeyError(f"unknown stdlib domain {domain!r}; known: {sorted(DOMAINS)}")
        found = []
        for item in DOMAINS[domain]:
            if item == "*.py":
                found += [p.relative_to(root) for p in root.glob("*.py")]
            elif item.endswith(".py"):
                if (root / item).is_file():
                    found.append(Path(item))
            elif (root / item).is_dir():
                found += [p.relative_to(root) for p in (root / item).rglob("*.py")]
    rels = sorted({str(r) for r in found if not _excluded(r)})
    return tuple(sorted(rels, key=lambda r: hashlib.sha1(r.encode()).hexdigest()))


@dataclass(frozen=True)
class Corpus:
    """Training and held-out token ids plus what they were read from."""

    domain: str | None
    train: np.ndarray  # int64 token ids
    held_out: np.ndarray
    train_files: tuple[str, ...]
    held_out_files: tuple[str, ...]
    fingerprint: str  # sha256 over the paths and text used


@lru_cache(maxsize=16)
def stdlib_corpus(domain: str | None = None, train_chars: int = 300_000, eval_chars: int = 16_384) -> Corpus:
    """Deterministic train/held-out split of the stdlib sources of ``domain`` (see module doc)."""
    root = stdlib_root()
    files = stdlib_files(domain)
    if len(files) < 2:
        raise ValueError(f"stdlib domain {domain!r} has {len(files)} files under {root}; need 2 or more")
    digest = hashlib.sha256()
    parts: dict[str, list[str]] = {"held": [], "train": []}
    used: dict[str, list[str]] = {"held": [], "train": []}
    budget = {"held": eval_chars, "train": train_chars}
    which = "held"
    for rel in files:
        if which == "held" and budget["held"] <= 0:
            which = "train"
        if which == "train" and budget["train"] <= 0:
            break
        text = (root / rel).read_text(encoding="utf-8", errors="replace")[: budget[which]]
        if not text:
            continue
        digest.update(rel.encode() + b"\0" + text.encode("utf-8", errors="replace") + b"\0")
        parts[which].append(text)
        used[which].append(rel)
        budget[which] -= len(text)
        if which == "held" and budget["held"] <= 0:
            which = "train"
    if not used["train"]:
        raise ValueError(f"stdlib domain {domain!r}: no text left for training after the held-out split")
    return Corpus(
        domain=domain,
        train=encode("\n".join(parts["train"])),
        held_out=encode("\n".join(parts["held"])),
        train_files=tuple(used["train"]),
        held_out_files=tuple(used["held"]),
        fingerprint=digest.hexdigest(),
    )
