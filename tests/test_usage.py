from sparkd.usage import find_cgroup2_mount, read_usage, resolve_cgroup_dir


def test_reads_memory_and_pressure(tmp_path):
    (tmp_path / "memory.current").write_text("1048576\n")
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.high").write_text("786432\n")
    (tmp_path / "memory.pressure").write_text(
        "some avg10=12.50 avg60=1.00 avg300=0.00 total=10\nfull avg10=3.25 avg60=0.00 avg300=0.00 total=5\n")
    u = read_usage(tmp_path)
    assert (u.memory_current_bytes, u.memory_max_bytes, u.memory_max_unlimited) == (1048576, None, True)
    assert u.memory_high_bytes == 786432
    (tmp_path / "memory.high").write_text("max\n")
    assert read_usage(tmp_path).memory_high_bytes is None
    assert (u.psi_some_avg10, u.psi_full_avg10) == (12.5, 3.25)


def test_hybrid_host_has_only_pressure(tmp_path):
    (tmp_path / "memory.pressure").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    u = read_usage(tmp_path)
    assert (u.memory_current_bytes, u.memory_max_bytes, u.psi_some_avg10, u.psi_full_avg10) == (None, None, 0.0, None)


def test_mounts_and_relative_cgroup(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("cgroup /sys/fs/cgroup/memory cgroup rw 0 0\ncgroup2 /x/unified cgroup2 rw 0 0\n")
    assert str(find_cgroup2_mount(mounts)) == "/x/unified"
    (tmp_path / "sparkd.slice" / "a.service").mkdir(parents=True)
    assert resolve_cgroup_dir("/sparkd.slice/a.service", tmp_path) == tmp_path / "sparkd.slice" / "a.service"
    assert resolve_cgroup_dir(str(tmp_path / "sparkd.slice" / "a.service"), tmp_path) == tmp_path / "sparkd.slice" / "a.service"
    assert resolve_cgroup_dir("/gone", tmp_path) is None


def test_cgroup_pids_include_children(tmp_path):
    (tmp_path / "child").mkdir()
    (tmp_path / "cgroup.procs").write_text("10\n11\n")
    (tmp_path / "child" / "cgroup.procs").write_text("12\n")
    from sparkd.usage import cgroup_pids

    assert cgroup_pids(tmp_path) == {10, 11, 12}
    assert cgroup_pids(None) == set()
