from sparkd.placement import pid1_is_systemd


def test_pid1_comm(tmp_path):
    comm = tmp_path / "comm"
    comm.write_text("systemd\n")
    assert pid1_is_systemd(comm) == (True, "systemd")
    comm.write_text("process_api\n")
    assert pid1_is_systemd(comm) == (False, "process_api")
    assert pid1_is_systemd(tmp_path / "missing")[0] is False
