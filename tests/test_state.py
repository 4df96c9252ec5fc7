import json
import os

import pytest

from sparkd.state import STATE_FILE, StateError, StateStore


def test_missing_file_is_empty_state(tmp_path):
    store = StateStore(tmp_path / "nope")
    assert store.load() == {}


def test_round_trip_and_atomic_write(tmp_path):
    store = StateStore(tmp_path / "state")
    store.update("llm", backend="cgroupfs", unit="sparkd-llm.service", cgroup="/x", started_at=12.5, running=True)
    store.update("llm", last_result="oom-kill", last_exit_status=None, running=False)
    # Only the final file remains: no temporary left beside it.
    assert sorted(os.listdir(tmp_path / "state")) == [STATE_FILE]
    again = StateStore(tmp_path / "state").load()
    rec = again["llm"]
    assert (rec.backend, rec.unit, rec.cgroup, rec.started_at, rec.last_result, rec.running) == (
        "cgroupfs", "sparkd-llm.service", "/x", 12.5, "oom-kill", False)


def test_rename_replaces_whole_file(tmp_path):
    store = StateStore(tmp_path)
    store.update("a", backend="systemd", unit="sparkd-a.service")
    inode_before = os.stat(store.path).st_ino
    store.update("b", backend="systemd", unit="sparkd-b.service")
    # A new inode means a rename, not an in-place rewrite a crash could truncate.
    assert os.stat(store.path).st_ino != inode_before
    assert set(json.loads(store.path.read_text())["services"]) == {"a", "b"}


@pytest.mark.parametrize("text", ["{not json", "[]", '{"version": 99, "services": {}}', '{"version": 1, "services": {"a": {"bogus": 1}}}'])
def test_corrupt_file_is_a_clear_error(tmp_path, text):
    (tmp_path / STATE_FILE).write_text(text)
    with pytest.raises(StateError) as err:
        StateStore(tmp_path).load()
    msg = str(err.value)
    assert msg.startswith(f"could not parse state {tmp_path / STATE_FILE}: ")
    assert "move it aside" in msg


def test_unwritable_dir_is_a_clear_error_and_leaves_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = StateStore(blocker / "sub")
    with pytest.raises(StateError, match=r"could not write state .*/file/sub/state.json"):
        store.update("a", backend="x", unit="y")
    assert blocker.read_text() == ""
