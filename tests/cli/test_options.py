"""`yard submit`'s own option parsing (no server needed)."""

import click
import pytest
from yardcli.commands.submit import _memory_mb


@pytest.mark.parametrize(
    "text,mib", [("512", 512), ("512M", 512), ("64G", 65536), ("1.5T", 1572864), ("64GiB", 65536), ("10K", 1)]
)
def test_mem_reads_sizes_as_sbatch_does(text, mib):
    assert _memory_mb(text, param="--mem") == mib


def test_a_mem_without_a_number_says_what_to_give():
    with pytest.raises(click.BadParameter, match="give MiB, or a number with K, M, G or T"):
        _memory_mb("lots", param="--mem")


def test_wait_says_why_a_job_whose_image_could_not_be_pulled_failed():
    from yardcli.result import EXIT_FAILED_NO_CODE, describe, exit_status

    job = {
        "id": 7, "state": "FAILED", "stop_reason": "IMAGE_PULL", "image": "nvcr.io/x:1", "exit_code": -1,
        "stop_message": "node n1: image pull failed: nvcr.io/x:1: no such image (manifest unknown)", "tasks": [],
    }  # fmt: skip
    assert describe(job) == (
        "job 7 failed: its image could not be pulled (node n1: image pull failed: nvcr.io/x:1: no such image (manifest unknown))"
    )
    assert exit_status(job) == EXIT_FAILED_NO_CODE
