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
