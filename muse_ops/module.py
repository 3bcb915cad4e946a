"""MuseAttentionDecode: the attention of one Muse Spark layer for decode / verify steps.

It owns the fused projection weight [1152*Hkv, 8192] (q | k | v | gate rows), the optional
output projection, the RoPE cos|sin table of a sliding-window layer (built once, sized by the
deployment's positions), the deployment config, attn2's workspace and, for an FP8 cache, the
cache's dequantization scales (set once from a calibration, read by every step). The KV cache
belongs to the caller (one cache per layer, shared with the engine's allocator) and is written in
place. No kernel logic lives here: forward is the step's checks, qkv_front, attn2, then o_proj.

The module is for inference: its parameters do not require grad (so it runs, eagerly or under
torch.compile, in default grad mode without torch.no_grad()), and its buffers are ordinary
tensors even when it is built under torch.inference_mode().
"""
from __future__ import annotations

import math

import torch
from torch import nn

from . import ops, weights
from .config import DEFAULT_SCALE, HEAD_DIM, HIDDEN, VERIFY_Q_LEN, DeploymentConfig, proj_cols, q_heads
from .errors import MuseInputError
from .reference import rope_cos_sin


class MuseAttentionDecode(nn.Module):
    """k_scale, v_scale (an FP8 cache, config.cache_dtype = torch.float8_e4m3fn): the cache's
    dequantization scales, one float or one per KV head (a sequence or tensor of Hkv); default 1.0
    (what SGLang uses when no calibration sets them). set_kv_scales changes them later."""

    def __init__(self, config: DeploymentConfig, *, o_proj: bool = False, max_positions: int | None = None,
                 device=None, backend: str | None = None, k_scale=None, v_scale=None):
        super().__init__()
        self.config = config
        self.backend = backend
        kw = {"device": device, "dtype": torch.bfloat16}
        with torch.inference_mode(False):
            self.qkv_weight = nn.Parameter(torch.empty(proj_cols(config.kv_heads), HIDDEN, **kw),
                                           requires_grad=False)
            self.o_proj = (nn.Linear(q_heads(config.kv_heads) * HEAD_DIM, HIDDEN, bias=False, **kw)
                           if o_proj else None)
            if self.o_proj is not None:
                self.o_proj.weight.requires_grad_(False)
            if config.rope:
                positions = max_positions or config.max_seq_len
                self.register_buffer("cos_sin", rope_cos_sin(positions, config.rope_theta, device), persistent=False)
            else:
                self.cos_sin = None
            self.register_buffer("workspace", self._new_workspace(device), persistent=False)
            if self.fp8:
                ones = torch.ones(config.kv_heads, dtype=torch.float32, device=device)
                self.register_buffer("k_scale", ones.clone())   # persistent: a calibration is part of the state
                self.register_buffer("v_scale", ones.clone())
            else:
                self.k_scale = self.v_scale = None
            self.reset_parameters()
        if k_scale is not None or v_scale is not None:
            self.set_kv_scales(1.0 if k_scale is None else k_scale, 1.0 if v_scale is None else v_scale)

    @property
    def fp8(self) -> bool:
        """Whether the layer's KV cache is float8_e4m3fn (with scales) rather than bf16."""
        return self.config.cache_dtype == torch.float8_e4m3fn

    @torch.no_grad()
    def set_kv_scales(self, k_scale, v_scale) -> None:
        """Set the FP8 cache's dequantization scales in place (a captured CUDA graph reads the new
        values): key = float(e4m3) * k_scale, value = float(e4m3) * v_scale; each one positive,
        finite float, or one per KV head. Checked here, once, on the host."""
        if not self.fp8:
            raise MuseInputError("MuseAttentionDecode.set_kv_scales: k_scale and v_scale scale an FP8 cache; "
                                 f"this layer's cache_dtype is {self.config.cache_dtype}")
        kv_heads = self.config.kv_heads
        values = []
        for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
            t = torch.as_tensor(value).detach().to("cpu", torch.float32).reshape(-1)
            if t.numel() not in (1, kv_heads):
                raise MuseInputError(f"MuseAttentionDecode: {name} must be one float or {kv_heads} (one per KV "
                                     f"head), got {t.numel()} values")
            if not bool((torch.isfinite(t) & (t > 0)).all()):   # in float32: what the kernels read
                raise MuseInputError(f"MuseAttentionDecode: {name} must be positive and finite in float32, got "
                                     f"{torch.as_tensor(value).reshape(-1).tolist()}")
            values.append(t.expand(kv_heads))
        with torch.inference_mode(False):   # both checked before either is written
            self.k_scale.copy_(values[0])
            self.v_scale.copy_(values[1])

    @classmethod
    @torch.no_grad()
    def from_projections(cls, q_proj: torch.Tensor, k_proj: torch.Tensor, v_proj: torch.Tensor,
                         gate_proj: torch.Tensor, o_proj: torch.Tensor | None = None, *, tp_rank: int = 0,
                         tp_size: int = 1, window: int = 0, q_len: int = VERIFY_Q_LEN, max_seq_len: int = 32768,
                         max_batch: int = 256, scale: float = DEFAULT_SCALE, rope: bool | None = None,
                         cache_dtype: torch.dtype = torch.bfloat16, k_scale=None, v_scale=None,
                         device=None, backend: str | None = None) -> "MuseAttentionDecode":
        """The layer of rank tp_rank of tp_size built from a checkpoint's separate projections of
        all heads (muse_ops.weights says which heads a rank keeps and how the fused rows are laid
        out). With o_proj, forward returns this rank's share of the output projection (the caller
        sums the ranks', as for any row-parallel linear)."""
        total_kv = k_proj.shape[0] // HEAD_DIM
        fused = weights.fuse_projections(q_proj, k_proj, v_proj, gate_proj, tp_rank, tp_size)
        cfg = DeploymentConfig(kv_heads=total_kv // tp_size, q_len=q_len, window=window, max_seq_len=max_seq_len,
                               scale=scale, max_batch=max_batch, rope=rope, cache_dtype=cache_dtype)
        layer = cls(cfg, o_proj=o_proj is not None, device=device, backend=backend, k_scale=k_scale, v_scale=v_scale)
        layer.qkv_weight.copy_(fused)
        if o_proj is not None:
            layer.o_proj.weight.copy_(weights.o_proj_columns(o_proj, total_kv, tp_rank, tp_size))
        return layer

    @torch.no_grad()
    def reset_parameters(self) -> None:
        nn.init.normal_(self.qkv_weight, std=1.0 / math.sqrt(HIDDEN))
        if self.o_proj is not None:
            nn.init.normal_(self.o_proj.weight, std=1.0 / math.sqrt(self.o_proj.in_features))

    def _new_workspace(self, device) -> torch.Tensor:
        c = self.config
        return ops.attn2_workspace(device or "cpu", c.max_batch, c.kv_heads, c.q_len, c.window, c.max_seq_len)

    def prepare(self) -> dict:
        """Build-time setup on the module's device: size the workspace for the backend that will
        run there and compile (or load) every kernel variant the layer may launch, so the first
        step pays nothing. Returns muse_ops.prepare's report (backends, variants, seconds)."""
        device = self.qkv_weight.device
        self.workspace = self._new_workspace(device)
        return ops.prepare(self.config, device, self.backend)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, kv_cache: torch.Tensor,
                page_table: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """x [R*q_len, 8192] (or [R, q_len, 8192]) -> [R*q_len, 512*Hkv] (or [.., 8192] with o_proj).
        Writes the block's keys and values into kv_cache at slots. Every input of the step is
        checked first (contents too where the backend checks them; R against max_batch), so a
        rejected step writes nothing, eager or compiled."""
        c = self.config
        flat = x.dim() == 2    # [R*q_len, 8192] already: no reshape (each is a dispatcher call, ~1 us of host)
        x2 = x if flat else x.reshape(-1, HIDDEN)
        workspace = self.workspace
        if workspace.device != x.device:
            workspace = None
        kw = dict(q_len=c.q_len, window=c.window, scale=c.scale, max_seq_len=c.max_seq_len, k_scale=self.k_scale,
                  v_scale=self.v_scale, backend=self.backend)
        layer = dict(max_batch=c.max_batch, cache_dtype=c.cache_dtype)
        out = None
        if torch.compiler.is_compiling():
            # the graph's first op checks the whole step when it runs, before qkv_front writes
            # (the fakes check nothing, so the error is the package's own, compiled or not)
            torch.ops.muse._check_step(x2, self.qkv_weight, positions, slots, self.cos_sin, kv_cache, page_table,
                                       seq_lens, workspace, self.k_scale, self.v_scale, c.q_len, c.window, c.scale,
                                       c.max_seq_len, c.max_batch, c.cache_dtype, self.backend)
        else:
            # a plain eager call: the step checked before its first write, then both ops; otherwise
            # check the whole step, then go through the registered ops
            out = ops.run_step(x2, self.qkv_weight, positions, slots, self.cos_sin, kv_cache, page_table, seq_lens,
                               workspace, **layer, **kw)
            if out is None:
                ops.check_step(x2, self.qkv_weight, positions, slots, self.cos_sin, kv_cache, page_table,
                               seq_lens, workspace, **layer, **kw)
        if out is None:
            y = ops.qkv_front(x2, self.qkv_weight, positions, slots, self.cos_sin, kv_cache, k_scale=self.k_scale,
                              v_scale=self.v_scale, backend=self.backend)
            out = ops.attn2(y, kv_cache, page_table, seq_lens, workspace=workspace, **kw)
        if self.o_proj is not None:
            out = self.o_proj(out)
        return out if flat else out.reshape(*x.shape[:-1], out.shape[-1])

    def extra_repr(self) -> str:
        c = self.config
        return (f"kv_heads={c.kv_heads}, q_len={c.q_len}, window={c.window}, max_seq_len={c.max_seq_len}, "
                f"scale={c.scale:.5f}, rope={c.rope}, cache_dtype={c.cache_dtype}, o_proj={self.o_proj is not None}")
