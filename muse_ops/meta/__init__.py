"""Fake (meta) implementations: output metadata only, for torch.compile and CUDA-graph tracing."""
from .attn2 import attn2_fake
from .qkv_front import qkv_front_fake

__all__ = ["attn2_fake", "qkv_front_fake"]
