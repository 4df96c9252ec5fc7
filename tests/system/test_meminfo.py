from pathlib import Path

import psutil
import pytest

from sparkd.errors import SparkdError
from sparkd.system.meminfo import parse_meminfo, read_meminfo

# A DGX Spark's /proc/meminfo (trimmed): 121 GiB shared by CPU and GPU, no swap.
SPARK = """MemTotal:       128443532 kB
MemFree:         2514004 kB
MemAvailable:   98765432 kB
Buffers:            1024 kB
Cached:         90000000 kB
SwapCached:            0 kB
SwapTotal:       16777212 kB
SwapFree:        16000000 kB
HugePages_Total:       0
"""


def test_real_proc_meminfo_is_consistent():
    mem = read_meminfo()
    assert mem.total_bytes == psutil.virtual_memory().total  # psutil reads the same MemTotal
    assert 0 < mem.available_bytes <= mem.total_bytes
    assert 0 <= mem.swap_free_bytes <= mem.swap_total_bytes


def test_literal_file_in_bytes(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text(SPARK)
    mem = read_meminfo(path)
    assert mem.total_bytes == 128443532 * 1024
    assert mem.available_bytes == 98765432 * 1024
    assert mem.swap_total_bytes == 16777212 * 1024
    assert mem.swap_used_bytes == (16777212 - 16000000) * 1024
    assert mem.to_dict()["swap_free_bytes"] == 16000000 * 1024


def test_missing_field_names_it_and_the_file():
    with pytest.raises(SparkdError, match=r"could not parse /x/meminfo: missing MemAvailable"):
        parse_meminfo(SPARK.replace("MemAvailable", "MemAvail"), source="/x/meminfo")


def test_malformed_number_names_the_line():
    with pytest.raises(SparkdError, match=r"could not parse m line 3: expected 'MemAvailable: <number> kB', found 'MemAvailable:   lots kB'"):
        parse_meminfo(SPARK.replace("98765432", "lots"), source="m")


def test_missing_file():
    with pytest.raises(SparkdError, match=r"could not read /nonexistent/meminfo: No such file or directory"):
        read_meminfo(Path("/nonexistent/meminfo"))
