"""`attention=torch`: the paged reference backend in plain PyTorch (CPU and CUDA).

Cache layout per layer (PagedKVBackend): (2, num_blocks, block_size, num_kv_heads, head_dim).
Token t of the step is written at block slot_mapping[t] // block_size, offset
slot_mapping[t] % block_size; slot -1 (padding) is skipped.

Attention runs over a padded [B, max_query_len] view of the ragged batch. For request b with
c = num_computed[b] cached tokens and q = query_len[b] new ones, query row i sits at position c + i
and may attend to key j iff j <= c + i (causal; keys 0..c-1 come from the cache through the block
table):

    keys:    | 0 ........ c-1 | c ........ c+q-1 |   (j >= seq_len[b] is padding, masked)
    query i:                  ^ position c+i sees keys [0, c+i]

MLA (kind "mla", lab/attention/mla.py) is the reference too: the latent cache holds one row
| kv_c | k_pe | per token; `forward_mla` writes the step's rows, gathers each request's rows the
same way, expands them with kv_b_proj into per-head k = | k_nope | k_pe | and v (as transformers
does), and attends with the same mask.

fp8 cache (`cache.dtype=fp8`, scheme in lab/kernels/fp8_kv.py): writes store
fp8(clamp(x / scale, +-448)) with the layer's scales (`quantize_kv_ref`), reads gather the fp8
rows and dequantize them (q_fp8 * scale, in fp32, then the query's dtype) before attending: the
definition the Triton kernels are checked against.

CUDA graphs: NEVER on CUDA — its metadata derives the mask and the block indices when it is
built (not replay-safe, see base.py) and, over the runner's static block table, would gather
max_model_len keys for every row. On the CPU it declares UNIFORM_DECODE: nothing is captured
there, the runner's padded decode path runs eagerly (metadata built each step), and this
reference is what that path is checked with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from lab.attention.base import (
    AttentionInputs,
    CudaGraphSupport,
    PagedKVBackend,
    layer_kv_scales,
)
from lab.attention.mla import MLAAttentionMixin, MLAWeights
from lab.attention.spec import ATTENTION_FEATURES
from lab.kernels.fp8_kv import FP8_KV_DTYPE, dequantize_kv_ref, quantize_kv_ref
from lab.kernels.mla_cache_write import write_latent_cache_ref


@dataclass
class TorchAttentionMetadata:
    """Index tensors shared by every layer of one step."""

    inputs: AttentionInputs
    token_req: torch.Tensor  # [T] request index of each token
    token_row: torch.Tensor  # [T] index of each token within its request's new tokens
    blocks: torch.Tensor  # [B * nblk] the block table, flattened (whole blocks are gathered)
    mask: torch.Tensor  # [B, 1, Q, nblk * block_size] True where query row i may attend key j
    # the KV write, once per step for every layer: the tokens with a slot (None: all of the
    # first num_actual_tokens) and their slots
    write_rows: torch.Tensor | None
    write_slots: torch.Tensor
    kv_blocks: torch.Tensor | None = None  # [2 * B * nblk] blocks, then blocks + num_blocks
    # [B, 1, Q, 1]: each query row's position (a decode's is seq_len - 1)
    query_pos: torch.Tensor | None = None
    # per (sliding window or None): the mask narrowed to the window; per (window, dtype): as bias
    masks: dict = field(default_factory=dict)
    biases: dict = field(default_factory=dict)

    def window_mask(self, window: int | None) -> torch.Tensor:
        """The step's mask, narrowed for a layer with a sliding window (keys j > i - window),
        made once per step and window."""
        if window is None:
            return self.mask
        if window not in self.masks:
            keys = torch.arange(self.mask.shape[-1], device=self.mask.device)
            self.masks[window] = self.mask & (keys > self.query_pos - window)
        return self.masks[window]

    def attn_bias(self, dtype: torch.dtype, window: int | None = None) -> torch.Tensor:
        """The (window's) mask as SDPA's additive bias in `dtype`, made once per step (a bool
        mask is converted inside every SDPA call, i.e. every layer)."""
        key = (window, dtype)
        if key not in self.biases:
            mask = self.window_mask(window)
            self.biases[key] = torch.zeros(mask.shape, dtype=dtype,
                                           device=mask.device).masked_fill_(~mask, -torch.inf)
        return self.biases[key]

    def kv_index(self, num_blocks: int) -> torch.Tensor:
        """The K rows then the V rows of a (2 * num_blocks, ...) view of a layer's cache: one
        gather for both (made at the first layer, shared by the others)."""
        if self.kv_blocks is None:
            self.kv_blocks = torch.cat((self.blocks, self.blocks + num_blocks))
        return self.kv_blocks


class TorchAttentionBackend(MLAAttentionMixin, PagedKVBackend):
    """Paged attention in plain PyTorch: the reference every other backend is checked against."""

    name = "torch"
    padded_batches = True  # _attend: queries padded to max_query_len, whole blocks gathered
    supported_kinds = ("mha", "gqa", "mla")

    def cudagraph_support(self, device: torch.device) -> CudaGraphSupport:
        """UNIFORM_DECODE on the CPU (eager padding), NEVER on CUDA (module docstring)."""
        return (CudaGraphSupport.UNIFORM_DECODE if device.type == "cpu"
                else CudaGraphSupport.NEVER)

    def build_metadata(self, inputs: AttentionInputs) -> TorchAttentionMetadata:
        device = inputs.query_start_loc.device
        b = inputs.num_reqs
        blocks = inputs.block_table.long()
        keys = torch.arange(blocks.shape[1] * inputs.block_size, device=device)
        rows, slots = write_targets(inputs.slot_mapping[:inputs.num_actual_tokens])
        if inputs.is_pure_decode:  # token i is request i's, at position seq_len - 1
            token_req = torch.arange(b, device=device)
            mask = keys[None, :] < inputs.seq_lens[:, None]
            query_pos = (inputs.seq_lens.long() - 1)[:, None, None, None]
            return TorchAttentionMetadata(inputs, token_req, torch.zeros_like(token_req),
                                          blocks.flatten(), mask[:, None, None], rows, slots,
                                          query_pos=query_pos)
        qlens = torch.tensor(inputs.query_lens_cpu, device=device)
        token_req = torch.repeat_interleave(torch.arange(b, device=device), qlens)
        starts = inputs.query_start_loc[:-1].long()
        token_row = torch.arange(token_req.numel(), device=device) - starts[token_req]
        query_pos = inputs.num_computed_tokens[:, None].long() + torch.arange(
            inputs.max_query_len, device=device
        )
        mask = (keys[None, None, :] <= query_pos[:, :, None]) & (
            keys[None, None, :] < inputs.seq_lens[:, None, None]
        )
        return TorchAttentionMetadata(inputs, token_req, token_row, blocks.flatten(), mask[:, None],
                                      rows, slots, query_pos=query_pos[:, None, :, None])

    supported_features = frozenset(ATTENTION_FEATURES)  # the reference of each

    def forward(self, layer_idx, q, k, v, kv_cache, metadata, scale, *, sliding_window=None,
                sinks=None, softcap=None):
        md: TorchAttentionMetadata = metadata
        k_scale, v_scale = self.write_step_kv(layer_idx, k, v, kv_cache, md)
        key, val = _gather_kv(kv_cache, md.kv_index(kv_cache.shape[1]), md.inputs.num_reqs)
        if kv_cache.dtype == FP8_KV_DTYPE:
            key = dequantize_kv_ref(key, k_scale).to(q.dtype)
            val = dequantize_kv_ref(val, v_scale).to(q.dtype)
        if sinks is not None or softcap is not None:
            return _attend_exact(md, q, key, val, scale, sliding_window, sinks, softcap)
        return _attend(md, q, key, val, scale, sliding_window)

    def write_step_kv(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor,
                      kv_cache: torch.Tensor, md: TorchAttentionMetadata):
        """The step's K / V rows into layer `layer_idx`'s cache (fp8: quantized with the
        layer's scales) -> the layer's (k_scale, v_scale), None for a cache in the model dtype."""
        n = md.inputs.num_actual_tokens
        k_scale, v_scale = layer_kv_scales(md.inputs, layer_idx, kv_cache, k[:n], v[:n])
        _write_rows(kv_cache, k[:n], v[:n], md.write_rows, md.write_slots, k_scale, v_scale)
        return k_scale, v_scale

    def forward_mla(self, layer_idx, q_nope, q_pe, kv_c, k_pe, kv_cache, metadata,
                    mla: MLAWeights, scale):
        md: TorchAttentionMetadata = metadata
        n = md.inputs.num_actual_tokens
        c_scale, pe_scale = layer_kv_scales(md.inputs, layer_idx, kv_cache, kv_c[:n], k_pe[:n])
        write_latent_cache_ref(kv_cache, kv_c[:n], k_pe[:n], md.inputs.slot_mapping[:n],
                               c_scale, pe_scale)
        b, lat = md.inputs.num_reqs, mla.kv_lora_rank
        rows = kv_cache.index_select(0, md.blocks).view(-1, kv_cache.shape[-1])  # [B*S, L+R]
        rows = dequantize_latent_rows(rows, lat, c_scale, pe_scale, q_nope.dtype)
        k_nope, val = mla.expand(rows[:, :lat])  # [B*S, H, N], [B*S, H, V]
        k_rope = rows[:, None, lat:].expand(-1, mla.num_heads, -1)  # one k_pe for every head
        key = torch.cat((k_nope, k_rope), dim=-1).unflatten(0, (b, -1))  # [B, S, H, N+R]
        val = val.unflatten(0, (b, -1))  # [B, S, H, V]
        q = torch.cat((q_nope, q_pe), dim=-1)
        return _attend(md, q, key.transpose(1, 2), val.transpose(1, 2), scale)


def _attend(md: TorchAttentionMetadata, q: torch.Tensor, key: torch.Tensor, val: torch.Tensor,
            scale: float, window: int | None = None) -> torch.Tensor:
    """Flat queries [T, H, D] over gathered key [B, Hkv, S, D] / val [B, Hkv, S, Dv] with the
    step's causal mask (narrowed to a sliding `window`) -> [T, H, Dv] (padding tokens beyond
    num_actual_tokens are zero)."""
    n = md.inputs.num_actual_tokens
    decode = md.inputs.is_pure_decode  # one row per request: no padding needed
    if decode and _groups_as_rows(q, key):  # q as [B, Hkv, g, D]: g query rows per KV head
        b, hkv = key.shape[:2]
        out = F.scaled_dot_product_attention(
            q[:n].view(b, hkv, -1, q.shape[-1]), key, val, attn_mask=md.attn_bias(q.dtype, window),
            scale=scale,
        ).reshape(n, q.shape[1], val.shape[-1])
        return with_padding_rows(out, q.shape[0])
    q_pad = q[:n].unsqueeze(1) if decode else _pad_queries(q[:n], md)
    out = F.scaled_dot_product_attention(
        q_pad.transpose(1, 2), key, val, attn_mask=md.window_mask(window), scale=scale,
        enable_gqa=q.shape[1] != key.shape[1],
    ).transpose(1, 2)  # [B, Q, H, Dv]
    return with_padding_rows(out[:, 0] if decode else out[md.token_req, md.token_row],
                              q.shape[0])


def _attend_exact(md: TorchAttentionMetadata, q: torch.Tensor, key: torch.Tensor,
                  val: torch.Tensor, scale: float, window: int | None,
                  sinks: torch.Tensor | None, softcap: float | None) -> torch.Tensor:
    """_attend with the features SDPA lacks, spelled out as transformers' eager attention does:
    scores = q.k * scale, soft-capped (softcap * tanh(s / softcap)), masked; each head's sink
    logit joins the softmax as one more column (fp32) and is dropped before the values."""
    n, h = md.inputs.num_actual_tokens, q.shape[1]
    decode = md.inputs.is_pure_decode
    q_pad = q[:n].unsqueeze(1) if decode else _pad_queries(q[:n], md)  # [B, Q, H, D]
    group = h // key.shape[1]
    key = key.repeat_interleave(group, dim=1).float()  # [B, H, S, D]
    val = val.repeat_interleave(group, dim=1).float()
    scores = q_pad.transpose(1, 2).float() @ key.transpose(-1, -2) * scale  # [B, H, Q, S]
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~md.window_mask(window), -torch.inf)
    if sinks is not None:
        sink = sinks.float().view(1, h, 1, 1).expand(*scores.shape[:3], 1)
        scores = torch.cat((scores, sink), dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if sinks is not None:
        probs = probs[..., :-1]
    out = (probs @ val).to(q.dtype).transpose(1, 2)  # [B, Q, H, Dv]
    return with_padding_rows(out[:, 0] if decode else out[md.token_req, md.token_row],
                             q.shape[0])


def _groups_as_rows(q: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether a decode step attends with each KV head's query heads as query rows (one
    [g, L] problem per KV head) rather than SDPA's enable_gqa: grouped attention, not plain MHA,
    in fp32 or with g >= 4, where it measured faster on the CPU
    (experiments/results/2026-12-05-cpu-kernels-option.md)."""
    g = q.shape[1] // key.shape[1]
    return g > 1 and (q.dtype == torch.float32 or g >= 4)


def with_padding_rows(out: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The real tokens' outputs [n, H, Dv] followed by zero rows up to `num_tokens` (the
    step's padding tokens); `out` itself when there are none."""
    if out.shape[0] == num_tokens:
        return out
    result = out.new_zeros(num_tokens, *out.shape[1:])
    result[: out.shape[0]] = out
    return result


def _pad_queries(q: torch.Tensor, md: TorchAttentionMetadata) -> torch.Tensor:
    """Flat [T, H, D] queries -> [B, max_query_len, H, D], zero rows where a request is short."""
    q_pad = q.new_zeros(md.inputs.num_reqs, md.inputs.max_query_len, q.shape[1], q.shape[2])
    q_pad[md.token_req, md.token_row] = q
    return q_pad


def _gather_kv(kv_cache: torch.Tensor, kv_blocks: torch.Tensor, b: int):
    """Whole blocks of each request's table (`kv_blocks`: TorchAttentionMetadata.kv_index) -> K
    and V as [B, Hkv, nblk * block_size, D] views of one gathered tensor."""
    _, num_blocks, bs, h, d = kv_cache.shape
    kv = kv_cache.view(2 * num_blocks, bs, h, d).index_select(0, kv_blocks).view(2, b, -1, h, d)
    return kv[0].transpose(1, 2), kv[1].transpose(1, 2)


def dequantize_latent_rows(rows: torch.Tensor, lora: int, c_scale, pe_scale,
                           dtype: torch.dtype) -> torch.Tensor:
    """Latent rows [S, L + R] as `dtype`: an fp8 cache's | kv_c | k_pe | parts times their
    scales (a cache in another dtype is returned as is)."""
    if rows.dtype != FP8_KV_DTYPE:
        return rows
    return torch.cat((dequantize_kv_ref(rows[:, :lora], c_scale),
                      dequantize_kv_ref(rows[:, lora:], pe_scale)), dim=-1).to(dtype)


def write_kv_cache(
    kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> None:
    """Reference KV write: token t goes to slot_mapping[t]; slots < 0 are skipped. An fp8 cache
    stores fp8(x / scale) (k_scale / v_scale: fp32 [1])."""
    rows, slots = write_targets(slot_mapping)
    _write_rows(kv_cache, k, v, rows, slots, k_scale, v_scale)


def write_targets(slot_mapping: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(the tokens that have a slot, their slots); rows None when every token has one (the
    common step without padding: no boolean indexing per layer)."""
    valid = slot_mapping >= 0
    if bool(valid.all()):
        return None, slot_mapping
    rows = valid.nonzero().squeeze(1)
    return rows, slot_mapping[rows]


def _write_rows(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                rows: torch.Tensor | None, slots: torch.Tensor, k_scale: torch.Tensor | None,
                v_scale: torch.Tensor | None) -> None:
    """Rows `rows` of k / v (None: all) into the cache's `slots`, quantized for an fp8 cache."""
    _, num_blocks, block_size, h, d = kv_cache.shape
    if rows is not None:
        k, v = k.index_select(0, rows), v.index_select(0, rows)
    if kv_cache.dtype == FP8_KV_DTYPE:  # index_copy_ has no fp8 kernel: copy the bytes
        k = quantize_kv_ref(k, k_scale).view(torch.uint8)
        v = quantize_kv_ref(v, v_scale).view(torch.uint8)
        kv_cache = kv_cache.view(torch.uint8)
    else:
        k, v = k.to(kv_cache.dtype), v.to(kv_cache.dtype)
    kv_cache[0].view(num_blocks * block_size, h, d).index_copy_(0, slots, k)
    kv_cache[1].view(num_blocks * block_size, h, d).index_copy_(0, slots, v)

