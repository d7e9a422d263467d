"""The demo's embedded broker (portal/broker.py) under writers and readers that are real processes.

kombu's stock filesystem transport let a reader pick up a message file its writer had not finished,
and the demo's worker died of the JSONDecodeError; here several writers and readers run at once and
every message must arrive exactly once, whole, with no reader failing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from kombu import Connection

from portal.broker import BAD_DIR

REPO = Path(__file__).resolve().parents[2]
WRITERS, READERS, PER_WRITER = 4, 3, 60


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.demo.brokerproc", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


@pytest.mark.slow
def test_concurrent_writers_and_readers_see_every_message_exactly_once(tmp_path: Path) -> None:
    folder = tmp_path / "broker"
    folder.mkdir()
    done = tmp_path / "writers-done"
    readers = [_spawn("read", str(folder), str(tmp_path / f"read-{r}.txt"), str(done)) for r in range(READERS)]
    writers = [_spawn("write", str(folder), f"w{w}", str(PER_WRITER)) for w in range(WRITERS)]
    for process in writers:
        output, _ = process.communicate(timeout=120)
        assert process.returncode == 0, output.decode(errors="replace")
    done.touch()
    for process in readers:
        output, _ = process.communicate(timeout=120)
        assert process.returncode == 0, output.decode(errors="replace")

    seen = Counter(line for r in range(READERS) for line in (tmp_path / f"read-{r}.txt").read_text().split())
    expected = {f"w{w}-{i}" for w in range(WRITERS) for i in range(PER_WRITER)}
    assert set(seen) == expected
    assert [m for m, n in seen.items() if n > 1] == []
    assert not (folder / BAD_DIR).exists()
    assert [name for name in os.listdir(folder) if name.endswith(".msg")] == []


def test_a_half_written_message_file_is_set_aside_and_the_next_one_delivered(tmp_path: Path) -> None:
    # What a writer of the stock transport leaves when it dies mid-write (or what a reader used to race).
    folder = tmp_path / "broker"
    folder.mkdir()
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder), "control_folder": str(tmp_path / "control")}
    with Connection("filesystem://", transport="portal.broker:Transport", transport_options=options) as conn:
        queue = conn.SimpleQueue("jobs")
        (folder / "1_00000000-half.jobs.msg").write_bytes(b'{"body": "eyJ')
        queue.put({"id": "whole"})
        message = queue.get(block=True, timeout=5)
        assert message.payload == {"id": "whole"}
        message.ack()
        queue.close()
    assert os.listdir(folder / BAD_DIR) == ["1_00000000-half.jobs.msg"]


def test_the_demo_settings_select_this_transport() -> None:
    # Without REDIS_URL (the zero-setup demo) Celery must use portal.broker, not kombu's stock transport.
    code = "from portal.celery import app; print(app.conf.broker_transport, app.connection().transport_cls)"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["portal.broker:Transport", "portal.broker:Transport"]
