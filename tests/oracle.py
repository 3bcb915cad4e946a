"""Independent float64 evaluations of both ops for the tests.

Written apart from muse_ops/reference (which gathers whole pages and masks in batch) and from
muse_ops/float64_check: here every token is addressed through the page table one index at a
time, and every request gets an explicit [q_len, L] visibility matrix. bf16 roundings sit
exactly where DESIGN.md sections 3-4 put them.
"""
import torch

HEAD_DIM, GROUP, PAGE, EPS = 64, 8, 16, 1e-5


def bf16(t):
    return t.to(torch.bfloat16).to(torch.float64)


def rms(v):
    return v / torch.sqrt((v * v).sum(-1, keepdim=True) / v.shape[-1] + EPS)


def qkv_front_oracle(x, weight, positions, cos_sin, kv_heads):
    """float64 y [M, N] (bf16-valued)."""
    hq = GROUP * kv_heads
    p = bf16(x.double() @ weight.double().T)
    y = p.clone()
    for h in range(hq + kv_heads):  # q heads, then k heads: norm (+ rope)
        cols = slice(h * HEAD_DIM, (h + 1) * HEAD_DIM)
        n = bf16(rms(p[:, cols]))
        if cos_sin is not None:
            cs = cos_sin.double()[positions.long()]
            out = torch.empty_like(n)
            for i in range(HEAD_DIM // 2):
                c, s = cs[:, i], cs[:, HEAD_DIM // 2 + i]
                a, b = n[:, 2 * i], n[:, 2 * i + 1]
                out[:, 2 * i] = bf16(a * c - b * s)
                out[:, 2 * i + 1] = bf16(b * c + a * s)
            n = out
        y[:, cols] = n
    return y


def token_rows(kv_cache, page_table, r, length):
    """float64 [Hkv, L, 128]: request r's cache rows, token t at page_table[r, t // 16], row t % 16."""
    t = torch.arange(length)
    pages = page_table[r].long().cpu()[t // PAGE]
    return kv_cache.cpu()[pages, :, t % PAGE].double().permute(1, 0, 2)


def attn2_oracle(y, kv_cache, page_table, seq_lens, q_len, window, scale):
    """float64 out [q_len*R, Hq*64] before the final bf16 rounding."""
    kv_heads = kv_cache.shape[1]
    hq = GROUP * kv_heads
    y = y.double().cpu()
    gate0 = (hq + 2 * kv_heads) * HEAD_DIM
    out = torch.zeros(y.shape[0], hq * HEAD_DIM, dtype=torch.float64)
    for r, length in enumerate(seq_lens.tolist()):
        kv = token_rows(kv_cache, page_table, r, length)                 # [Hkv, L, 128]
        pos = torch.arange(length - q_len, length)[:, None]              # [q_len, 1]
        key = torch.arange(length)[None, :]
        visible = key <= pos
        if window:
            visible &= key > pos - window
        rows = slice(r * q_len, (r + 1) * q_len)
        q = y[rows, : hq * HEAD_DIM].view(q_len, hq, HEAD_DIM)
        gate = y[rows, gate0:].view(q_len, hq, HEAD_DIM)
        for h in range(hq):
            k, v = kv[h // GROUP, :, :HEAD_DIM], kv[h // GROUP, :, HEAD_DIM:]
            logits = scale * q[:, h] @ k.T
            logits = torch.where(visible, logits, torch.tensor(float("-inf"), dtype=torch.float64))
            w = torch.exp(logits - logits.max(-1, keepdim=True).values)
            w = w / w.sum(-1, keepdim=True)
            o = bf16(torch.where(visible, w, 0.0) @ torch.where(visible.any(0)[:, None], v, 0.0))
            out[rows, h * HEAD_DIM:(h + 1) * HEAD_DIM] = torch.sigmoid(gate[:, h]) * rms(o)
    return out


def assert_close_design(got, ref64, what="output"):
    """DESIGN.md section 7: |err| <= 2e-2 + 1e-2|ref| everywhere, mean |err| <= 2e-3."""
    got = got.double().cpu()
    ref64 = ref64.cpu()
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    err = (got - ref64).abs()
    bound = 2e-2 + 1e-2 * ref64.abs()
    worst = (err - bound).argmax()
    assert bool((err <= bound).all()), (f"{what}: max |err| {err.max():.3e} exceeds the bound at flat index "
                                        f"{int(worst)} (got {got.flatten()[worst]:.5f}, ref {ref64.flatten()[worst]:.5f})")
    assert float(err.mean()) <= 2e-3, f"{what}: mean |err| {err.mean():.3e} > 2e-3"
