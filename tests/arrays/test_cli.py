"""The real `yard` console script against a live server: submit an array (--array, and a script's
#SBATCH --array), show it, list its tasks, cancel one task and the whole array."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scheduling.models import Job, JobArray
from scheduling.states import JobState
from tests.cli.conftest import Yard, roomy_throttle  # noqa: F401
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def yard(live_server: Any, cast: Any, roomy_throttle: None, tmp_path: Path) -> Yard:  # noqa: F811
    make_cluster(nodes=2)
    home = tmp_path / "config"
    home.mkdir()
    return Yard(url=live_server.url, token=cast.ann_token, home=home)


def test_submit_with_array_makes_the_tasks_and_says_how_to_follow_them(yard: Yard, cast: Any) -> None:
    team = cast.org.team_a.slug
    done = yard.run("submit", "--team", team, "--name", "sweep", "--array", "0-9%3", "--", "python", "eval.py", check=True)
    array = JobArray.objects.get()
    assert f"Submitted array {array.pk} (sweep): 10 tasks (--array 0-9%3: at most 3 running at once)" in done.stdout
    assert Job.objects.filter(array=array).count() == 10
    assert Job.objects.get(array=array, array_index=4).command == "python eval.py"

    shown = yard.run("array", "show", str(array.pk), check=True).stdout
    assert "0-9%3 (10 tasks, at most 3 running at once)" in shown
    assert "10 pending" in shown

    listed = yard.run("ls", "--array", str(array.pk), "--json", check=True).stdout
    assert sorted(j["array_index"] for j in json.loads(listed)) == list(range(10))
    table = yard.run("ls", "--array", str(array.pk), check=True).stdout
    assert f"{array.pk}_7" in table

    throttled = yard.run("array", "throttle", str(array.pk), "7", check=True).stdout
    assert "0-9%7 (10 tasks, at most 7 running at once)" in throttled
    assert "0-9 (10 tasks)" in yard.run("array", "throttle", str(array.pk), "0", check=True).stdout
    assert JobArray.objects.get(pk=array.pk).max_running is None

    one = Job.objects.get(array=array, array_index=2)
    yard.run("cancel", str(one.pk), check=True)
    assert Job.objects.get(pk=one.pk).state == JobState.CANCELLED
    cancelled = yard.run("array", "cancel", str(array.pk), check=True).stdout
    assert "9 tasks cancelled" in cancelled and "10 cancelled" in cancelled
    assert not Job.objects.filter(array=array, state=JobState.PENDING).exists()


def test_test_only_shows_the_array_and_submits_nothing(yard: Yard, cast: Any) -> None:
    done = yard.run("submit", "--team", cast.org.team_a.slug, "--array", "0-99%5", "--test-only", "--", "true", check=True)
    assert "  array: 0-99%5" in done.stdout and "Admission (each task of the array, checked once)" in done.stdout
    assert not Job.objects.exists()


def test_a_bad_array_is_refused_with_what_to_change(yard: Yard, cast: Any) -> None:
    done = yard.run("submit", "--team", cast.org.team_a.slug, "--array", "5-1", "--", "true")
    assert done.returncode != 0
    assert "give 1-5" in done.stdout + done.stderr
    assert not Job.objects.exists()


def test_wait_is_refused_for_an_array_before_anything_is_submitted(yard: Yard, cast: Any) -> None:
    done = yard.run("submit", "--team", cast.org.team_a.slug, "--array", "0-3", "--wait", "--", "true")
    assert done.returncode == 2 and "yard array show" in done.stderr
    assert not Job.objects.exists()


def test_an_sbatch_script_with_array_becomes_an_array(yard: Yard, cast: Any, tmp_path: Path) -> None:
    script = tmp_path / "sweep.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --account={cast.org.team_a.slug}\n#SBATCH --gres=gpu:1\n#SBATCH -a 1,3,5-7\n"
                      'python eval.py --seed "$SLURM_ARRAY_TASK_ID"\n')  # fmt: skip
    done = yard.run("sbatch", str(script), check=True)
    array = JobArray.objects.get()
    assert f"Submitted array {array.pk} (sweep) from a slurm file" in done.stdout
    assert sorted(Job.objects.filter(array=array).values_list("array_index", flat=True)) == [1, 3, 5, 6, 7]
