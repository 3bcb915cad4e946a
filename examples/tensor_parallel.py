"""Muse Spark attention layers sharded by heads over T ranks, in a speculative-verify loop.

Each rank holds, for every layer, `MuseAttentionDecode.from_projections(..., tp_rank=r, tp_size=T)`:
its KV heads' share of the fused projection, its KV cache (its heads only) and its input columns
of o_proj. A layer's output is the sum of the ranks' o_proj shares: one all-reduce after o_proj
joins them, and every rank continues with the same hidden state. Requests join and leave through
one `muse_ops.PageAllocator` per rank (every rank makes the same decisions from the same seed, so
the page tables agree); each step verifies an 8-token block per request and accepts 1 to 8.
On GPUs (NCCL) the whole step, all-reduces included, is one captured CUDA graph replayed every
step; on CPUs (gloo) it runs eagerly on the reference backend.

    torchrun --nproc-per-node 2 examples/tensor_parallel.py [--device cpu|cuda] [--layers 2] [--steps 6]
    (GPUs: NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 8 examples/tensor_parallel.py --device cuda)

`--check` compares every step with an unfused layer on one device, in float64: the checkpoint's
separate q / k / v / gate projections, per-head RMS norm, RoPE, scaled_dot_product_attention over
each request's keys, norm, gate, o_proj (all heads), and each rank's cache with that layer's keys
and values of the rank's heads (what tests/test_tensor_parallel.py runs).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import muse_ops
from muse_ops import MuseAttentionDecode, PageAllocator
from muse_ops.config import GROUP, HEAD_DIM, HIDDEN, PAGE_SIZE, RMS_EPS
from muse_ops.testing import assert_close, assert_layer_close, bf16

Q_LEN = 8


def checkpoint(layers: int, total_kv: int, seed: int) -> list[dict]:
    """Random bf16 projections of every layer, the same on every rank (one seed)."""
    g = torch.Generator().manual_seed(seed)

    def proj(rows, cols):
        return (torch.randn(rows, cols, generator=g) * cols ** -0.5).to(torch.bfloat16)
    hq = GROUP * total_kv
    return [{"q": proj(hq * HEAD_DIM, HIDDEN), "k": proj(total_kv * HEAD_DIM, HIDDEN),
             "v": proj(total_kv * HEAD_DIM, HIDDEN), "gate": proj(hq * HEAD_DIM, HIDDEN),
             "o": proj(HIDDEN, hq * HEAD_DIM), "window": 2048 if i % 2 == 0 else 0} for i in range(layers)]


# ------------------------------------------------------------------------------ the unfused layer
def _rms(t):
    return t * torch.rsqrt(t.square().mean(-1, keepdim=True) + RMS_EPS)


def _rope(t, cs):
    even, odd = t[..., 0::2], t[..., 1::2]
    cos, sin = cs[..., :HEAD_DIM // 2], cs[..., HEAD_DIM // 2:]
    return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)


class UnfusedLayer:
    """One layer of all heads on one device, in float64 from the checkpoint's separate projections
    (bf16 roundings where the contract puts them): the model a TP run must equal. It keeps every
    request's keys and values (dense, all heads) as the steps go."""

    def __init__(self, weights: dict, scale: float, cos_sin: torch.Tensor):
        self.w = {k: v.double() for k, v in weights.items() if k != "window"}
        self.window, self.scale, self.cos_sin = weights["window"], scale, cos_sin.double()
        self.keys: dict = {}       # request -> [tokens, Hkv_all, 64]
        self.values: dict = {}

    def prefill(self, request, k: torch.Tensor, v: torch.Tensor) -> None:
        self.keys[request], self.values[request] = k.double(), v.double()

    def accept(self, request, length: int) -> None:
        """The request keeps its first `length` tokens (rejected draft tokens are dropped)."""
        self.keys[request] = self.keys[request][:length]
        self.values[request] = self.values[request][:length]

    def leave(self, request) -> None:
        del self.keys[request], self.values[request]

    def step(self, x: torch.Tensor, requests: list, lengths: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer's output (all heads through o_proj) for the real requests' rows of x, and the
        block's new keys and values [rows, Hkv_all, 64] (appended to the history)."""
        x = x.double()
        hkv = self.w["k"].shape[0] // HEAD_DIM
        hq = GROUP * hkv
        q = bf16(_rms(bf16(F.linear(x, self.w["q"])).view(-1, hq, HEAD_DIM)))
        k = bf16(_rms(bf16(F.linear(x, self.w["k"])).view(-1, hkv, HEAD_DIM)))
        v = bf16(F.linear(x, self.w["v"])).view(-1, hkv, HEAD_DIM)
        gate = bf16(F.linear(x, self.w["gate"])).view(-1, hq, HEAD_DIM)
        outs, new_k = [], []
        for r, (req, length) in enumerate(zip(requests, lengths)):
            rows = slice(r * Q_LEN, (r + 1) * Q_LEN)
            pos = torch.arange(length - Q_LEN, length)
            q_r, k_r = q[rows], k[rows]
            if self.window:     # the model's RoPE: on sliding-window layers
                cs = self.cos_sin[pos][:, None]
                q_r, k_r = bf16(_rope(q_r, cs)), bf16(_rope(k_r, cs))
            keys = torch.cat((self.keys[req][:length - Q_LEN], k_r))
            values = torch.cat((self.values[req][:length - Q_LEN], v[rows]))
            self.keys[req], self.values[req] = keys, values
            new_k.append(k_r)
            key_pos = torch.arange(length)
            mask = key_pos[None, :] <= pos[:, None]
            if self.window:
                mask &= key_pos[None, :] > pos[:, None] - self.window
            o = F.scaled_dot_product_attention(q_r.transpose(0, 1), keys.transpose(0, 1).repeat_interleave(GROUP, 0),
                                               values.transpose(0, 1).repeat_interleave(GROUP, 0), attn_mask=mask,
                                               scale=self.scale).transpose(0, 1)
            outs.append(bf16(torch.sigmoid(gate[rows]) * _rms(bf16(o))).reshape(Q_LEN, -1))
        out = F.linear(torch.cat(outs), self.w["o"])
        return out, torch.cat(new_k), v[:len(requests) * Q_LEN]


# ------------------------------------------------------------------------------ the sharded loop
def run(rank: int, world: int, device: str = "cpu", layers: int = 2, steps: int = 6, batch: int = 3,
        total_kv: int = 4, max_seq_len: int = 4096, seed: int = 0, check: bool = False,
        graphs: bool | None = None, log=print) -> list[torch.Tensor]:
    """This rank's part of the loop (the process group is initialised). Returns every step's joined
    hidden state (the real requests' rows), the same tensor on every rank."""
    dev = torch.device(device)
    graphs = dev.type == "cuda" if graphs is None else graphs
    ckpt = checkpoint(layers, total_kv, seed)
    stack = [MuseAttentionDecode.from_projections(w["q"], w["k"], w["v"], w["gate"], w["o"], tp_rank=rank,
                                                  tp_size=world, window=w["window"], max_seq_len=max_seq_len,
                                                  max_batch=batch, device=dev) for w in ckpt]
    for layer in stack:
        layer.prepare()
    hkv = stack[0].config.kv_heads
    mine = slice(rank * hkv, (rank + 1) * hkv)                       # this rank's KV heads
    max_pages = -(-max_seq_len // PAGE_SIZE)
    num_pages = batch * max_pages // 2
    caches = [muse_ops.allocate_kv_cache(num_pages, hkv, device=dev) for _ in stack]
    pool = PageAllocator(num_pages, max_pages, generator=torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed + 1)                  # the same draws on every rank
    unfused = ([UnfusedLayer(w, layer.config.scale, muse_ops.rope_cos_sin(max_seq_len)) for w, layer in
                zip(ckpt, stack)] if check else [])

    def step(x, positions, slots, page_table, seq_lens):
        """The stack on one step's batch: the final hidden state, and each layer's input and
        joined output (what --check compares)."""
        h, seen = x, []
        for layer, cache in zip(stack, caches):
            part = layer(h, positions, slots, cache, page_table, seq_lens)   # this rank's o_proj share
            dist.all_reduce(part)                                            # the ranks' shares joined
            seen.append((h, part))
            h = h + part
        return h, seen

    cached, next_id = {}, 0

    def join():
        nonlocal next_id
        prompt = int(torch.randint(16, 600, (1,), generator=gen))
        pool.reserve(next_id, prompt)
        t = torch.arange(prompt)
        pages = torch.tensor(pool.pages(next_id))[t // PAGE_SIZE]
        for i, cache in enumerate(caches):       # stand-in for the prefill: every head's rows, drawn alike on all ranks
            rows = torch.randn(prompt, total_kv, 2 * HEAD_DIM, generator=gen).to(torch.bfloat16)
            cache[pages.to(dev), :, (t % PAGE_SIZE).to(dev)] = rows[:, mine].to(dev)
            if check:
                unfused[i].prefill(next_id, rows[..., :HEAD_DIM], rows[..., HEAD_DIM:])
        cached[next_id] = prompt
        next_id += 1

    static, graph = None, None
    for _ in range(batch - 1):
        join()
    results = []
    for s in range(steps):
        if s % 2 == 1 and len(cached) > 1:          # a request finishes, another arrives
            gone = min(cached)
            pool.release(gone)
            del cached[gone]
            for u in unfused:
                u.leave(gone)
        while len(cached) < batch and s % 2 == 0:
            join()
        active = sorted(cached)
        for req in active:
            pool.reserve(req, cached[req] + Q_LEN)
        b = pool.batch(active, Q_LEN, pad_to=batch, device=dev)
        x = torch.randn(batch * Q_LEN, HIDDEN, generator=gen).to(dev, torch.bfloat16)
        inputs = (x, b.positions, b.slots, b.page_table, b.seq_lens)
        with torch.inference_mode():
            if not graphs:
                out, seen = step(*inputs)
            else:
                if graph is None:                    # capture once: the all-reduces inside the graph
                    static = [t.clone() for t in inputs]
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):   # warm-up (it writes the caches: on copies)
                        real, caches[:] = caches[:], [c.clone() for c in caches]
                        step(*static)
                        caches[:] = real
                    torch.cuda.current_stream().wait_stream(side)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        static_out, static_seen = step(*static)
                for t, v in zip(static, inputs):
                    t.copy_(v)
                graph.replay()
                out, seen = static_out.clone(), [(h.clone(), part.clone()) for h, part in static_seen]
        rows = len(active) * Q_LEN
        results.append(out[:rows].clone())
        lengths = [cached[r] + Q_LEN for r in active]
        if check:
            _check_step(rank, unfused, caches, seen, b, active, lengths, rows, mine, s)
        accepted = torch.randint(1, Q_LEN + 1, (len(active),), generator=gen).tolist()
        for req, a in zip(active, accepted):
            cached[req] += a
            for u in unfused:
                u.accept(req, cached[req])
        if rank == 0:
            log(f"step {s}: {len(active)} requests (lengths {lengths}), accepted {accepted}"
                + (", matches the unfused layer on one device" if check else ""))
    return results


def _check_step(rank, unfused, caches, seen, b, active, lengths, rows, mine, s):
    """Each layer's joined output against the unfused layer on the same input, and this rank's
    cache rows of the block against that layer's keys and values of the rank's heads."""
    for i, (u, cache, (h, part)) in enumerate(zip(unfused, caches, seen)):
        ref_out, ref_k, ref_v = u.step(h[:rows].cpu(), active, lengths)
        assert_layer_close(part[:rows].cpu(), ref_out, f"step {s} layer {i} (rank {rank})")
        slots = b.slots[:rows].long().cpu()
        got = cache.cpu()[slots // PAGE_SIZE, :, slots % PAGE_SIZE]          # [rows, Hkv, 128]
        assert_close(got[..., :HEAD_DIM], ref_k[:, mine], f"step {s} layer {i} keys (rank {rank})")
        assert_close(got[..., HEAD_DIM:], ref_v[:, mine], f"step {s} layer {i} values (rank {rank})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=3)
    p.add_argument("--kv-heads", type=int, default=8, help="KV heads of the whole layer (split over the ranks)")
    p.add_argument("--check", action="store_true", help="compare every step with the unfused layer on one device")
    a = p.parse_args(argv)
    if "RANK" not in os.environ:
        print("tensor_parallel: start it with torchrun, e.g. torchrun --nproc-per-node 2 "
              "examples/tensor_parallel.py", file=sys.stderr)
        return 2
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if a.device == "cuda":
        if not torch.cuda.is_available() or torch.cuda.device_count() < world:
            print(f"tensor_parallel: --device cuda needs {world} GPUs, this machine shows "
                  f"{torch.cuda.device_count()}", file=sys.stderr)
            return 2
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    try:
        run(rank, world, a.device, a.layers, a.steps, a.batch, a.kv_heads, check=a.check)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print("tensor_parallel: done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
