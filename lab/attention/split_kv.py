"""What the Triton backends share about split-KV decode: the knobs, the workspace, the split count.

    num_splits = choose_num_splits(decode requests, max_model_len, SMs, programs per request)

Splits are sized from max_model_len (not this step's lengths; a sliding-window layer's from its
window where that is shorter: triton_flash), so the launch grid depends only on the batch size
(CUDA-graph friendly); on the CPU (interpreter) there is one "SM", so one split.
"""

from __future__ import annotations

import torch

from lab.kernels import interpreter_active
from lab.kernels.paged_decode import DecodeWorkspace, choose_num_splits


class SplitKVDecode:
    """Mixed into a Triton attention backend (listed first): decode split knobs, the workspace
    and the split-count rule. The backend provides `name`."""

    name: str

    def __init__(self, max_splits: int = 16, min_keys_per_split: int = 256,
                 num_sms: int | None = None) -> None:
        self.max_splits = max_splits
        self.min_keys_per_split = min_keys_per_split
        self.workspace = DecodeWorkspace()
        self._num_sms = num_sms

    def decode_splits(self, num_reqs: int, max_len: int, programs_per_req: int,
                      device: torch.device) -> int:
        """KV splits for a decode launch of num_reqs x programs_per_req x splits programs."""
        return choose_num_splits(num_reqs, max_len, num_sms=self._sm_count(device),
                                 min_keys_per_split=self.min_keys_per_split,
                                 max_splits=self.max_splits, num_kv_heads=programs_per_req)

    def refuse_interpreter_bf16(self, dtype: torch.dtype) -> None:
        """bf16 arithmetic does not exist in Triton's interpreter: refuse it up front."""
        if dtype == torch.bfloat16 and interpreter_active():
            raise ValueError(f"attention={self.name} with dtype=bfloat16 needs CUDA: Triton's "
                             "interpreter has no bf16 arithmetic; use dtype=float32 or float16")

    def _sm_count(self, device: torch.device) -> int:
        """The parallelism splits should fill: the GPU's SMs; 1 on the CPU (the interpreter
        runs programs one by one, so splitting only adds work)."""
        if self._num_sms is None:
            self._num_sms = (torch.cuda.get_device_properties(device).multi_processor_count
                             if device.type == "cuda" else 1)
        return self._num_sms
