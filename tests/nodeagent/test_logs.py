"""Log shipping: chunks at UTF-8 character boundaries, byte offsets, and nothing stored twice."""

from __future__ import annotations

from collections.abc import Callable

from nodeagent.agent import utf8_cut
from tests.nodeagent.conftest import RunningAgent, task_spec
from tests.nodeagent.fakeportal import FakePortal


def test_utf8_cut_never_splits_a_character() -> None:
    text = "aé€😀".encode()
    cuts = [utf8_cut(text[:n]) for n in range(len(text) + 1)]
    assert cuts == [0, 1, 1, 3, 3, 3, 6, 6, 6, 6, 10]


def test_a_long_multibyte_log_arrives_whole_over_many_chunks(
    portal: FakePortal, start_agent: Callable[..., RunningAgent]
) -> None:
    line = "héllo wörld — ünïcödé\n"
    start_agent()
    portal.set_desired("node-t1", [task_spec(50, f"yes '{line.strip()}' | head -n 20000")])
    portal.wait_for(lambda: portal.statuses_of(50, "exited"), what="task 50 exited")
    assert portal.log_text(50) == line * 20000  # about 560 KB: nine 64 KiB chunks
