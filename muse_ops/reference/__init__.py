"""Pure-PyTorch implementations of the two ops: the numerics spec and the backend that runs anywhere."""
from .attn2 import attn2_ref
from .qkv_front import per_head, quantize_rows, qkv_front_ref, rope_cos_sin

__all__ = ["attn2_ref", "per_head", "quantize_rows", "qkv_front_ref", "rope_cos_sin"]
