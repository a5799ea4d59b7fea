"""One paged-attention step for the backend tests: requests with cached tokens in blocks of
their own, the step's new tokens, and a cache of random rows; a backend's forward over it with a
layer's attention features, and the features' dense reference."""

import torch

from lab.attention.base import AttentionInputs


def paged_step(num_computed: list[int], query_lens: list[int], hkv: int = 2, group: int = 2,
               d: int = 8, block_size: int = 4, dtype=torch.float32, padding: bool = True):
    """(inputs, q, k, v, cache) of one step: request i holds num_computed[i] tokens in blocks
    1 + 3i .. 3 + 3i (room for 3 blocks) and adds query_lens[i]; with `padding`, one padding
    token (slot -1) follows the real ones."""
    torch.manual_seed(0)
    bs = block_size
    tables = [[1 + 3 * i, 2 + 3 * i, 3 + 3 * i] for i in range(len(query_lens))]
    slots = [tables[i][p // bs] * bs + p % bs
             for i, (c, n) in enumerate(zip(num_computed, query_lens)) for p in range(c, c + n)]
    seq_lens = [c + n for c, n in zip(num_computed, query_lens)]
    t = sum(query_lens)
    inputs = AttentionInputs(
        query_start_loc=torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()],
                                     dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_computed_tokens=torch.tensor(num_computed, dtype=torch.int32),
        block_table=torch.tensor(tables, dtype=torch.int32),
        slot_mapping=torch.tensor(slots + [-1] * padding, dtype=torch.long),
        num_reqs=len(query_lens), num_actual_tokens=t, max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), block_size=bs, query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens)
    rows = t + padding
    q = torch.randn(rows, hkv * group, d, dtype=dtype)
    k, v = torch.randn(rows, hkv, d, dtype=dtype), torch.randn(rows, hkv, d, dtype=dtype)
    cache = torch.randn(2, 3 * len(query_lens) + 1, bs, hkv, d, dtype=dtype)
    return inputs, q, k, v, cache


def dense_step(step, scale: float, window: int | None = None, sinks: torch.Tensor | None = None,
               softcap: float | None = None) -> torch.Tensor:
    """The step's attention output [T, H, D] in float64, computed densely per request and apart
    from any backend: request i's keys are its cached rows (read from the step's cache as
    paged_step made it, through the block table) followed by its new k / v; query row r at
    position p sees key j iff j <= p and p - j < window; scores q.k * scale, soft-capped
    (softcap * tanh(s / softcap)) before the mask; each head's sink logit joins the softmax as
    one more column with no value. Padding rows are zero."""
    inputs, q, k, v, cache = step
    bs = inputs.block_size
    g = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    starts = inputs.query_start_loc.tolist()
    for i, (c, n) in enumerate(zip(inputs.num_computed_tokens.tolist(), inputs.query_lens_cpu)):
        pos = torch.arange(c)
        blocks = inputs.block_table[i].long()[pos // bs]
        t0 = starts[i]
        keys = torch.cat((cache[0, blocks, pos % bs], k[t0:t0 + n])).double()
        vals = torch.cat((cache[1, blocks, pos % bs], v[t0:t0 + n])).double()
        keys, vals = keys.repeat_interleave(g, 1), vals.repeat_interleave(g, 1)  # [L, H, D]
        scores = torch.einsum("qhd,khd->hqk", q[t0:t0 + n].double(), keys) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        qpos = (c + torch.arange(n))[:, None]
        kpos = torch.arange(c + n)[None, :]
        seen = kpos <= qpos
        if window is not None:
            seen &= qpos - kpos < window
        scores = scores.masked_fill(~seen, float("-inf"))
        if sinks is not None:
            sink = sinks.double()[:, None, None].expand(-1, n, 1)
            probs = torch.cat((scores, sink), -1).softmax(-1)[..., :-1]
        else:
            probs = scores.softmax(-1)
        out[t0:t0 + n] = torch.einsum("hqk,khd->qhd", probs, vals)
    return out


def sink_logits(num_heads: int) -> torch.Tensor:
    """Sink logits around the scores' size, one per query head (some well above, some below)."""
    return torch.linspace(-2.0, 3.0, num_heads)


def run_features(backend, step, window=None, sinks=None, softcap=None):
    """backend.forward over a copy of the step's cache (scale head_dim ** -0.5) with a layer's
    features, passing only those it uses as a layer does -> (out, cache)."""
    inputs, q, k, v, cache = step
    cache = cache.clone()
    kw = {name: value for name, value in (("sliding_window", window), ("sinks", sinks),
                                          ("softcap", softcap)) if value is not None}
    return backend.forward(0, q, k, v, cache, backend.build_metadata(inputs),
                           q.shape[-1] ** -0.5, **kw), cache
