"""Log shipping and exit reports: what leaves the node about each task besides the heartbeat.

A task's combined output goes to the portal in chunks (at most LOG_CHUNKS_PER_ROUND per task and
turn, so a chatty workload cannot stall the loop). Its start is recorded by the next heartbeat; its end
is reported once its log is all shipped, with the newest checkpoint read after the process exited (a
checkpoint written during the grace period counts), and retried until the portal answers.
"""

from __future__ import annotations

import os
from pathlib import Path

from nodeagent.client import PortalError
from nodeagent.config import LOG_CHUNK_BYTES, LOG_CHUNKS_PER_ROUND, LOG_SHIP_INTERVAL_S
from nodeagent.context import Node
from nodeagent.heartbeat import newest_mtime
from nodeagent.journal import TaskRecord


def utf8_cut(raw: bytes) -> int:
    """Length of the longest prefix of `raw` that does not end inside a UTF-8 character."""
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte & 0xC0 != 0x80:  # the lead byte of the last character
            needed = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return len(raw) if needed <= back else len(raw) - back
    return len(raw)


class Shipping:
    """Ships each task's log and reports its end; it needs nothing of the other parts."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.next_log_ship = 0.0

    def ship_logs_if_due(self) -> None:
        if self.node.clock() < self.next_log_ship:
            return
        self.next_log_ship = self.node.clock() + LOG_SHIP_INTERVAL_S
        for record in list(self.node.records.values()):
            if record.state != "launching" and not record.log_closed:
                self.ship_log_round(record)

    def ship_log_round(self, record: TaskRecord) -> None:
        for _ in range(LOG_CHUNKS_PER_ROUND):
            if not self._ship_log_chunk(record):
                return

    def _ship_log_chunk(self, record: TaskRecord) -> bool:
        """Send the next chunk of the task's log; True if there may be more to send right now."""
        node = self.node
        if not node.link.ok(node.clock()):
            return False
        if record.state != "exited":
            # Most logs are quiet most of the time: a stat says so without opening the file.
            try:
                if os.stat(record.log_path).st_size <= record.log_file_pos:
                    return False
            except OSError:
                return False
        try:
            with open(record.log_path, "rb") as handle:
                handle.seek(record.log_file_pos)
                raw = handle.read(LOG_CHUNK_BYTES)
        except OSError:
            raw = b""
        at_final_end = record.state == "exited" and len(raw) < LOG_CHUNK_BYTES
        if not at_final_end:
            raw = raw[: utf8_cut(raw)]  # the rest of a split character comes with the next chunk
        if not raw:
            if record.state == "exited":
                record.log_closed = True
            return False
        data = raw.decode("utf-8", errors="replace")
        try:
            answer = node.link.call(
                f"tasks/{record.task_id}/logs", {"attempt": record.attempt, "offset": record.log_offset, "data": data}
            )
        except PortalError as exc:
            node.log.warning("portal refused the log of task %s attempt %s: %s", record.task_id, record.attempt, exc)
            record.log_closed = True
            return False
        if answer is None:
            return False
        record.log_file_pos += len(raw)
        record.log_offset += len(data.encode("utf-8"))
        return True

    def flush_reports(self) -> None:
        """Each ended task's end, once the portal has its start (from a heartbeat) and its whole log."""
        node = self.node
        for record in list(node.records.values()):
            if record.state != "exited" or record.settled or not record.running_reported:
                continue
            if not node.link.ok(node.clock()):
                return
            if not record.log_closed:
                self.ship_log_round(record)
            if record.log_closed:
                self.report_exit(record)

    def report_exit(self, record: TaskRecord) -> None:
        node = self.node
        body = {
            "attempt": record.attempt,
            "state": "exited",
            "pid": record.pid,
            "exit_code": record.exit_code,
            "signal": record.signal,
            "stopped_by": record.stopped_by,
            "stop_cause": record.stop_cause,
            "started_at": record.started_at,
            "ended_at": record.ended_at,
            "notebook_url": record.notebook.url if record.notebook else None,
            # Read now that the process is gone: a checkpoint it wrote in its grace period counts.
            "checkpoint_time": newest_mtime(Path(record.checkpoint_dir)),
        }
        if record.message:
            body["message"] = record.message  # a reason the agent gave itself (a failed image pull…)
        if (offset := node.clock_offset.estimate) is not None:
            body["clock_offset_s"] = round(offset[0], 3)  # the portal shifts the times above by it
        try:
            answer = node.link.call(f"tasks/{record.task_id}/status", body)
        except PortalError as exc:
            if exc.status in (404, 409):
                node.log.warning("portal says task %s attempt %s is stale (%s)", record.task_id, record.attempt, exc.code)
            else:
                node.log.error("portal refused the status of task %s: %s", record.task_id, exc)
            answer = {}  # nothing more of this attempt is wanted: not its log, not its end
            record.log_closed = True
        if answer is None:
            return
        record.exit_reported = True
        node.dirty = True
