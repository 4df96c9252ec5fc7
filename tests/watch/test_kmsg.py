"""The kernel log: record parsing and NVRM classification with literal lines; the real /dev/kmsg
(root): a written NVRM line is read, reading starts at the end, resume after a sequence number,
and a real overrun (EPIPE) is reported and survived."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from sparkd.watch.kmsg import KmsgError, KmsgReader, parse_record
from sparkd.watch.nvrm import classify, matches

KMSG = "/dev/kmsg"


def write_kmsg(text: str) -> None:
    # A fresh open per line: /dev/kmsg rate-limits writers per open file (10 lines per 5 s).
    fd = os.open(KMSG, os.O_WRONLY)
    try:
        os.write(fd, f"<4>{text}\n".encode())
    finally:
        os.close(fd)


def test_parse_record_with_escapes_and_continuation_lines():
    rec = parse_record(b"6,1234,5678901,-,caller=T1;NVRM: tab\\x09here\n SUBSYSTEM=pci\n DEVICE=+pci:0000:01:00.0\n")
    assert (rec.priority, rec.level, rec.seq, rec.usec, rec.flags) == (6, 6, 1234, 5678901, "-")
    assert rec.text == "NVRM: tab\there"
    assert rec.fields == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:01:00.0"}


def test_parse_record_rejects_garbage():
    with pytest.raises(KmsgError, match="expected 'prio,seq,usec,flags;text'"):
        parse_record(b"not a record\n")


@pytest.mark.parametrize("line, kind, xid, cls, pid, name", [
    ("NVRM: Xid (PCI:0000:01:00): 13, pid=1234, name=python3, Graphics SM Warp Exception", "xid", 13, "application", 1234, "python3"),
    ("NVRM: Xid (PCI:0000:0f:00): 31, pid=2369, name=llama-server, Ch 00000008, intr 10000000. MMU Fault", "xid", 31, "application", 2369, "llama-server"),
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", "xid", 79, "node", None, None),
    ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", "xid", 154, "node", None, None),
    ("NVRM: Xid (PCI:0000:01:00): 62, pid=1, name=x, Internal micro-controller halt", "xid", 62, "other", 1, "x"),
    ("NVRM: nvAssertOkFailedNoLog: Assertion failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) returned from kgrctxAllocMainCtxBuffer", "no_memory", None, None, None, None),
])
def test_classify_nvrm_lines(line, kind, xid, cls, pid, name):
    f = classify(line)
    assert (f.kind, f.xid, f.xid_class, f.pid, f.process_name) == (kind, xid, cls, pid, name)


def test_classify_ignores_other_lines_and_rules_match_classes():
    assert classify("usb 1-1: new high-speed USB device") is None
    assert classify("NVRM: loading NVIDIA UNIX Open Kernel Module 580.95") is None
    node = classify("NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=a, fallen off the bus")
    app = classify("NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=a, Graphics Exception")
    oom = classify("NVRM: Out of memory [NV_ERR_NO_MEMORY]")
    assert matches(node, "xid_node") and not matches(app, "xid_node") and matches(app, "xid_application")
    assert matches(oom, "no_memory") and not matches(oom, "xid") and not matches(node, "no_memory")
    assert matches(app, "xid", [13, 31]) and not matches(node, "xid", [13, 31]) and matches(node, "xid")


def _drain_until(reader, fd, want, timeout_seconds=5.0):
    deadline = time.monotonic() + timeout_seconds
    while not want() and time.monotonic() < deadline:
        reader.drain(fd)
        time.sleep(0.01)


@pytest.mark.root
def test_real_kmsg_starts_at_the_end_and_sees_a_written_nvrm_line():
    marker = uuid.uuid4().hex
    write_kmsg(f"NVRM: sparkd-test before {marker}")  # already in the log: history, not news
    seen = []
    reader = KmsgReader(seen.append, lambda lost: None)
    fd = reader._open()
    try:
        write_kmsg(f"NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=x, sparkd-test {marker}")
        _drain_until(reader, fd, lambda: any(marker in r.text for r in seen))
    finally:
        os.close(fd)
    texts = [r.text for r in seen if marker in r.text]
    assert texts == [f"NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=x, sparkd-test {marker}"]
    assert classify(texts[0]).xid == 79


@pytest.mark.root
def test_real_kmsg_resume_reads_what_was_logged_while_away():
    marker = uuid.uuid4().hex
    first = []
    reader = KmsgReader(first.append, lambda lost: None)
    fd = reader._open()
    write_kmsg(f"sparkd-test one {marker}")
    _drain_until(reader, fd, lambda: first)
    os.close(fd)
    write_kmsg(f"sparkd-test two {marker}")  # logged while no reader was open
    again = []
    resumed = KmsgReader(again.append, lambda lost: None, resume_after_seq=reader.last_seq)
    fd = resumed._open()
    try:
        _drain_until(resumed, fd, lambda: any("two" in r.text and marker in r.text for r in again))
    finally:
        os.close(fd)
    assert [r.text for r in again if marker in r.text] == [f"sparkd-test two {marker}"]


@pytest.mark.root
def test_real_kmsg_overrun_is_reported_and_survived():
    """Fall behind by more than the kernel's ring buffer (CONFIG_LOG_BUF_SHIFT, 128 KiB here):
    the next read fails with EPIPE; the reader reports the lost records and reads on. This floods
    the kernel log with ~1 MiB of test lines (dmesg history is lost)."""
    marker = uuid.uuid4().hex
    seen, overruns = [], []
    reader = KmsgReader(seen.append, overruns.append)
    fd = reader._open()
    try:
        reader.drain(fd)
        write_kmsg(f"sparkd-test first {marker}")
        _drain_until(reader, fd, lambda: seen)
        filler = "x" * 900
        for i in range(1200):  # ~1 MiB: more than any default ring buffer of a small machine
            write_kmsg(f"sparkd-test overrun filler {i} {filler}")
        write_kmsg(f"NVRM: Out of memory [NV_ERR_NO_MEMORY] sparkd-test after {marker}")
        _drain_until(reader, fd, lambda: any("after" in r.text and marker in r.text for r in seen))
    finally:
        os.close(fd)
    assert overruns and overruns[0] > 0, "no overrun: the ring buffer is larger than the test wrote"
    assert reader.overruns == 1
    assert any(f"after {marker}" in r.text for r in seen)
