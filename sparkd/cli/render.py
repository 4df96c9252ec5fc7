"""Human output of sparkctl (rich); --json prints sparkd's answers unchanged instead."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..sizes import format_size


def _size(n: int | None) -> str:
    return "-" if n is None else format_size(n)


def _memory(svc: dict) -> str:
    limit = svc.get("memory_max_bytes") or svc.get("memory_max_policy_bytes")
    text = f"{_size(svc.get('memory_current_bytes'))} / {_size(limit)}"
    high = svc.get("memory_high_bytes") or svc.get("memory_high_policy_bytes")
    text += f" (high {_size(high)})" if high else ""
    return text if svc.get("memory_enforced") else f"{text} [yellow](not enforced)[/]"


def _psi(svc: dict) -> str:
    some, full = svc.get("psi_some_avg10"), svc.get("psi_full_avg10")
    if some is None and full is None:
        return "-"
    return f"some {some if some is not None else '-'} full {full if full is not None else '-'}"


def _result(svc: dict) -> str:
    result = svc.get("last_result")
    if result is None:
        return "-"
    status = svc.get("last_exit_status")
    return result if status is None else f"{result} (status {status})"


def _engine(engine: dict) -> str:
    health = engine["health"]
    if health == "loading" and engine.get("progress") is not None:
        return f"loading {engine['progress']:.0%} ({engine['url']})"
    if health == "ready":
        rate = engine.get("decode_tok_s")
        speed = "no request yet" if not engine.get("generated_tokens") else f"{rate or 0:.1f} tok/s"
        return f"ready, {speed} ({engine['url']})"
    return f"{health}: {engine.get('error') or '-'} ({engine['url']})"


def render_status(console: Console, body: dict) -> None:
    daemon = body["daemon"]
    # placement_reason starts with the backend's name: "cgroupfs: daemon.placement is auto and ..."
    console.print(f"sparkd pid {daemon['pid']}, placement {escape(daemon['placement_reason'] or daemon['placement'])}")
    if not daemon["memory_enforced"]:
        console.print(f"[yellow]memory limits are NOT enforced: {escape(daemon['why_not_enforced'] or 'no memory controller')}[/]")
    if not daemon.get("gpu_available"):
        console.print(f"GPU use not shown: {escape(daemon.get('gpu_reason') or 'NVML unavailable')}")
    table = Table(box=None, pad_edge=False)
    for column in ("SERVICE", "STATE", "UNIT", "PID", "MEMORY cur/max", "GPU", "PSI avg10", "LAST RESULT", "GUARDS"):
        table.add_column(column)
    for svc in body["services"]:
        state = svc["state"] if svc["state"] == svc["sub_state"] else f"{svc['state']} ({svc['sub_state']})"
        guards = svc.get("guards")
        guard_text = "-" if guards is None else ("[red]refused[/]" if guards["refused"] else "ok")
        name = svc["name"] if svc["in_policy"] else f"{svc['name']} (not in policy)"
        table.add_row(escape(name), escape(state), escape(svc.get("unit") or "-"), str(svc.get("main_pid") or "-"),
                      _memory(svc), "-" if svc.get("gpu_mib") is None else f"{svc['gpu_mib']} MiB", _psi(svc), escape(_result(svc)), guard_text)
    console.print(table)
    for svc in body["services"]:
        if svc.get("cgroup") and svc["state"] != "inactive":
            console.print(f"  {escape(svc['name'])}: cgroup {escape(svc['cgroup'])}")
        if svc.get("engine"):
            console.print(f"  {escape(svc['name'])}: engine {escape(_engine(svc['engine']))}")
        if svc.get("last_result") not in (None, "success") and svc.get("last_message"):
            console.print(f"  {escape(svc['name'])}: last run: {escape(svc['last_message'])}")


def render_action(console: Console, body: dict) -> None:
    console.print(escape(body["message"]))
    for warning in body.get("warnings", []):
        console.print(f"[yellow]warning: {escape(warning)}[/]")


def render_refusal(console: Console, error: dict) -> None:
    # A guard refusal's message already lists every culprit and the deciding policy key.
    console.print(f"[red]{escape(error['message'])}[/]")


def render_preflight(console: Console, body: dict) -> None:
    if not body["services"]:
        console.print("no services in the policy")
    for name, report in body["services"].items():
        style = "red" if report["refused"] else "green"
        console.print(f"[{style}]{escape(report.get('text') or name)}[/]")
