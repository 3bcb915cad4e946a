"""muse_ops: fused attention ops of Muse Spark's decode and speculative-verify steps.

Importing the package registers torch.ops.muse.qkv_front and torch.ops.muse.attn2 (with their
fake implementations) and exports the module and the configs.
"""
__version__ = "0.2.0"   # the one version string: setup.py reads it from this line

from . import ops  # registers the ops
from .backends import available_backends, backend_report, last_backend, set_backend
from .config import DeploymentConfig
from .errors import MuseDeviceError, MuseInputError, device_errors, raise_device_errors
from .module import MuseAttentionDecode
from .ops import attn2, attn2_workspace, attn2_workspace_bytes, prepare, qkv_front
from . import testing, weights  # noqa: F401  (the float64 oracle; checkpoint projections -> a rank's layer)
from .paged import PageAllocator, PagedBatch, allocate_kv_cache, block_positions, block_slots, random_page_table
from .reference import rope_cos_sin

__all__ = [
    "DeploymentConfig", "MuseAttentionDecode", "MuseDeviceError", "MuseInputError", "PageAllocator", "PagedBatch",
    "allocate_kv_cache", "attn2", "attn2_workspace", "attn2_workspace_bytes", "available_backends",
    "backend_report", "block_positions", "block_slots", "device_errors", "last_backend", "prepare",
    "qkv_front", "raise_device_errors", "random_page_table", "rope_cos_sin", "set_backend",
]
