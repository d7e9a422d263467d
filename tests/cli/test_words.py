"""What the CLI prints reads as the CLI: API field names said as its options, a piped table that keeps
each row whole on one line, and `yard notebook stop` saying the stop it started."""

from __future__ import annotations

from yardcli.commands.common import _table, option_words
from yardcli.commands.notebooks import notebook_stop_words


def test_an_api_field_is_said_as_the_option_the_person_typed():
    said = option_words("time_limit_s: Ensure this value is less than or equal to 604800; gpus_per_replica too")
    assert said == "--time: Ensure this value is less than or equal to 604800; --gpus too"
    assert option_words("team: No such team, or not one you may submit to") == (
        "team: No such team, or not one you may submit to"
    )  # a plain word stays a word


def test_a_piped_table_keeps_every_cell_whole_on_one_line(capsys):
    reason = "queued: the scheduler places it at its next cycle, in a second or two (no cores free on node-07)"
    _table(["ID", "STATE", "REASON / WHERE"], [[7, "PENDING", reason], [12, "RUNNING", None]])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert lines[0].split() == ["ID", "STATE", "REASON", "/", "WHERE"]
    assert lines[1].split(None, 2) == ["7", "PENDING", reason]
    assert lines[2].split() == ["12", "RUNNING"]
    assert lines[1].index("PENDING") == lines[2].index("RUNNING")  # columns line up for awk and cut


def test_notebook_stop_says_stopping_not_the_running_it_answered_in():
    said = notebook_stop_words({"id": 4, "name": "nb", "state": "RUNNING", "stop_requested_at": "2026-12-02T10:00Z"})
    assert said.startswith("notebook 4 (nb): STOPPING") and "RUNNING" not in said
    assert notebook_stop_words({"id": 4, "name": "nb", "state": "CANCELLED"}) == "notebook 4 (nb): CANCELLED (ended)"
