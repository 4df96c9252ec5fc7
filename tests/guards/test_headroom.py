"""Headroom, swap and cgroup guards against literal /proc files and the real host."""

from pathlib import Path

import pytest

from sparkd.errors import GuardRefusal, SparkdError
from sparkd.guards import GuardContext, preflight
from sparkd.guards.cgroup import check_cgroup
from sparkd.system.cgroups import controllers as read_controllers, find_cgroup2_mount
from sparkd.guards.headroom import check_headroom, check_swap
from sparkd.policy import parse_policy
from sparkd.system.meminfo import MemInfo

GiB = 1 << 30
MEM = MemInfo(total_bytes=121 * GiB, available_bytes=100 * GiB, swap_total_bytes=0, swap_free_bytes=0)


def make_policy(memory_max="92G", reserve="16G", **services):
    svc = {"engine": {"command": ["sleep", "1"]}, "memory_max": memory_max}
    return parse_policy({"services": {"kimi": svc, **services}, "guards": {"reserve": reserve, "competitors": []}},
                        source="test", total_memory_bytes=121 * GiB)


def test_refusal_names_the_numbers_and_the_keys():
    pol = make_policy()
    check = check_headroom("kimi", pol.services["kimi"], pol.guards, MEM)
    assert check.status == "refused"
    assert check.policy_key == "services.kimi.memory_max, guards.reserve"
    for text in ("services.kimi.memory_max 92.0G (98784247808 B)", "guards.reserve 16.0G (17179869184 B)",
                 "= 108.0G", "MemAvailable 100.0G (107374182400 B)", "8.0G short"):
        assert text in check.message


def test_what_the_restart_frees_counts_as_available():
    pol = make_policy()
    check = check_headroom("kimi", pol.services["kimi"], pol.guards, MEM, freed_by_restart_bytes=90 * GiB)
    assert check.status == "ok" and "+ 90.0G freed by the restart" in check.message and "82.0G to spare" in check.message


def test_exact_fit_passes():
    pol = make_policy(memory_max="84G")
    assert check_headroom("kimi", pol.services["kimi"], pol.guards, MEM).status == "ok"


def test_swap_state_is_reported():
    pol = make_policy()
    swap = MemInfo(121 * GiB, 100 * GiB, swap_total_bytes=8 * GiB, swap_free_bytes=6 * GiB)
    assert check_swap("kimi", pol.services["kimi"], swap).message == \
        "swap 8.0G total, 2.0G used; services.kimi.swap_max = 0B"
    assert check_swap("kimi", pol.services["kimi"], MEM).message.startswith("no swap configured")


def write_mountinfo(tmp_path: Path, cgroup_dir: Path | None) -> Path:
    lines = ["22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw"]
    if cgroup_dir is not None:
        lines.append(f"35 22 0:30 / {cgroup_dir} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate")
    path = tmp_path / "mountinfo"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("controllers, status", [("cpuset cpu io memory pids", "ok"), ("cpu pids", "warning")])
def test_cgroup_controllers(tmp_path, controllers, status):
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "cgroup.controllers").write_text(controllers + "\n")
    check = check_cgroup(write_mountinfo(tmp_path, cg), "kimi")
    assert check.status == status
    if status == "warning":
        assert f"cgroup2 at {cg} has no memory controller (controllers: cpu pids)" in check.message
        assert "NOT enforced" in check.message and check.policy_key == "services.kimi.memory_max"


def test_no_cgroup2_refuses(tmp_path):
    check = check_cgroup(write_mountinfo(tmp_path, None), "kimi")
    assert check.status == "refused" and "no cgroup2 file system in" in check.message


def test_unreadable_controllers_refuse_naming_the_file(tmp_path):
    check = check_cgroup(write_mountinfo(tmp_path, tmp_path / "missing"), "kimi")
    assert check.status == "refused"
    assert check.message == f"could not read {tmp_path / 'missing' / 'cgroup.controllers'}: No such file or directory"


def test_real_host_cgroup_matches_its_controllers():
    mount = find_cgroup2_mount()
    check = check_cgroup()
    if mount is None:
        assert check.status == "refused"
    else:
        assert check.status == ("ok" if "memory" in read_controllers(mount) else "warning")
        assert str(mount) in check.message


async def test_preflight_refusal_lists_every_key(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 126877696 kB\nMemAvailable: 104857600 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n")
    report = await preflight(make_policy(), "kimi", GuardContext(meminfo_path=meminfo))
    assert report.refused
    data = report.to_dict()
    assert data["refused"] is True and data["service"] == "kimi"
    assert {c["name"] for c in data["checks"]} >= {"gpu", "cgroup", "headroom[kimi]", "swap[kimi]"}
    with pytest.raises(GuardRefusal, match=r"could not start service kimi: refused by guards: headroom\[kimi\]: .*"
                                           r"\[services.kimi.memory_max, guards.reserve\]"):
        report.raise_if_refused()


async def test_preflight_without_a_service_checks_each(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 126877696 kB\nMemAvailable: 104857600 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n")
    pol = make_policy(small={"engine": {"command": ["sleep", "1"]}, "memory_max": "4G"})
    report = await preflight(pol, None, GuardContext(meminfo_path=meminfo))
    status = {c.name: c.status for c in report.checks}
    assert status["headroom[kimi]"] == "refused" and status["headroom[small]"] == "ok"
    assert report.render().startswith("preflight for all services: REFUSED")


async def test_unreadable_meminfo_refuses(tmp_path):
    report = await preflight(make_policy(), "kimi", GuardContext(meminfo_path=tmp_path / "nope"))
    check = next(c for c in report.checks if c.name == "headroom")
    assert (check.status, check.message) == ("refused", f"could not read {tmp_path / 'nope'}: No such file or directory")


async def test_unknown_service_is_a_clear_error():
    with pytest.raises(SparkdError, match=r"could not run preflight for service 'nope': not in the policy \(services: kimi\)"):
        await preflight(make_policy(), "nope")
