"""Model constants of Muse Spark attention and the deployment config of one layer.

The constants are the model's (docs/DESIGN.md section 2); the deployment config is what a serving
engine fixes when it builds a layer: how many KV heads this rank holds, the verify block size,
the sliding window, the longest request it will ever see, and the softmax scale. Kernel variants
are picked from the deployment config only, never from tensor contents, so one captured CUDA
graph serves every step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

HIDDEN = 8192            # rows of x in the fused projection
HEAD_DIM = 64
GROUP = 8                # query heads per KV head (GQA)
PAGE_SIZE = 16           # tokens per KV-cache page
CACHE_ROW = 2 * HEAD_DIM  # one cache row: K in 0:64, V in 64:128
RMS_EPS = 1e-5
ROPE_THETA = 500000.0
SLIDING_WINDOW = 2048    # a token and the 2047 before it
VERIFY_Q_LEN = 8         # draft tokens checked per request in a speculative-verify step
DEFAULT_SCALE = 5.473 / 8.0  # qk_scale_factor * 1/sqrt(head_dim)
SUPPORTED_Q_LENS = (1, 8)
# The KV cache holds bf16 keys and values, or float8 e4m3 ones with fp32 dequantization scales
# (docs/DESIGN.md section 3b): key = float(e4m3) * k_scale, value = float(e4m3) * v_scale.
CACHE_DTYPES = (torch.bfloat16, torch.float8_e4m3fn)
FP8_MAX = 448.0          # the largest finite e4m3 value: the insert saturates to +-FP8_MAX


def proj_cols(kv_heads: int) -> int:
    """Columns N of the fused projection: q (8*Hkv heads) | k (Hkv) | v (Hkv) | gate (8*Hkv)."""
    return (2 * GROUP + 2) * HEAD_DIM * kv_heads  # 1152 * Hkv


def q_heads(kv_heads: int) -> int:
    return GROUP * kv_heads


def column_offsets(kv_heads: int) -> dict[str, int]:
    """First column of each part of the projection output y."""
    hq = q_heads(kv_heads)
    return {
        "q": 0,
        "k": hq * HEAD_DIM,
        "v": (hq + kv_heads) * HEAD_DIM,
        "gate": (hq + 2 * kv_heads) * HEAD_DIM,
    }


@dataclass(frozen=True)
class DeploymentConfig:
    """What a serving engine fixes for one attention layer on one tensor-parallel rank.

    kv_heads:     KV heads on this rank (2 under TP8, 4 under TP4, 16 under TP1).
    q_len:        tokens per request per step: 8 for a speculative-verify block, 1 for decode.
    window:       sliding window in tokens (a token and the window-1 before it); 0 = full layer.
    max_seq_len:  the longest request length L (cached tokens + the new block) this layer serves.
    scale:        softmax scale applied to q.k.
    max_batch:    the most requests in one step; sizes the attention workspace.
    rope:         whether q and k get RoPE (the model puts it on sliding-window layers only).
    rope_theta:   RoPE base.
    cache_dtype:  the KV cache's dtype: torch.bfloat16, or torch.float8_e4m3fn (half the bytes;
                  the layer owns its dequantization scales, MuseAttentionDecode.set_kv_scales).
    """

    kv_heads: int = 2
    q_len: int = VERIFY_Q_LEN
    window: int = 0
    max_seq_len: int = 32768
    scale: float = DEFAULT_SCALE
    max_batch: int = 256
    rope: bool | None = None
    rope_theta: float = ROPE_THETA
    cache_dtype: torch.dtype = torch.bfloat16

    def __post_init__(self):
        if self.kv_heads < 1:
            raise ValueError(f"kv_heads must be >= 1, got {self.kv_heads}")
        if self.q_len not in SUPPORTED_Q_LENS:
            raise ValueError(f"q_len must be one of {SUPPORTED_Q_LENS}, got {self.q_len}")
        if self.window < 0:
            raise ValueError(f"window must be 0 (full attention) or positive, got {self.window}")
        if self.max_seq_len < self.q_len:
            raise ValueError(f"max_seq_len must be >= q_len ({self.q_len}), got {self.max_seq_len}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.cache_dtype not in CACHE_DTYPES:
            raise ValueError(f"cache_dtype must be one of {CACHE_DTYPES}, got {self.cache_dtype}")
        if self.rope is None:  # the model's rule: RoPE exactly on sliding-window layers
            object.__setattr__(self, "rope", self.window > 0)

    @property
    def q_heads(self) -> int:
        return q_heads(self.kv_heads)

    @property
    def proj_cols(self) -> int:
        return proj_cols(self.kv_heads)

    @property
    def max_pages(self) -> int:
        """Page-table width that holds the longest request."""
        return -(-self.max_seq_len // PAGE_SIZE)

    @classmethod
    def sliding(cls, **kw) -> "DeploymentConfig":
        return cls(window=SLIDING_WINDOW, **kw)

    @classmethod
    def full(cls, **kw) -> "DeploymentConfig":
        return cls(window=0, **kw)
