"""The embedded broker of the zero-setup demo: kombu's filesystem transport, made safe across processes.

kombu's own transport (kombu/transport/filesystem.py) writes a message straight under its final name,
so a reader that lists the folder while the writer is still writing reads a half-written (often empty)
file, and the worker dies with ``Unrecoverable error: JSONDecodeError('Expecting value: line 1 column 1')``
(seen about two minutes into `make run`). It also claims a message by moving it to the system temp
folder, which ``shutil.move`` turns into copy-then-delete when that is another file system, so two
readers can both take one message; and it rewrites an exchange's binding table in place, so a reader
can find it empty.

This transport keeps kombu's folder layout and file names and changes only how files change hands:

* a message is written under a temporary name in ``<data_folder_out>/.tmp`` and renamed into place, so
  a ``*.msg`` file is always whole (rename is atomic within one file system);
* a reader claims a message by renaming it into ``<data_folder_in>/.claimed``: exactly one rename of
  a name succeeds, so each message goes to exactly one reader;
* a binding table is replaced by rename too, its read-modify-write serialised by a lock file;
* a file that still does not decode (one a pre-fix writer left half-written before a crash) is moved
  to ``<data_folder_in>/.bad`` with a log line, never raised into the worker's consumer loop.

Selected with Celery's ``broker_transport = "portal.broker:Transport"`` (portal/settings.py).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils import json as kombu_json

# kombu's JSON (it encodes datetimes, UUIDs and decimals as kombu's own transport does), typed here.
dumps: Callable[[Any], str] = kombu_json.dumps
loads: Callable[[str], Any] = kombu_json.loads

log = logging.getLogger(__name__)

TMP_DIR = ".tmp"
CLAIMED_DIR = ".claimed"
BAD_DIR = ".bad"


def atomic_write(folder: str | os.PathLike[str], name: str, data: bytes) -> Path:
    """Write ``data`` to ``folder/name`` so that no reader ever sees part of it."""
    tmp_dir = Path(folder) / TMP_DIR
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f"{uuid.uuid4().hex}.part"
    with open(tmp, "wb") as handle:
        handle.write(data)
    target = Path(folder) / name
    os.replace(tmp, target)
    return target


def _sent_order(filename: str) -> tuple[int, str]:
    """Oldest first, by the millisecond prefix as a number: as text, "1_..." would sort after "12_..."."""
    prefix = filename.partition("_")[0]
    return (int(prefix) if prefix.isdigit() else 0, filename)


class Channel(filesystem.Channel):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        # kombu's transport wants its folders made beforehand; a fresh var/ should just work.
        for folder in (self.data_folder_in, self.data_folder_out, self.control_folder):
            Path(folder).mkdir(parents=True, exist_ok=True)

    def _put(self, queue: Any, message: Any, **kwargs: Any) -> None:  # type: ignore[override]  # fanout passes kwargs
        # kombu's name, so that ordering (by the millisecond prefix) and queue matching stay as they were.
        filename = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        try:
            atomic_write(self.data_folder_out, filename, dumps(message).encode())
        except OSError as exc:
            raise ChannelError(f"Cannot add file {filename!r} to {self.data_folder_out}") from exc

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        queue_find = f"{queue}.msg"
        claimed = Path(self.data_folder_in) / CLAIMED_DIR
        claimed.mkdir(exist_ok=True)
        for filename in sorted(os.listdir(self.data_folder_in), key=_sent_order):
            if filename.partition(".")[2] != queue_find:
                continue
            mine = claimed / f"{os.getpid()}-{filename}"
            try:
                os.rename(os.path.join(self.data_folder_in, filename), mine)
            except FileNotFoundError:
                continue  # another reader claimed it first
            except OSError as exc:
                raise ChannelError(f"Cannot claim {filename!r} from {self.data_folder_in}") from exc
            try:
                raw = mine.read_bytes()
                payload = loads(raw.decode())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                self._set_aside(mine, filename, exc)
                continue
            self._dispose(mine, filename)
            return payload
        raise Empty()

    def _set_aside(self, path: Path, filename: str, exc: Exception) -> None:
        bad = Path(self.data_folder_in) / BAD_DIR
        bad.mkdir(exist_ok=True)
        log.error("broker: message %s is unreadable (%r); moved to %s", filename, exc, bad)
        try:
            os.replace(path, bad / filename)
        except OSError:
            log.exception("broker: cannot move %s aside", path)

    def _dispose(self, path: Path, filename: str) -> None:
        try:
            if self.store_processed:
                Path(self.processed_folder).mkdir(parents=True, exist_ok=True)
                os.replace(path, Path(self.processed_folder) / filename)
            else:
                path.unlink()
        except OSError:
            log.warning("broker: cannot remove the delivered message %s", path, exc_info=True)

    # -- exchange binding tables (fanout) -----------------------------------------------------------
    def get_table(self, exchange: str) -> list[filesystem.exchange_queue_t]:
        file: Path = self._exchange_file(exchange)  # type: ignore[no-untyped-call]
        try:
            raw = file.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc
        return [filesystem.exchange_queue_t(*q) for q in loads(raw.decode())]

    def _update_table(self, exchange: str, change: Any) -> None:
        """Read, change and atomically replace one exchange's table, under its lock file."""
        file: Path = self._exchange_file(exchange)  # type: ignore[no-untyped-call]
        self.control_folder.mkdir(parents=True, exist_ok=True)
        try:
            with open(f"{file}.lock", "ab") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                before = self.get_table(exchange)
                after = change(list(before))
                if after != before:
                    atomic_write(self.control_folder, file.name, dumps(after).encode())
        except OSError as exc:
            raise ChannelError(f"Cannot update {file}") from exc

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self._update_table(exchange, lambda queues: queues if entry in queues else [entry, *queues])

    def _delete(self, queue: str, exchange: str, routing_key: str, pattern: str, *args: Any, **kwargs: Any) -> None:
        # The virtual channel's bookkeeping, then our table (kombu's own _delete rewrites it in place).
        super(filesystem.Channel, self)._delete(queue, exchange, routing_key, pattern, *args, **kwargs)  # type: ignore[no-untyped-call]
        entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self._update_table(exchange, lambda queues: [q for q in queues if q != entry])


class Transport(filesystem.Transport):
    Channel = Channel
