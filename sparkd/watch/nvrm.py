"""Classify NVIDIA driver (NVRM) kernel log lines: Xid errors and the driver's out-of-memory checks.

Xid classes follow NVIDIA's Xid catalogue: application faults (the process did something wrong;
the GPU is fine) versus node faults (the GPU or the driver is in trouble; every GPU user is).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 94})
NODE_XIDS = frozenset({48, 63, 64, 74, 79, 92, 95, 119, 120, 154})
# "NVRM: Xid (PCI:0000:01:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
_XID = re.compile(r"NVRM: Xid \(([^)]*)\): (\d+)\b(.*)")
_PID = re.compile(r"\bpid=(\d+)")
_NAME = re.compile(r"\bname=([^,]+)")
_NO_MEMORY = ("NV_ERR_NO_MEMORY", "out of memory")


@dataclass(frozen=True)
class NvrmFinding:
    kind: str  # xid | no_memory
    text: str
    xid: int | None = None
    xid_class: str | None = None  # application | node | other
    pid: int | None = None
    process_name: str | None = None
    device: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def xid_class(xid: int) -> str:
    if xid in APPLICATION_XIDS:
        return "application"
    return "node" if xid in NODE_XIDS else "other"


def classify(text: str) -> NvrmFinding | None:
    """A finding for an NVRM line, None for any other line."""
    if "NVRM" not in text:
        return None
    m = _XID.search(text)
    if m:
        xid = int(m.group(2))
        pid = _PID.search(m.group(3))
        name = _NAME.search(m.group(3))
        process_name = name.group(1).strip() if name and name.group(1).strip() != "<unknown>" else None
        return NvrmFinding("xid", text, xid, xid_class(xid), int(pid.group(1)) if pid else None, process_name, m.group(1))
    lowered = text.lower()
    if any(marker.lower() in lowered for marker in _NO_MEMORY):
        return NvrmFinding("no_memory", text)
    return None


def matches(finding: NvrmFinding, match: str, xids: list[int] | None = None) -> bool:
    """Does a kernel_log rule's `match` (and `xids`) select this finding?"""
    if match == "no_memory":
        return finding.kind == "no_memory"
    if finding.kind != "xid":
        return False
    if match == "xid":
        return xids is None or finding.xid in xids
    return finding.xid_class == match.removeprefix("xid_")
