"""sparkd-engine: inspect, logits, generate and make-model on GGUF files."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

from sparkd.engine.errors import EngineError
from sparkd.engine.progress import byte_progress
from sparkd.engine.streaming.commands import add_commands, add_stream_options

_EXPERT_TENSOR = re.compile(r"^blk\.\d+\.ffn_(gate|up|down|gate_up)_exps\.")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.I)


def parse_size(text: str) -> int:
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"could not parse size {text!r}: use e.g. 512M, 2G, 1.5T")
    return int(float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper()))


def _group(name: str) -> str:
    if _EXPERT_TENSOR.match(name):
        return "routed_experts"
    parts = name.split(".")
    return parts[2] if parts[0] == "blk" else parts[0]


def inspect_model(path: str) -> dict:
    from sparkd.engine.gguf_file import GGUFModel
    from sparkd.engine.models import config_of

    with GGUFModel.open(path) as g:
        cfg = config_of(g)
        types: dict[str, set] = defaultdict(set)
        routed = trunk = unused = 0
        for name, info in g.tensors.items():
            types[_group(name)].add(info.ggml_type.name)
            layer = re.match(r"blk\.(\d+)\.", name)
            if layer and int(layer[1]) >= cfg.n_layer:  # NextN/MTP draft blocks: never loaded
                unused += info.nbytes
            elif _EXPERT_TENSOR.match(name):
                routed += info.nbytes
            else:
                trunk += info.nbytes
        n_moe = sum(cfg.is_moe_layer(il) for il in range(cfg.n_layer))
        return {
            "path": str(path), "arch": cfg.arch, "layers": cfg.n_layer, "moe_layers": n_moe,
            "experts": cfg.n_expert, "top_k": cfg.n_expert_used, "shared_experts": cfg.n_expert_shared,
            "context": cfg.n_ctx_train, "hidden": cfg.n_embd, "vocab": cfg.n_vocab,
            "quant_types": {k: sorted(v) for k, v in sorted(types.items())},
            "trunk_bytes": trunk, "routed_expert_bytes": routed, "unused_mtp_bytes": unused,
            "per_expert_bytes": routed // (n_moe * cfg.n_expert) if n_moe and cfg.n_expert else 0,
            "shards": len(g.shards),
        }


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def cmd_inspect(a) -> int:
    info = inspect_model(a.model)
    if a.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['path']}: {info['arch']}, {info['layers']} layers ({info['moe_layers']} MoE), "
          f"{info['experts']} experts x top-{info['top_k']}, {info['shared_experts']} shared, "
          f"context {info['context']}, hidden {info['hidden']}, vocab {info['vocab']}")
    print(f"trunk {_gib(info['trunk_bytes'])}, routed experts {_gib(info['routed_expert_bytes'])}, "
          f"per expert {_gib(info['per_expert_bytes'])}")
    for group, ts in info["quant_types"].items():
        print(f"  {group:24s} {', '.join(ts)}")
    return 0


def _tokens(a, tokenizer=None, metadata=None) -> list[int]:
    if a.tokens is not None:
        try:
            return [int(t) for t in a.tokens.replace(",", " ").split()]
        except ValueError:
            raise EngineError(f"could not parse --tokens {a.tokens!r}: give integer ids, e.g. 1,2,3") from None
    if a.text is None:
        raise EngineError("could not run the model: give a prompt with -p/--text or ids with --tokens")
    if getattr(a, "chat", False):
        from sparkd.engine.chat import ChatTemplate
        text = ChatTemplate.from_metadata(metadata, tokenizer).render(
            [{"role": "user", "content": a.text}], add_generation_prompt=True)
        return tokenizer.encode(text, add_special=False, parse_special=True)
    return tokenizer.encode(a.text)


def cmd_logits(a) -> int:
    import numpy as np
    import torch

    from sparkd.engine.cuda_graphs import use_graphs
    from sparkd.engine.models import load_model

    ids = _tokens(a) if a.tokens is not None else None  # bad ids fail before any loading
    m = load_model(a.model, device=a.device)
    try:
        # the prompt runs as one batch: graphs serve decode steps, so this only checks the model
        use_graphs(a.cuda_graphs, m.net, a.device, log=_log)
        ids = ids or _tokens(a, _tokenizer(m), m.gguf.metadata)
        bad = [t for t in ids if not 0 <= t < m.cfg.n_vocab]
        if bad:
            raise EngineError(f"could not run token ids {bad[:5]}: the vocabulary has {m.cfg.n_vocab} tokens")
        logits = m.net(torch.tensor(ids), m.net.new_cache(len(ids)))
    finally:
        m.close()
    np.save(a.out, logits.numpy())
    print(f"wrote {a.out}: logits [{len(ids)}, {logits.shape[1]}]")
    return 0


def cmd_generate(a) -> int:
    feed = _feed_tokens(a.feed_tokens, a.model) if a.feed_tokens else None  # bad lists fail before torch loads
    import torch

    from sparkd.engine.cuda_graphs import use_graphs
    from sparkd.engine.layers.kv_cache import KV_TYPES, kv_type_name
    from sparkd.engine.streaming.plan import cache_kv_type
    from sparkd.engine.prompt_chunks import chunk_tokens, room_bytes
    from sparkd.engine.prompt_graphs import prompt_forward
    from sparkd.engine.models import load_model, warm_experts
    from sparkd.engine.models.decoder import prompt_last_only
    from sparkd.engine.sampler import Sampler, SamplingParams, warm_sampler
    from sparkd.engine.streaming.commands import print_plan, stream_options
    from sparkd.engine.streaming.graph_step import decode_step
    from sparkd.engine.streaming.profile import StageProfile
    from sparkd.engine.streaming.session import open_streaming

    sm = None if a.resident else open_streaming(a.model, stream_options(a), on_plan=print_plan)
    m = load_model(a.model, device=a.device) if a.resident else sm.model
    try:
        if a.resident:  # the experts' first use (a layer dequantized at a time) outside the timed prompt
            warm_experts(m.net)
        graphs = use_graphs(a.cuda_graphs, m.net, a.device, streaming=sm is not None, log=_log)
        tok = _tokenizer(m)
        ids = _tokens(a, tok, m.gguf.metadata)
        sample = Sampler(SamplingParams(temperature=a.temp, top_k=a.top_k, top_p=a.top_p,
                                        min_p=a.min_p, seed=a.seed))
        kv_type = sm.plan.kv_type if sm else cache_kv_type(m.cfg, kv_type_name(a.kv_type, a.device))
        kv = KV_TYPES[kv_type]
        cache = m.net.new_cache(len(ids) + a.n, kv)
        step = decode_step(m.net, cache, a.device, graphs, sm is not None, a.cuda_graphs, _log)
        prompt = prompt_forward(m.net, cache, graphs, _log)
        if a.device != "cpu":  # JIT-compile the kernels (GEMM, GEMV, MoE; the linked norms') outside the timed region
            scratch = m.net.new_cache(19, kv)
            m.net(torch.tensor(ids[:1] * 2), scratch)
            m.net(torch.tensor(ids[:1]), scratch)
            # and their variants for row counts divisible by 16, which Triton compiles apart (session 32: an 8000-token
            # prompt's timed forward spent ~1.4 s compiling them)
            m.net(torch.tensor(ids[:1] * 16), scratch)
        device_draws = False
        if graphs:  # capture outside the timed region too, and the draw chains' first run
            step.prepare(len(ids) + a.n)
            prompt.prepare(len(ids))
            if a.temp > 0:  # and this request's draw graphs (a capture in the first draw otherwise; each
                # capture's warm-up is its chain's first run, which DeviceSampler.warm would repeat)
                device_draws = step.prepare_draws(sample.params, len(ids) + a.n)
        if a.temp > 0 and not device_draws:  # the host draws the first token: its ops' first use outside too
            warm_sampler(sample.params, m.net.cfg.n_vocab)
        if sm:
            batch = sm.plan.batch_tokens
        else:  # resident: whole where the memory left holds the prompt's workspace (prompt_chunks.py)
            batch = a.batch_tokens or chunk_tokens(m.cfg, 0, len(ids), room_bytes(a.device, a.budget),
                                                   a.device != "cpu")
        last = prompt_last_only()
        t0 = time.perf_counter()
        for i in range(0, len(ids), batch):  # a long prompt in chunks the plan's workspace holds
            logits = prompt(torch.tensor(ids[i:i + batch]), last=last)
        t1 = time.perf_counter()
        before = sm.store.snapshot() if sm else {}
        prof = StageProfile(m.net, step) if sm else None
        limit = a.n if feed is None else min(a.n, len(feed))
        out, agreed, eog = _decode(step, sample, logits, ids, limit, feed, tok.eog_ids, sm.store if sm else None)
        t2 = time.perf_counter()
        res = {"text": tok.decode(out), "tokens": out, "prompt_tokens": len(ids),
               "prompt_tok_s": len(ids) / (t1 - t0), "decode_tok_s": len(out) / (t2 - t1) if out else 0.0,
               "kv_type": kv_type, "cache_bytes": cache.nbytes, "decode_step": _step_kind(step)}
        if feed is not None:
            res["feed"] = {"path": a.feed_tokens, "listed": len(feed), "fed": len(out), "agreed": agreed,
                           "stopped": _feed_stop(eog, len(out), len(feed), a.n)}
        if sm:
            res["stream"] = _decode_stats(before, sm.store.snapshot(), prof.report(
                sm.store.stats.wait_seconds - before["wait_seconds"]), sm.plan)
            prof.remove()
    finally:
        (sm or m).close()
    _print_generated(res, a.json)
    return 0


def _decode(step, sample, logits, prompt: list[int], limit: int, feed: list[int] | None, eog_ids,
            store) -> tuple[list[int], int, bool]:
    """Up to `limit` tokens after the prompt's `logits`: each step's pick (on the device where the
    step can: one int back), or feed's next id in its place (the pick is made either way: the same
    timed work). Returns (the tokens, how many picks equal them, whether an end-of-generation token
    stopped it); store (streaming) counts the tokens."""
    drawing = step.begin_sampling(sample.params, prompt)  # temperature: drawn on the GPU (graph step)
    on_device = drawing or (step.device_argmax and sample.plain_argmax)
    if on_device and store is None and step.pipeline:
        return _decode_pipelined(step, sample, logits, prompt, limit, feed, eog_ids)
    out: list[int] = []
    agreed, picked = 0, None
    while len(out) < limit:
        pick = picked if picked is not None else step.pick_from(logits[-1], sample, prompt + out)
        nxt = pick if feed is None else feed[len(out)]
        agreed += pick == nxt
        out.append(nxt)
        if nxt in eog_ids:
            return out, agreed, True
        if on_device:
            picked = step.next_token(nxt)
        else:
            logits = step(nxt)
        if store is not None:
            store.note_tokens(1)
    return out, agreed, False


def _decode_pipelined(step, sample, logits, prompt: list[int], limit: int, feed: list[int] | None,
                      eog_ids) -> tuple[list[int], int, bool]:
    """_decode's loop with the step of each next token launched before the host reads the pick
    before it (StaticDecode.launch: fed that pick on the device, or feed's next id): the same
    tokens, picks and n_past. Only an end-of-generation token makes a step launched ahead wrong:
    dropped then. The last step's pick is read too, so the time covers every step. Engine._pipelined
    runs the same protocol (kept as two loops: its reasoning budget, cancel, context end and claimed
    rows fall between the pick and the launches, where a shared helper would need callbacks)."""
    out: list[int] = []
    agreed = ahead = 0  # ahead: the number of the next token's step where it is launched
    while len(out) < limit:
        pick = step.pick() if out else step.pick_from(logits[-1], sample, prompt)
        nxt = pick if feed is None else feed[len(out)]
        agreed += pick == nxt
        out.append(nxt)
        if nxt in eog_ids:
            if ahead:
                step.drop(ahead)
            return out, agreed, True
        if not ahead:  # the first token
            step.launch(nxt)
        ahead = step.launch(None if feed is None else feed[len(out)]) if len(out) < limit else 0
    if out:
        step.pick()
    return out, agreed, False


def _feed_stop(eog: bool, fed: int, listed: int, n: int) -> str:
    """Why a fed run stopped (_STOPS' keys)."""
    if eog:
        return "eog"
    if fed < listed:
        return "n"
    return "feed_end" if listed < n else "n_and_feed_end"


def _step_kind(step) -> str:
    """generate --json's decode_step: how each token ran. "graphs" (the whole step as CUDA graphs; a bucket whose
    capture failed runs the same static step eagerly, logged), "segments" (a streamed model's graphs between MoE
    layers, the MoE kernels inside them), "segments-eager-experts" (the MoE kernels launched between them), "eager"."""
    from sparkd.engine.cuda_graphs import StaticDecode
    from sparkd.engine.streaming.graph_step import SegmentDecode

    if isinstance(step, StaticDecode):
        return "graphs"
    if isinstance(step, SegmentDecode):
        return "segments" if step.experts else "segments-eager-experts"
    return "eager"


def _print_generated(res: dict, as_json: bool) -> None:
    """generate's result: one JSON object, or the text and its speeds (stream and feed lines to stderr)."""
    print(json.dumps(res) if as_json else
          f"{res['text']}\nprompt {res['prompt_tok_s']:.1f} tok/s, decode {res['decode_tok_s']:.1f} tok/s")
    if as_json:
        return
    if "feed" in res:
        fd = res["feed"]
        print(f"fed {fd['fed']} of {fd['listed']} listed tokens from {fd['path']} (stopped: "
              f"{_STOPS[fd['stopped']]}); {fd['agreed']} of the picks agreed", file=sys.stderr)
    if "stream" in res:
        st = res["stream"]
        print(f"decode: {st['bytes_per_token'] / 2**20:.2f} MiB/token read, hit rate {st['hit_rate']:.3f}, "
              f"retention {st['retention']:.3f}, {st['bandwidth_bytes_per_second'] / 1e9:.2f} GB/s while "
              f"reads were outstanding", file=sys.stderr)
        if "vram_hits" in st:
            print(f"vram: hit rate {st['vram_hit_rate']:.3f} ({st['vram_hits']} of {st['vram_requests']}), "
                  f"{st['vram_admissions']} admitted, {st['vram_copies_overlapped']} copies overlapped, "
                  f"{st['vram_bytes_copied'] / 2**20:.1f} MiB copied", file=sys.stderr)


_STOPS = {"n": "-n reached", "feed_end": "end of the list", "n_and_feed_end": "-n reached, the list's end too",
          "eog": "an end-of-generation token"}


def _feed_tokens(path: str, model: str) -> list[int]:
    """--feed-tokens: a JSON list of token ids (or {"tokens": [...]}, an earlier --json output),
    each checked against the model's vocabulary (read from the GGUF header alone)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise EngineError(f"could not read --feed-tokens {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise EngineError(f"could not parse --feed-tokens {path} as JSON: {exc}") from None
    if isinstance(data, dict) and "tokens" in data:
        data = data["tokens"]
    if not isinstance(data, list) or not data or not all(type(t) is int for t in data):
        raise EngineError(f"could not use --feed-tokens {path}: expected a non-empty JSON list of integer "
                          "token ids, e.g. [1, 2, 3] (or an earlier --json output's object with \"tokens\")")
    # imported here, not above: sparkd.engine.models loads torch (seconds), which a bad list needn't wait for
    from sparkd.engine.gguf_file import GGUFModel
    from sparkd.engine.models import config_of

    with GGUFModel.open(model) as g:
        n_vocab = config_of(g).n_vocab
    bad = [t for t in data if not 0 <= t < n_vocab]
    if bad:
        raise EngineError(f"could not feed token ids {bad[:5]} from {path}: the vocabulary has {n_vocab} tokens")
    return data


def _decode_stats(before: dict, after: dict, profile: dict, plan) -> dict:
    """Cache statistics of the decode phase alone (the prompt's reads subtracted)."""
    keys = ("requests", "hits", "misses", "evictions", "bytes_read", "read_seconds", "wait_seconds",
            "tokens", "prefetch_predicted", "prefetch_useful", "prefetch_wasted")
    d = {k: after[k] - before[k] for k in keys}
    d["retention"] = 1.0 - d["evictions"] / d["requests"] if d["requests"] else 1.0
    d["hit_rate"] = d["hits"] / d["requests"] if d["requests"] else 0.0
    d["bytes_per_token"] = d["bytes_read"] / d["tokens"] if d["tokens"] else 0.0
    d["bandwidth_bytes_per_second"] = d["bytes_read"] / d["read_seconds"] if d["read_seconds"] else 0.0
    d.update(profile=profile, policy=after["policy"], direct_io=after["direct_io"],
             cache_slots=plan.cache_slots, slot_bytes=plan.slot_bytes)
    vram = [k for k in after if k.startswith("vram_") and k not in ("vram_hit_rate", "vram_slots", "vram_cached")]
    if vram:  # the VRAM expert cache's counters over the decode phase
        d.update({k: after[k] - before[k] for k in vram}, vram_slots=after["vram_slots"],
                 vram_cached=after["vram_cached"])
        d["vram_hit_rate"] = d["vram_hits"] / d["vram_requests"] if d["vram_requests"] else 0.0
    return d


def _tokenizer(m):
    from sparkd.engine.tokenizer import Tokenizer

    return Tokenizer(m.gguf.metadata, str(m.gguf.path))


def cmd_make_model(a) -> int:
    from sparkd.engine import make_model as mm
    from sparkd.engine.modelgen.specs import DENSE_ARCHS, PRESETS, TINY

    if a.preset:
        if a.preset not in PRESETS:
            raise EngineError(f"could not find preset {a.preset!r}: choose one of {', '.join(PRESETS)}")
        shape = PRESETS[a.preset]
        if a.arch and a.arch != shape.arch:
            raise EngineError(f"could not combine --arch {a.arch} with preset {a.preset} ({shape.arch})")
    elif a.arch in TINY:
        shape = TINY[a.arch]
    else:
        raise EngineError(f"could not make a model for --arch {a.arch!r}: choose one of {', '.join(TINY)}"
                          " or a --preset")
    ffn_field = "n_ff" if shape.arch in DENSE_ARCHS else "n_ff_exp"  # --ffn: the FFN that dominates
    shape = shape.replace(n_layer=a.layers, n_expert=a.experts, n_expert_used=a.top_k,
                          n_expert_shared=a.shared, n_embd=a.hidden, n_head=a.heads,
                          n_vocab=a.vocab, n_ctx=a.ctx, **{ffn_field: a.ffn})
    types = [_tensor_type(t) for t in a.tensor_type or []]
    try:
        if a.size:
            shape = shape.replace(n_layer=mm.layers_for_size(shape, a.quant, a.size, types, a.sparse))
        plan = mm.plan(shape, a.quant, types, a.sparse)
    except ValueError as exc:
        raise EngineError(str(exc)) from None
    out = Path(a.out)
    if out.exists() and not a.force:
        raise EngineError(f"could not write {out}: the file exists (use --force to replace it)")
    if not out.parent.is_dir():
        raise EngineError(f"could not write {out}: the folder {out.parent} does not exist (create it first)")
    bar = byte_progress("writing", plan.nbytes, quiet=a.quiet)
    paths = mm.write_model(out, plan, seed=a.seed, split_max_bytes=a.split_max_size or 0, progress=bar,
                           sparse=a.sparse)
    bar(None, None)
    print(f"wrote {', '.join(map(str, paths))}: {shape.arch}, {shape.n_layer} layers, {a.quant}, "
          f"{_gib(plan.nbytes)}{' (sparse: header only, data are holes)' if a.sparse else ''}")
    return 0


def _tensor_type(text: str) -> tuple[str, str]:
    pattern, sep, qtype = text.rpartition("=")
    if not sep or not pattern or not qtype:
        raise EngineError(f"could not read --tensor-type {text!r}: expected REGEX=TYPE, e.g. 'ffn_down_exps=Q4_K'")
    return pattern, qtype.upper()


def add_graphs_option(s: argparse.ArgumentParser) -> None:
    s.add_argument("--cuda-graphs", choices=["auto", "on", "off"], default="auto",
                   help="capture the decode step as CUDA graphs: auto = with --device cuda when every layer "
                        "can be captured and experts are resident (else eager, reason logged); on = refuse "
                        "a model that cannot; off = eager")


def _log(text: str) -> None:
    print(f"sparkd-engine: {text}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sparkd-engine", description="GGUF MoE engine")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("inspect", help="summarise a GGUF model")
    s.add_argument("model")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_inspect)
    for name, func, help_ in (("logits", cmd_logits, "per-position logits to .npy"),
                              ("generate", cmd_generate, "decode tokens")):
        s = sub.add_parser(name, help=help_)
        s.add_argument("model")
        s.add_argument("--tokens", help="comma/space separated token ids")
        s.add_argument("--text", "-p", dest="text")
        s.set_defaults(func=func)
        if name == "logits":
            s.add_argument("--out", required=True)
        else:
            s.add_argument("-n", type=int, default=32)
            s.add_argument("--json", action="store_true")
            s.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
            s.add_argument("--temp", type=float, default=0.0)
            s.add_argument("--top-k", type=int, default=0)
            s.add_argument("--top-p", type=float, default=1.0)
            s.add_argument("--min-p", type=float, default=0.0)
            s.add_argument("--seed", type=int)
            s.add_argument("--resident", action="store_true", help="all experts in memory, no streaming")
            s.add_argument("--feed-tokens", metavar="FILE",
                           help="JSON list of token ids (or an earlier --json output, its \"tokens\"): each "
                                "decode step feeds the next listed id instead of its pick (the pick is still "
                                "made); stops after -n tokens or the list's end, whichever comes first. For "
                                "benchmarks whose continuation must not depend on numerics")
            add_stream_options(s, parse_size)
        s.add_argument("--device", default="cpu", help="cpu, or cuda: weights stay GGUF blocks in GPU "
                                                      "memory, multiplied by the Triton kernels")
        add_graphs_option(s)
    add_commands(sub, parse_size)
    s = sub.add_parser("make-model", help="write a random-weight GGUF")
    s.add_argument("out")
    s.add_argument("--arch")
    s.add_argument("--preset")
    for opt in ("layers", "experts", "top-k", "shared", "hidden", "ffn", "heads", "vocab", "ctx"):
        s.add_argument(f"--{opt}", type=int)
    s.add_argument("--quant", default="Q8_0")
    s.add_argument("--size", type=parse_size, help="scale the layer count to about this file size")
    s.add_argument("--split-max-size", type=parse_size)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--force", action="store_true")
    s.add_argument("--quiet", action="store_true")
    s.add_argument("--tensor-type", action="append", metavar="REGEX=TYPE",
                   help="type for the weights whose name matches REGEX (first match wins; repeatable)")
    s.add_argument("--sparse", action="store_true",
                   help="header and tensor table only, data left as holes: for plan/inspect of huge shapes")
    s.set_defaults(func=cmd_make_model)
    from sparkd.engine.server.serve import add_arguments, cmd_serve
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    add_arguments(s, parse_size)
    s.set_defaults(func=cmd_serve)
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        return a.func(a)
    except EngineError as exc:
        print(f"sparkd-engine: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
