"""Files that readers can trust: a file is either its old content or its new one, never half of it.

Records (manifests, sweep points, the running network's state, daemon health)
are read by other processes while they are written, and a full or failing
disk must not leave a truncated JSON behind that a later ``report`` or a
resumed sweep would trip on.  So every such file is written aside, flushed
to disk, then renamed over the old one; if the write fails (``ENOSPC``,
``EROFS``) the partial copy is removed and the old file is left as it was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_atomic(path: str | os.PathLike[str], text: str, *, durable: bool = True) -> None:
    """Replace ``path`` with ``text`` in one step (``durable``: fsync before the rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, durable: bool = True, **dumps: Any) -> None:
    """``write_atomic`` of ``json.dumps(data, **dumps)`` (``default=str`` unless given)."""
    dumps.setdefault("default", str)
    write_atomic(path, json.dumps(data, **dumps), durable=durable)
