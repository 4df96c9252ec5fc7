"""ServiceSpec from the policy: the one place a service's policy becomes what a backend runs."""

from __future__ import annotations

from .placement.base import ServiceSpec
from .policy import ServicePolicy

ENGINE_EXECUTABLE = "sparkd-engine"
_MIB = 1 << 20
# The engine's own budget (trunk + KV + workspace + expert cache) must leave room inside
# memory_max for what its memory plan does not count: the Python runtime, torch's allocator slack
# and the CUDA context. An eighth of the limit, capped at 2 GiB: 92G -> 90G budget, 512M -> 448M.
_ENGINE_OVERHEAD_FRACTION = 8
_ENGINE_OVERHEAD_CAP_BYTES = 2 << 30


def engine_budget_bytes(memory_max_bytes: int) -> int:
    overhead = min(memory_max_bytes // _ENGINE_OVERHEAD_FRACTION, _ENGINE_OVERHEAD_CAP_BYTES)
    return memory_max_bytes - overhead


def engine_argv(service: ServicePolicy, engine_executable: str = ENGINE_EXECUTABLE) -> list[str]:
    """argv of the service's engine: the command as written, or `sparkd-engine serve ...`."""
    engine = service.engine
    if engine.command is not None:
        return list(engine.command)
    emb = engine.embedded
    budget_mib = engine_budget_bytes(service.memory_max) // _MIB
    argv = [engine_executable, "serve", str(emb.model), "--listen", emb.listen, "--budget", f"{budget_mib}M"]
    if emb.ctx is not None:
        argv += ["--ctx", str(emb.ctx)]
    if emb.alias is not None:
        argv += ["--alias", emb.alias]
    if emb.api_key_file is not None:
        argv += ["--api-key-file", str(emb.api_key_file)]
    return argv + list(emb.extra_args)


def build_spec(name: str, service: ServicePolicy, engine_executable: str = ENGINE_EXECUTABLE) -> ServiceSpec:
    kind = "embedded engine" if service.engine.embedded is not None else "command"
    return ServiceSpec(
        name=name,
        argv=engine_argv(service, engine_executable),
        memory_max_bytes=service.memory_max,
        memory_high_bytes=service.memory_high,
        swap_max_bytes=service.swap_max,
        oom_policy=service.oom_policy,
        restart=service.restart,
        cpu_weight=service.cpu_weight,
        environment=dict(service.environment),
        working_directory=str(service.working_directory) if service.working_directory else None,
        user=service.user,
        stop_timeout_seconds=service.stop_timeout,
        description=f"sparkd service {name} ({kind})",
    )
