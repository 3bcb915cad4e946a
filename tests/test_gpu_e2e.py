"""End to end on the GPU: a sliding and a full layer (verify q_len 8, and decode q_len 1) served
for 50 steps the way an engine serves them, against the reference backend step by step, the KV
caches included. Skipped without CUDA.

Each step every request's block is verified (verify: 1 to 8 tokens accepted, so lengths grow by
that; decode: its one token), requests leave (their pages go back to the pool and are handed
out again) and new ones join, so page tables, slots and the batch size change from step to step.
Three ways to run the fast path:
- torch.compile, default mode, fullgraph, dynamic shapes (unpadded batches): after a batch
  size's first step, no step compiles again;
- torch.compile, mode="reduce-overhead" (Inductor's CUDA graphs), fullgraph, dynamic shapes; the
  caches are marked static (torch._dynamo.mark_static_address) so the graphs are not skipped for
  the in-place cache write, and none is;
- a hand-captured CUDA graph per padded batch size (2, 4, 8 request rows): padding requests are
  PageAllocator's (dummy page 0, slots -1), their rows dropped.
The reference runs eagerly on its own copies of the caches. After the 50 steps the last graph
is replayed 1000 times: no memory is allocated meanwhile.
"""
import pytest
import torch

import muse_ops
from muse_ops import DeploymentConfig, MuseAttentionDecode, PageAllocator
from muse_ops.testing import assert_close, assert_layer_close

pytestmark = pytest.mark.gpu
DEV = "cuda"
STEPS = 50
MAX_BATCH = 6
GRAPH_SIZES = (2, 4, 8)
MAX_SEQ_LEN = 4096
NUM_PAGES = MAX_BATCH * (MAX_SEQ_LEN // 16) // 2
REPLAYS = 1000


class Serving:
    """Requests joining, growing by their accepted tokens and leaving, over one page pool shared
    by the layers' caches (one cache per layer, fast path and reference)."""

    def __init__(self, q_len: int, caches: list, seed: int):
        self.q_len = q_len
        self.gen = torch.Generator().manual_seed(seed)
        self.pool = PageAllocator(NUM_PAGES, MAX_SEQ_LEN // 16, generator=self.gen)
        self.caches = caches          # every layer's fast and reference cache: the same history
        self.cached = {}              # request -> tokens in the cache before its next block
        self.next_id = 0

    def _rand(self, lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=self.gen))

    def join(self):
        prompt = self._rand(16, 2500)
        req, self.next_id = self.next_id, self.next_id + 1
        self.pool.reserve(req, prompt)
        t = torch.arange(prompt)
        pages = torch.tensor(self.pool.pages(req))[t // 16].to(DEV)
        rows = t % 16
        for pair in self.caches:      # the prefill stand-in: the same rows in a layer's two caches
            history = torch.randn(prompt, pair[0].shape[1], 128, generator=self.gen).to(DEV, torch.bfloat16)
            for cache in pair:
                cache[pages, :, rows.to(DEV)] = history
        self.cached[req] = prompt

    def next_batch(self) -> list:
        """The requests of this step (after the leaves and joins), each with room for its block."""
        for req in list(self.cached):
            if len(self.cached) > 1 and (self.cached[req] > MAX_SEQ_LEN - 2 * self.q_len - 8 or
                                         self._rand(0, 100) < 12):
                self.pool.release(req)
                del self.cached[req]
        while len(self.cached) < MAX_BATCH and (not self.cached or self._rand(0, 100) < 35):
            self.join()
        active = sorted(self.cached)
        for req in active:
            self.pool.reserve(req, self.cached[req] + self.q_len)
        return active

    def accept(self, active):
        for req in active:
            self.cached[req] += self._rand(1, self.q_len + 1)


def _layers(q_len: int, seed: int):
    """(fast layers, reference layers with the same weights): one sliding, one full."""
    torch.manual_seed(seed)
    fast, ref = [], []
    for make in (DeploymentConfig.sliding, DeploymentConfig.full):
        cfg = make(kv_heads=2, q_len=q_len, max_seq_len=MAX_SEQ_LEN, max_batch=max(GRAPH_SIZES))
        layer = MuseAttentionDecode(cfg, device=DEV)
        layer.prepare()
        twin = MuseAttentionDecode(cfg, device=DEV, backend="reference")
        twin.qkv_weight.copy_(layer.qkv_weight)
        fast.append(layer)
        ref.append(twin)
    return fast, ref


def _stack(layers):
    def step(x, positions, slots, page_table, seq_lens, *caches):
        return [layer(x, positions, slots, cache, page_table, seq_lens) for layer, cache in zip(layers, caches)]
    return step


def _caches(n):
    out = []
    for _ in range(n):
        c = muse_ops.allocate_kv_cache(NUM_PAGES, 2, device=DEV)
        out.append((c, c.clone()))
    return out


class GraphRunner:
    """One hand-captured CUDA graph per padded batch size, over static input buffers."""

    def __init__(self, step, caches, q_len):
        self.step, self.caches, self.q_len, self.graphs = step, caches, q_len, {}

    def __call__(self, size, batch, x):
        if size not in self.graphs:
            static = {"x": x.clone(), "positions": batch.positions.clone(), "slots": batch.slots.clone(),
                      "page_table": batch.page_table.clone(), "seq_lens": batch.seq_lens.clone()}
            # warm up (and, for the first size, compile nothing new: prepare() did) on a side stream
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            scratch = [c.clone() for c in self.caches]
            with torch.cuda.stream(s):
                self.step(static["x"], static["positions"], static["slots"], static["page_table"],
                          static["seq_lens"], *scratch)
            torch.cuda.current_stream().wait_stream(s)
            del scratch
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = self.step(static["x"], static["positions"], static["slots"], static["page_table"],
                                 static["seq_lens"], *self.caches)
            self.graphs[size] = (graph, static, outs)
        graph, static, outs = self.graphs[size]
        static["x"].copy_(x)
        for k in ("positions", "slots", "page_table", "seq_lens"):
            static[k].copy_(getattr(batch, k))
        graph.replay()
        return outs


@pytest.mark.parametrize("q_len", [8, 1], ids=["verify", "decode"])
@pytest.mark.parametrize("mode", ["compile-default", "compile-reduce-overhead", "cuda-graph"])
def test_gpu_serving_50_steps_matches_reference(mode, q_len):
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    fast_layers, ref_layers = _layers(q_len, seed=7)
    pairs = _caches(len(fast_layers))
    fast_caches = [p[0] for p in pairs]
    ref_caches = [p[1] for p in pairs]
    serving = Serving(q_len, pairs, seed=11)
    ref_step = _stack(ref_layers)
    if mode == "cuda-graph":
        runner = GraphRunner(_stack(fast_layers), fast_caches, q_len)
    else:
        kw = {"mode": "reduce-overhead"} if mode == "compile-reduce-overhead" else {}
        if kw:
            for c in fast_caches:
                torch._dynamo.mark_static_address(c)
        compiled = torch.compile(_stack(fast_layers), fullgraph=True, dynamic=True, **kw)
    compiles_at = {}            # batch size -> compiled graphs after its first step
    sizes_seen = []
    gen = torch.Generator().manual_seed(13)
    with torch.inference_mode():
        for step in range(STEPS):
            active = serving.next_batch()
            r = len(active)
            sizes_seen.append(r)
            x = torch.randn(r * q_len, 8192, generator=gen).to(DEV, torch.bfloat16)
            exact = serving.pool.batch(active, q_len, device=DEV)
            if mode == "cuda-graph":
                size = next(s for s in GRAPH_SIZES if s >= r)
                padded = serving.pool.batch(active, q_len, pad_to=size, device=DEV)
                xp = torch.zeros(size * q_len, 8192, dtype=torch.bfloat16, device=DEV)
                xp[:r * q_len] = x
                outs = [o[:r * q_len] for o in runner(size, padded, xp)]
            else:
                outs = compiled(x, exact.positions, exact.slots, exact.page_table, exact.seq_lens, *fast_caches)
                graphs = counters["stats"]["unique_graphs"]
                if r in compiles_at:
                    assert graphs == compiles_at[r], f"step {step}: batch size {r} compiled again"
                compiles_at[r] = graphs
            refs = ref_step(x, exact.positions, exact.slots, exact.page_table, exact.seq_lens, *ref_caches)
            for i, (out, ref) in enumerate(zip(outs, refs)):
                assert_layer_close(out, ref.double(), what=f"step {step} layer {i} ({mode}) output")
            for i, (c, cr) in enumerate(zip(fast_caches, ref_caches)):
                assert_close(c, cr.double(), what=f"step {step} layer {i} ({mode}) cache")
            serving.accept(active)
        assert len(set(sizes_seen)) >= 3, sizes_seen          # the batch size did change
        assert serving.next_id > MAX_BATCH, "no request joined after the first ones"
        if mode == "compile-reduce-overhead":
            assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
        # 1000 more replays of the last step: nothing allocated
        torch.cuda.synchronize()
        before = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
        for _ in range(REPLAYS):
            if mode == "cuda-graph":
                runner.graphs[size][0].replay()
            else:
                compiled(x, exact.positions, exact.slots, exact.page_table, exact.seq_lens, *fast_caches)
        torch.cuda.synchronize()
        after = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
        assert after == before, f"memory grew over {REPLAYS} replays: {before} -> {after}"
