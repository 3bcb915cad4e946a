"""The benchmark's code path on CPU (python -m muse_ops bench --device cpu --quick): tiny cases on
the reference backend, wall-clock timing, JSON and the RESULTS.md section rendered."""
import json

from bench import run


def test_bench_cpu_quick(tmp_path, capsys):
    out = tmp_path / "bench.json"
    md = tmp_path / "bench.md"
    assert run.main(["--device", "cpu", "--quick", "--json", str(out), "--markdown", str(md)]) == 0
    res = json.loads(out.read_text())
    assert res["device_type"] == "cpu" and res["attn2"] and res["qkv_front"] and res["layer"]
    for op in ("attn2", "qkv_front", "layer"):
        for row in res[op]:
            assert row["results"]["muse:reference"]["us"] > 0
            assert "absent" in row["results"]["muse:cutedsl"]          # reported, not faked
            assert row["check"]["muse:reference"]["ok"]
    text = md.read_text()
    assert text.startswith("## ") and "attn2" in text and "### layer" in text and "muse:reference" in text
    assert "| case |" in capsys.readouterr().out
    results = tmp_path / "RESULTS.md"   # newest run first: the new section goes above the older one
    results.write_text("# header\n\n## Where each op stands now\n\n## 2026-01-01, an older run\n\nold table\n")
    assert run.main(["--render", str(out), "--append", str(results)]) == 0
    text = results.read_text()
    new_at = text.index("\n## ", text.index("## Where each op stands now") + 1)
    assert text.startswith("# header\n") and text.index("## 2026-01-01") > new_at
    assert text[new_at + 1:].startswith(md.read_text().split("\n")[0]) and text.endswith("old table\n")
    empty = tmp_path / "NEW.md"   # no dated run yet: at the end
    empty.write_text("# header\n")
    assert run.main(["--render", str(out), "--append", str(empty)]) == 0
    assert empty.read_text().startswith("# header\n\n## ")


def test_kernel_bound_names_what_bounds_each_kernel():
    """The bound column: a kernel at the slower of its bytes and its FLOPs, the layer's two kernels
    summed. Hand-computed at 4 TB/s and 800 TFLOPS: qkv_front M=1024 (Hkv 2) does 2 * 1024 * 8192 *
    2304 = 38.65 GFLOP (48.3 us) against 37.7 MB of weight (9.4 us), so it is tensor-bound; attn2
    B=128 L=8192 moves 128 * 2 * 8192 * 256 B of KV (134 us) and is HBM-bound."""
    from bench import cases as C, layer as LY
    floors = {"hbm_tbps": 4.0, "tensor_tflops": 800.0, "node_us": 1.0}
    front = C.qkv_case(1024)
    assert front.flops() == 2.0 * 1024 * 8192 * 2304
    us, by = run.kernel_bound([(front.bytes(), front.flops())], floors)
    assert by == "tensor" and abs(us - front.flops() / 800e12 * 1e6) < 1e-9
    attn = C.attn2_case((128, 8192, 0))
    # a spec may leave out q_len and Hkv; a q_len alone keeps the default Hkv
    decode = C.attn2_case((4, 8192, 0, 1))
    assert (decode.q_len, decode.kv_heads, decode.name) == (1, C.KV_HEADS, "B=4 L=8192 decode")
    assert (attn.q_len, attn.kv_heads) == (C.Q_LEN, C.KV_HEADS)
    assert C.attn2_case((1, 8192, 0, 8, 4)).kv_heads == 4
    kv = 128 * 2 * 8192 * 256
    assert kv < attn.bytes() < kv * 1.02
    us_a, by_a = run.kernel_bound([(attn.bytes(), attn.flops())], floors)
    assert by_a == "hbm" and abs(us_a - attn.bytes() / 4e12 * 1e6) < 1e-9
    layer = LY.layer_case((128, 8192, 0))
    us_l, by_l = run.kernel_bound(layer.kernels(), floors)
    assert by_l == "tensor+hbm" and abs(us_l - (us + us_a)) < 1e-9
    # the bound is never below one graph node, and never below the bytes floor of the same kernels
    one = C.qkv_case(1)
    assert run.kernel_bound([(one.bytes(), one.flops())], {**floors, "node_us": 50.0}) == (50.0, "hbm")
    assert us_l >= layer.bytes() / 4e12 * 1e6
