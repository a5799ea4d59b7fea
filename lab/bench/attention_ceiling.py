"""A ceiling, not a backend to serve with: the torch backend with decode attention left out.

    python -m lab.bench.throughput --attention-ceiling --peer-python <vLLM python> --repeat 3

`KVWriteOnlyAttention` is `attention=torch` whose pure-decode steps write the step's K / V into
the cache and return zeros instead of attending; prefill and mixed steps attend as usual:

    decode step, every layer:   write K/V rows (as attention=torch does)  ->  output = 0
                                (no gather of the cached blocks, no softmax, no P @ V)

Its tokens are wrong (the model never reads its context), so no token check applies; the run
still decodes the same number of steps of the same batch (`ignore_eos`). Its speed is what lab
would reach if decode attention cost nothing beyond its cache write, all else equal: no
decode-attention kernel, however fast, takes lab past it. `lab.bench.throughput
--attention-ceiling` times it beside lab and the peer, in the same rounds.
"""

from __future__ import annotations

from lab.attention.torch_backend import TorchAttentionBackend, TorchAttentionMetadata

#: the engine settings that select it: attention=torch with its class swapped (LLM(**KNOBS))
KNOBS = {"attention": "torch", "attention._target_": f"{__name__}.KVWriteOnlyAttention"}


class KVWriteOnlyAttention(TorchAttentionBackend):
    """attention=torch less the decode steps' attention (module docstring)."""

    name = "torch_kv_write_only"

    def forward(self, layer_idx, q, k, v, kv_cache, metadata, scale):
        md: TorchAttentionMetadata = metadata
        if not md.inputs.is_pure_decode:
            return super().forward(layer_idx, q, k, v, kv_cache, metadata, scale)
        self.write_step_kv(layer_idx, k, v, kv_cache, md)
        return q.new_zeros(q.shape)
