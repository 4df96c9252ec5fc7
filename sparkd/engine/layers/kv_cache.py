"""Per-layer key/value cache, preallocated for max_ctx positions of one sequence.

A layer's value part may be empty (v_dim 0): MLA caches only the compressed latent (plus the rope
key part) and reads its values from the same rows. Side rows are per-position state beyond K/V that
some layers keep (glm-dsa's indexer keys), named (name, layer) with a row shape. Recurrent layers
(linear attention) keep a fixed-size state per sequence instead: `state[il]`, a list of
zero-initialised tensors, so a new cache is a new sequence.

Static decode (a CUDA graph's fixed shapes, sparkd/engine/cuda_graphs.py): with `span` set, a layer
writes its rows at device positions and attends over rows [0, span) masked by position
(`append`), and rope angles come from a table of every position (`rope`): no host value per
token, so one captured step replays for every position below span.

An eager one-token step may use the static step's decode kernels too (`decode_rows`): its host
position goes to the device once per step, and attention reads up to it (the kernels stop there).

Sliding-window layers (gpt-oss, Gemma 3: `windows`) read only the last `window` positions, so such a layer's rows
are a ring of window + RING_SLACK rows (when that is less than max_ctx): position p's row is ring row p % rows, as
llama.cpp's SWA cache keeps n_swa + n_ubatch cells. Gemma 3 27B at 131072 positions: 66.6 -> 11.6 GB of f16 rows
(52 of its 62 layers windowed at 1024). The decode kernels address the ring themselves (their RING argument); a
prompt reads the ring's rows of its window then its own, and writes its last rows (`ring_append`). The slack past
the window is what lets the cache go back (`rewind_limit`): a padded prompt graph writes its padding past the
prompt, a pipelined decode step one row ahead, and a new request may keep a shorter prefix; none of those may
overwrite a row a later query reads.

The rows' type (`kv_dtype`, --kv-type): the keys and values of layers with values (GQA attention), and the
latent rows of the layers a model names in `typed` (MLA's, session 31), may be float16, as llama.cpp's default
cache: half the bytes to hold and, in the decode kernels, to read. A row is rounded once, when it is written;
every reader (the kernels, attend, SDPA) computes in float32 from the rounded row. Other rows without values,
side rows and recurrent state stay in the cache's dtype (float32).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from sparkd.engine.errors import EngineError
from sparkd.engine.layers.rope import RopeConfig, rope_cos_sin

KV_TYPES = {"f32": torch.float32, "f16": torch.float16}  # --kv-type's choices besides "auto"
# A windowed layer's ring holds RING_SLACK rows past its window; n_past may go back REWIND_ROWS of them. The rest
# covers the rows written past n_past: a padded prompt graph's padding (less than a quarter of its bucket, so under
# 256 rows up to prompt_graphs.PROMPT_LAST; tests/engine/test_swa_ring.py checks it) and a pipelined step's one row
RING_SLACK = 1024
REWIND_ROWS = 512


def ring_rows(window: int, max_ctx: int) -> int:
    """The rows of a layer's ring for a sliding window (0: no window, or a ring no smaller than the context: the
    layer keeps a row per position)."""
    rows = window + RING_SLACK
    return rows if window > 0 and rows < max_ctx else 0


def kv_type_name(choice: str, device: str | torch.device) -> str:
    """--kv-type resolved to a KV_TYPES name: "auto" is f16 on CUDA (the decode kernels read half the bytes;
    docs/performance.md, session 30) and f32 on the CPU (the reference path reads its rows as they are)."""
    if choice == "auto":
        return "f16" if torch.device(device).type == "cuda" else "f32"
    if choice not in KV_TYPES:
        raise EngineError(f"could not use --kv-type {choice!r}: choose auto, {', '.join(KV_TYPES)}")
    return choice


class KVCache:
    def __init__(self, max_ctx: int, shapes: list[tuple[int, int, int]], dtype=torch.float32,
                 side: dict[tuple[str, int], tuple[int, ...]] | None = None, device: torch.device | str = "cpu",
                 state_shapes: dict[int, list[tuple[int, ...]]] | None = None,
                 rope_tables: dict | None = None, kv_dtype: torch.dtype | None = None,
                 typed: list[bool] | None = None, windows: list[int] | None = None):
        # shapes[il] = (n_kv_heads, k_dim, v_dim); state_shapes[il] = shapes of a recurrent layer's state;
        # rope_tables: rope_table's tables shared with the model's other caches (Decoder.new_cache), read only;
        # kv_dtype: the rows of the typed layers (None: dtype); typed[il]: whether layer il's rows take it
        # (None: the layers with values); windows[il]: layer il's sliding window (0 or None: none), its rows a ring
        self.max_ctx = max_ctx
        self.device = torch.device(device)
        typed = typed or [dv > 0 for _, _, dv in shapes]
        row = [(kv_dtype or dtype) if t else dtype for t in typed]
        self.windows = windows or [0] * len(shapes)
        self.ring = [ring_rows(w, max_ctx) if dv else 0 for w, (_, _, dv) in zip(self.windows, shapes)]
        n = [r or max_ctx for r in self.ring]
        self.k = [torch.zeros(c, h, dk, dtype=t, device=device) for c, (h, dk, _), t in zip(n, shapes, row)]
        self.v = [torch.zeros(c, h, dv, dtype=t, device=device) if dv else None
                  for c, (h, _, dv), t in zip(n, shapes, row)]
        self.side = {key: torch.zeros(max_ctx, *row, dtype=dtype, device=device) for key, row in (side or {}).items()}
        self.scratch: dict[str, torch.Tensor | None] = {}  # handed from layer to layer in one forward pass
        self.masks: dict | None = None  # a forward's attention masks (attention.forward_mask), set by Decoder.run
        self.state = {il: [torch.zeros(sh, dtype=dtype, device=device) for sh in shs]
                      for il, shs in (state_shapes or {}).items()}
        self.n_past = 0  # positions filled; advanced by the model after all layers ran
        self.span: int | None = None  # static decode: rows attention reads; None: [0, n_past + T)
        self._rope: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {} if rope_tables is None else rope_tables
        self._step_pos: torch.Tensor | None = None  # an eager step's position on the device
        self._step_at = -1  # the position it holds

    @property
    def rewind_limit(self) -> int | None:
        """How many positions n_past may go back (the rows past it are then rewritten before they are read): any
        (None), REWIND_ROWS where a layer's rows are a ring (older rows are gone), none (0) with recurrent state,
        which holds every position folded in."""
        if self.state:
            return 0
        return REWIND_ROWS if any(self.ring) else None

    @contextmanager
    def state_kept(self):
        """The recurrent state put back after the block: a graph capture's warm-up step folds its token into
        Kimi K3's KDA state, and the replay after it folds the token in again (rows are rewritten the same)."""
        held = [t.clone() for ts in self.state.values() for t in ts]
        try:
            yield
        finally:
            for t, was in zip((t for ts in self.state.values() for t in ts), held):
                t.copy_(was)

    def reset(self) -> None:
        """An empty sequence: n_past 0 and the recurrent state back to zeros (rows need no clearing)."""
        self.n_past = 0
        for tensors in self.state.values():
            for t in tensors:
                t.zero_()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.position_rows() + self.sequence_state())

    def position_rows(self) -> list[torch.Tensor]:
        """The tensors whose row p is position p's: K, V (but rings), side rows."""
        return [t for t, r in zip(self.k + self.v, self.ring * 2) if t is not None and not r] + list(self.side.values())

    def sequence_state(self) -> list[torch.Tensor]:
        """The state of the whole sequence so far (recurrent layers', the rings' rows): that of position n_past
        only (a ring's: of the positions within rewind_limit of it too)."""
        rings = [t for t, r in zip(self.k + self.v, self.ring * 2) if t is not None and r]
        return [t for ts in self.state.values() for t in ts] + rings

    def prefix_state(self, n: int) -> list[torch.Tensor]:
        """The part of the sequence state that positions [0, n) need: here all of it."""
        return self.sequence_state()

    def prefix_bytes(self, n: int) -> int:
        """What snapshot(n) copies."""
        return sum(t[:n].nbytes for t in self.position_rows()) + sum(t.nbytes for t in self.prefix_state(n))

    def snapshot(self, n: int) -> list[torch.Tensor]:
        """Copies (on this cache's device) of positions [0, n)'s rows and of prefix_state(n), which
        is position n's only when n == n_past (the prompt store's rule, prompt_store.py)."""
        return [t[:n].clone() for t in self.position_rows()] + [t.clone() for t in self.prefix_state(n)]

    def restore(self, saved: list[torch.Tensor], start: int, n: int) -> None:
        """A snapshot's positions [start, n) and its state back, n_past = n (rows before start hold the
        same tokens already). In place: CUDA graphs hold these tensors' addresses."""
        rows = self.position_rows()
        for t, s in zip(rows, saved):
            t[start:n].copy_(s[start:n])
        for t, s in zip(self.prefix_state(n), saved[len(rows):], strict=True):
            t.copy_(s)
        self.n_past = n

    def update(self, il: int, start: int, k: torch.Tensor, v: torch.Tensor | None):
        """Write rows [start, start+T) and return views of rows [0, start+T)."""
        end = self._end(start, k.shape[0])
        self.k[il][start:end] = k  # (rounded to the rows' type, as every write)
        if v is not None:
            self.v[il][start:end] = v
        v_all = None if self.v[il] is None else self.v[il][:end]
        return self.k[il][:end], v_all

    def append(self, il: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None):
        """Write a step's rows at positions pos [T] → (keys, values, start) for attend: rows
        [0, start + T) and start = pos[0] (a host int); in static decode rows [0, span), written
        by index, and start = pos itself (the device positions attend masks by)."""
        if self.span is None:
            start = int(pos[0])
            return *self.update(il, start, k, v), start
        self.k[il].index_copy_(0, pos, k.to(self.k[il].dtype))
        if v is not None:
            self.v[il].index_copy_(0, pos, v.to(self.v[il].dtype))
        v_all = None if self.v[il] is None else self.v[il][:self.span]
        return self.k[il][:self.span], v_all, pos

    def ring_append(self, il: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """append for a ring layer → (keys, values, start, key positions): the rows a step's queries at positions
        pos [T] read, the ring's then the step's own (rounded to the rows' type), and the step's last rows (at
        most the ring's) written into their ring rows after. Eagerly (a host start) the ring's rows of the
        window before start, in order: rows [0, L + T) are positions [start - L, start + T), start = L, key
        positions None (attend's layout). In static decode every ring row, start = pos (the device positions) and
        key positions [R + T] on the device: ring row s holds the last position before pos[0] that is s modulo R
        (negative: none yet), given what rewind_limit allows."""
        R, T = self.ring[il], k.shape[0]
        ring_k, ring_v = self.k[il], self.v[il]
        k, v = k.to(ring_k.dtype), v.to(ring_v.dtype)
        if self.span is None:
            start = int(pos[0])
            self._end(start, T)  # past the context: the clear error
            n = min(start, self.windows[il] - 1)  # the rows before start the window holds
            held = torch.arange(start - n, start, device=ring_k.device) % R
            keys, values = torch.cat([ring_k[held], k]), torch.cat([ring_v[held], v])
            own, start, key_pos = torch.arange(start, start + T, device=ring_k.device), n, None
        else:
            key_pos = torch.cat([self.ring_keys(il, pos[:1] - 1), pos])
            keys, values, own, start = torch.cat([ring_k, k]), torch.cat([ring_v, v]), pos, pos
        m = min(T, R)
        ring_k.index_copy_(0, own[-m:] % R, k[-m:])
        ring_v.index_copy_(0, own[-m:] % R, v[-m:])
        return keys, values, start, key_pos

    def ring_keys(self, il: int, last: torch.Tensor) -> torch.Tensor:
        """The positions [R] of ring layer il's rows with position last [1] (on the device) the last written: row s
        the last one up to it that is s modulo R (negative: none yet), given what rewind_limit allows."""
        R = self.ring[il]
        return last - (last - torch.arange(R, device=last.device)) % R

    def decode_rows(self, il: int, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """A one-token step's (keys, values, position [1] on the device) for the decode kernels:
        rows [0, span) and pos itself in static decode; every row of an eager step (the kernels
        read rows up to the position only; a fixed length keeps Triton from specializing the
        kernel anew as the length crosses multiples of 16), its host position written to one
        device tensor by the step's first layer. A ring layer's: its every ring row whatever the span (the kernels'
        RING; a bucket shorter than the ring would cut rows holding the window off)."""
        if self.span is not None:
            end = self.span
        else:
            start = int(pos[0])
            self._end(start, 1)  # past the context: the clear error
            end = self.max_ctx
            if self._step_pos is None:
                self._step_pos = torch.zeros(1, dtype=torch.long, device=self.device)
            if self._step_at != start:
                self._step_pos.fill_(start)  # queued on the stream: no wait for the device
                self._step_at = start
            pos = self._step_pos
        if self.ring[il]:
            end = None
        v = None if self.v[il] is None else self.v[il][:end]
        return self.k[il][:end], v, pos

    def rope(self, cfg: RopeConfig, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, n_rot/2] at positions pos, rows of a table of all max_ctx positions made
        once by rope_cos_sin on the host and kept on the cache's device: the same bits as calling
        it per step (each position's angles are computed alone), without a host loop and two
        host-to-device copies per layer and token. Eager positions are a host range (sliced);
        static decode's are on the device (picked there)."""
        cos, sin = self.rope_table(cfg)
        if self.span is None:
            start = int(pos[0])
            end = self._end(start, pos.shape[0])  # past the context: the clear error, not a short slice
            return cos[start:end], sin[start:end]
        return cos.index_select(0, pos), sin.index_select(0, pos)

    def rope_table(self, cfg: RopeConfig) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [max_ctx, n_rot/2] of every position (see rope), made on first use (of any cache
        sharing the tables: a prompt's cache otherwise spent ~9 ms of host sin/cos at 512 positions)."""
        key = (cfg, self.max_ctx, self.device)
        if key not in self._rope:
            cos, sin = rope_cos_sin(cfg, torch.arange(self.max_ctx, device="cpu"))  # host arithmetic
            self._rope[key] = (cos.to(self.device), sin.to(self.device))
        return self._rope[key]

    def append_side(self, name: str, il: int, pos: torch.Tensor,
                    rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write side rows of (name, il) at positions pos [T] → (rows [0, start + T), the positions on the rows'
        device) with start = pos[0] a host int; in static decode (rows [0, span), written by index, and pos)."""
        buf = self.side[name, il]
        if self.span is None:
            start = int(pos[0])
            end = self._end(start, rows.shape[0])
            buf[start:end] = rows
            return buf[:end], torch.arange(start, end, device=rows.device)
        buf.index_copy_(0, pos, rows.to(buf.dtype))
        return buf[:self.span], pos

    def _end(self, start: int, n: int) -> int:
        end = start + n
        if end > self.max_ctx:
            raise EngineError(f"could not extend the KV cache to {end} positions: "
                              f"context is {self.max_ctx} (raise --ctx)")
        return end
