"""`sparkd-engine serve MODEL`: bind first (so /health answers "loading" with progress), load
the model in a thread with a progress bar on a terminal, then serve until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from sparkd.engine.errors import EngineError
from sparkd.engine.progress import byte_progress
from sparkd.engine.prompt_store import parse_store_mib
from sparkd.engine.server import DEFAULT_TOP_K
from sparkd.engine.streaming.commands import add_kv_type_option
from sparkd.engine.streaming.device import UNIFIED_CHOICES
from sparkd.engine.streaming.policies import DEFAULT_POLICY, POLICIES

DEFAULT_LISTEN = "127.0.0.1:7777"


def add_arguments(s: argparse.ArgumentParser, parse_size) -> None:
    from sparkd.engine.cli import add_graphs_option

    s.add_argument("model", help="GGUF file (first shard of a split model)")
    s.add_argument("--listen", default=DEFAULT_LISTEN, help=f"HOST:PORT (default {DEFAULT_LISTEN}, loopback)")
    s.add_argument("--budget", type=parse_size, help="memory budget for the engine, e.g. 90G")
    s.add_argument("--ctx", type=int, help="context positions (default: min(4096, training context))")
    s.add_argument("--alias", help="model name clients use (default: the file name without .gguf)")
    key = s.add_mutually_exclusive_group()
    key.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 and /admin")
    key.add_argument("--api-key-file", type=Path, help="read the API key from this file")
    s.add_argument("--reasoning-budget", type=int, help="reasoning tokens before the thinking part is closed")
    s.add_argument("--max-queue", type=int, default=16, help="requests waiting for the slot before 429")
    s.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, metavar="N",
                   help=f"top-k for requests that send none (default {DEFAULT_TOP_K}, as llama-server and ollama; "
                        "0: every token, as OpenAI's API; on CUDA both draw on the device, 0 with top_p < 1 on a slower "
                        "sort)")
    s.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's choice)")
    s.add_argument("--resident", action="store_true", help="every expert in memory, no streaming (measurement)")
    s.add_argument("--device", default="cpu", help="cpu, or cuda: the Triton kernels on GGUF blocks in GPU "
                                                  "memory (streamed experts read in place from pinned host memory)")
    add_graphs_option(s)
    s.add_argument("--prompt-graphs", default="auto", metavar="auto|lazy|off|N,N,...",
                   help="with CUDA graphs: the prompt graphs captured at load, so no request pays a capture: "
                        "auto = every bucket up to 2048 tokens (1024 under torch or kernel prefill attention or with "
                        "attention sinks); lazy = each on its first prompt; off = prompts eager; N,N,... = the "
                        "buckets of prompts of these lengths (2-2048), the rest lazy")
    s.add_argument("--prompt-graph-margin", type=parse_size, metavar="SIZE",
                   help="capture a prompt (or decode) graph only when it leaves this much device memory free, else "
                        "that bucket runs eagerly (default 1G)")
    s.add_argument("--decode-graphs", default="auto", metavar="auto|lazy|N,N,...",
                   help="with CUDA graphs: the decode step's attention buckets (256, 512, ... up to --ctx) captured "
                        "at load with their draw graphs, so no reply pays a capture as it grows: auto = all; lazy = "
                        "256, the rest on a request's first step there; N,N,... = 256 and the buckets of these "
                        "positions")
    s.add_argument("--prompt-cache", default="on", choices=["on", "off"],
                   help="on = a request continues the KV cache at the prefix its prompt shares with the last "
                        "request's tokens (a chat's next turn runs only its new tokens); off = every prompt whole")
    s.add_argument("--prompt-cache-mib", default="auto", metavar="N|auto",
                   help="with the prompt cache: MiB for copies of the KV rows of conversations the cache gave up "
                        "(clients taking turns each continue their own), least recently used out first, in the "
                        "memory plan beside the KV cache; 0 = the live cache only; auto = 2048, at most 1/16 of "
                        "the memory budget and at most what the rest of the plan leaves")
    s.add_argument("--policy", default=DEFAULT_POLICY, choices=sorted(POLICIES), help="expert cache policy")
    s.add_argument("--prefetch", type=int, default=0, metavar="SLOTS", help="expert prefetch slots (0: off)")
    s.add_argument("--read-threads", type=int, default=8, help="expert read threads")
    s.add_argument("--buffered", action="store_true", help="read experts without O_DIRECT")
    s.add_argument("--unified", choices=UNIFIED_CHOICES, default="auto",
                   help="with --device cuda: on = streamed experts read in place (zero-copy); off = plus a "
                        "VRAM expert cache; auto = off on a discrete GPU, on on an integrated one")
    s.add_argument("--vram-budget", type=parse_size, metavar="SIZE",
                   help="VRAM expert cache size (default: free device memory after trunk, KV, workspace, margin)")
    add_kv_type_option(s)
    s.add_argument("--chat-template-file", type=Path, help="Jinja chat template replacing the model's")
    s.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise EngineError(f"could not use --listen {text!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise EngineError(f"could not read {what} {path}: {exc.strerror}") from None


def _check(a) -> None:
    if a.threads is not None and a.threads < 1:
        raise EngineError(f"could not use --threads {a.threads}: it must be at least 1")
    if a.prefetch < 0 or a.read_threads < 1:
        raise EngineError(f"could not use --prefetch {a.prefetch} --read-threads {a.read_threads}: "
                          "prefetch must be 0 or more and read threads at least 1")
    if a.max_queue < 0:
        raise EngineError(f"could not use --max-queue {a.max_queue}: it must be 0 or more")
    if a.top_k < 0:
        raise EngineError(f"could not use --top-k {a.top_k}: it must be 0 (every token) or more")
    if a.reasoning_budget is not None and a.reasoning_budget < 0:
        raise EngineError(f"could not use --reasoning-budget {a.reasoning_budget}: it must be 0 or more")
    a.prompt_store_bytes = parse_store_mib(a.prompt_cache_mib)
    if a.prompt_cache == "off" and a.prompt_store_bytes:
        raise EngineError(f"could not use --prompt-cache-mib {a.prompt_cache_mib} with --prompt-cache off: the "
                          "store holds the prompt cache's rows (leave it out, or turn the cache on)")
    if not Path(a.model).is_file():
        raise EngineError(f"could not open model {a.model}: no such file")


def cmd_serve(a) -> int:
    import uvicorn

    from sparkd.engine.runtime import Engine
    from sparkd.engine.server.app import EngineServer, ServerConfig
    from sparkd.engine.streaming.session import StreamOptions

    _check(a)
    host, port = parse_listen(a.listen)
    api_key = _read_text(a.api_key_file, "--api-key-file").strip() if a.api_key_file else a.api_key
    if a.api_key_file and not api_key:
        raise EngineError(f"could not use --api-key-file {a.api_key_file}: the file is empty")
    template = _read_text(a.chat_template_file, "--chat-template-file") if a.chat_template_file else None
    stream = StreamOptions(policy=a.policy, prefetch_slots=a.prefetch, threads=a.read_threads,
                           direct=not a.buffered, unified=a.unified, vram_budget_bytes=a.vram_budget)
    engine = Engine(a.model, ctx=a.ctx, budget_bytes=a.budget, chat_template=template, threads=a.threads,
                    resident=a.resident, stream=stream, log=_log, device=a.device,
                    cuda_graphs=a.cuda_graphs, prompt_graphs=a.prompt_graphs,
                    prompt_graph_margin=a.prompt_graph_margin, prompt_cache=a.prompt_cache == "on",
                    prompt_store_bytes=a.prompt_store_bytes, decode_graphs=a.decode_graphs, kv_type=a.kv_type)
    name = a.alias or Path(a.model).name.removesuffix(".gguf")
    server = EngineServer(engine, ServerConfig(name, api_key, a.reasoning_budget, a.max_queue, a.top_k))
    config = uvicorn.Config(server.app(), host=host, port=port, log_level=a.log_level, lifespan="off")
    web = uvicorn.Server(config)
    failed: list[BaseException] = []

    def load() -> None:
        bar = byte_progress(f"loading {Path(a.model).name}")
        try:
            server.load(bar)
            print(f"sparkd-engine: serving {name} on http://{host}:{port} (context {engine.n_ctx})",
                  file=sys.stderr, flush=True)
        except Exception as exc:  # /health reports it; the process exits so the supervisor sees it
            failed.append(exc)
            web.should_exit = True
        finally:
            bar(None, None)
    threading.Thread(target=load, name="sparkd-load", daemon=True).start()
    web.run()
    server.slot.close()
    engine.close()
    if failed:
        raise EngineError(str(failed[0])) if not isinstance(failed[0], EngineError) else failed[0]
    return 0


def _log(text: str) -> None:
    print(f"sparkd-engine: {text}", file=sys.stderr, flush=True)
