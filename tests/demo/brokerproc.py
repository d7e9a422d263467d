"""One writer or reader process of the broker test (tests/demo/test_broker.py), through kombu itself.

    python -m tests.demo.brokerproc write FOLDER WRITER_ID COUNT
    python -m tests.demo.brokerproc read FOLDER OUT_FILE DONE_FLAG

A reader writes the id of every message it got, one a line, and exits once DONE_FLAG exists and the
queue has stayed empty for a while; any exception (a decode error included) exits non-zero.
"""

from __future__ import annotations

import os
import sys
import time
from queue import Empty

from kombu import Connection

TRANSPORT = os.environ.get("YARD_TEST_TRANSPORT", "portal.broker:Transport")
# Big enough that a write takes several system calls' time: a reader racing a writer would see it half done.
PADDING = "x" * 256 * 1024


def connection(folder: str) -> Connection:
    return Connection(
        "filesystem://",
        transport=TRANSPORT,
        transport_options={"data_folder_in": folder, "data_folder_out": folder, "control_folder": folder + "-control"},
    )


def write(folder: str, writer: str, count: int) -> None:
    with connection(folder) as conn:
        queue = conn.SimpleQueue("jobs")
        for i in range(count):
            queue.put({"id": f"{writer}-{i}", "padding": PADDING})
        queue.close()


def read(folder: str, out_file: str, done_flag: str) -> None:
    with connection(folder) as conn, open(out_file, "a") as out:
        queue = conn.SimpleQueue("jobs")
        empty_since: float | None = None
        while True:
            try:
                message = queue.get(block=True, timeout=0.2)
            except Empty:
                if not os.path.exists(done_flag):
                    continue
                empty_since = empty_since or time.monotonic()
                if time.monotonic() - empty_since > 1.5:
                    break
                continue
            empty_since = None
            assert message.payload["padding"] == PADDING, "a message arrived cut short"
            out.write(message.payload["id"] + "\n")
            out.flush()
            message.ack()
        queue.close()


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    if mode == "write":
        write(rest[0], rest[1], int(rest[2]))
    else:
        read(rest[0], rest[1], rest[2])
