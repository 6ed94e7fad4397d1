"""The audit chain's anchors: its head (last id, hash, event count) written outside the
metadata database, so that a log emptied or cut short there still shows.

The sink is an append-only file of JSON lines (AUDIT_ANCHOR_PATH; `var/` by default,
another host's volume or an `chattr +a` file in a deployment) and, line for line, the
`backfill_portal.audit.anchor` logger for a central log store. Each line carries an
HMAC under the audit key, so nobody without the key can write a believable one.
"""
from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import os
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from django.conf import settings

logger = logging.getLogger("backfill_portal.audit.anchor")


class AnchorFileError(Exception):
    """The anchor file cannot be read or a line in it does not verify."""


@dataclass(frozen=True)
class Anchor:
    first_id: int | None
    last_id: int | None
    hash: str
    count: int
    at: str
    key_id: str

    @property
    def when(self) -> str:
        return datetime.fromisoformat(self.at).strftime("%Y-%m-%d %H:%M:%S")


def signing_key(key_id: str) -> bytes | None:
    """The configured audit key with this id (AUDIT_KEY or AUDIT_OLD_KEYS), or None."""
    secret = settings.AUDIT_KEYS.get(key_id)
    return secret.encode() if secret is not None else None


def _mac(anchor: Anchor, key: bytes) -> str:
    body = json.dumps(asdict(anchor), sort_keys=True, separators=(",", ":"))
    return hmac.new(key, b"anchor|" + body.encode(), hashlib.sha256).hexdigest()


def anchor_append(anchor: Anchor, *, actor_name: str = "system", path: Path | None = None) -> str:
    """Append one signed line (locked against a concurrent writer, fsynced) and copy it
    to the anchor logger. Returns the line."""
    path = Path(path or settings.AUDIT_ANCHOR_PATH)
    line = json.dumps({**asdict(anchor), "mac": _mac(anchor, signing_key(anchor.key_id))}, sort_keys=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    logger.info("audit anchor by %s: %s", actor_name, line)
    return line


def anchors_read(*, path: Path | None = None) -> list[Anchor]:
    """Every anchor in the file, oldest first ([] when there is no file yet). Raises
    AnchorFileError naming the first line that is not a signed anchor."""
    path = Path(path or settings.AUDIT_ANCHOR_PATH)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise AnchorFileError(f"cannot read the anchor file {path}: {exc.strerror}") from None
    anchors = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            fields = json.loads(line)
            mac = fields.pop("mac")
            anchor = Anchor(**fields)
        except (ValueError, TypeError, KeyError, AttributeError):
            raise AnchorFileError(f"{path} line {number} is not an anchor") from None
        key = signing_key(anchor.key_id)
        if key is None:
            raise AnchorFileError(f"{path} line {number} is signed with audit key {anchor.key_id!r}, "
                                  "which is not configured (AUDIT_KEY / AUDIT_OLD_KEYS)")
        if not hmac.compare_digest(str(mac), _mac(anchor, key)):
            raise AnchorFileError(f"{path} line {number} does not verify with audit key {anchor.key_id!r}: "
                                  "the anchor was edited")
        anchors.append(anchor)
    return anchors
