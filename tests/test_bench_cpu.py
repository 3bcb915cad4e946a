"""The benchmark's code path on CPU (python -m muse_ops bench --device cpu --quick): tiny cases on
the reference backend, wall-clock timing, JSON and the RESULTS.md section rendered."""
import json

import pytest
import torch

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


# ------------------------------------------------------------------------------ FP8 cases
def test_fp8_case_bytes_count_the_kv_at_one_byte_per_element():
    """The floor of an FP8 case: its KV rows at 1 byte per element (half the bf16 case's), the rest
    (y's q and gate columns, out, page-table entries) unchanged, plus its two fp32 scales; the layer
    adds its inserted rows at 1 byte too. Hand-computed at B=128 L=16384 (Hkv 2, q_len 8)."""
    from bench import cases as C, layer as LY
    b16, b8 = C.attn2_case((128, 16384, 0)), C.attn2_case((128, 16384, 0), "fp8")
    assert (b8.name, b8.base_name, b16.base_name) == ("B=128 L=16384 fp8", "B=128 L=16384", "B=128 L=16384")
    kv16 = 128 * 16384 * 2 * 128 * 2
    assert b16.kv_bytes() == kv16 and b8.kv_bytes() == kv16 // 2
    rows, hq = 128 * 8, 16
    io = rows * (2 * hq * 64 * 2) + rows * hq * 64 * 2
    pt = 128 * (16384 // 16 + 1) * 4
    k, v = C.fp8_scales(2)
    assert len(k) == 1 and len(v) == 2 and 1.0 not in k + v
    assert b16.bytes() == kv16 + io + pt
    assert b8.bytes() == kv16 // 2 + io + pt + 4 * 3
    assert b8.scale_bytes() == 12 and b16.scale_bytes() == 0
    # a sliding case: the window-limited rows, at 1 byte
    w8 = C.attn2_case((64, 8192, 2048), "fp8")
    assert w8.kv_bytes() == 64 * (2048 + 8 - 1) * 2 * 128
    # the floor: bytes / bandwidth (run.summarize with measured floors of 4 TB/s, 1 us a node)
    floors = {"hbm_tbps": 4.0, "tensor_tflops": 800.0, "node_us": 1.0}
    for case, us in ((b16, 200.0), (b8, 100.0)):
        row = {"bytes": case.bytes(), "kernels": [(case.bytes(), case.flops())],
               "results": {"muse:cutedsl": {"us": us}}}
        run.summarize(row, floors, ())
        assert abs(row["floor_us"] - case.bytes() / 4e12 * 1e6) < 1e-9
        assert abs(row["ours_over_floor"] - us / row["floor_us"]) < 1e-12
    # the layer: weight + x + out + y's columns as before; the KV and the inserted rows at 1 byte
    l16, l8 = LY.layer_case((128, 8192, 0)), LY.layer_case((128, 8192, 0), "fp8")
    assert (l8.name, l8.cache_dtype, l8.config.cache_dtype) == ("B=128 L=8192 fp8", "fp8", torch.float8_e4m3fn)
    inserted16 = 128 * 8 * 2 * 2 * 64 * 2
    a16, a8 = l16.attn, l8.attn
    assert l16.bytes() - l8.bytes() == (a16.kv_bytes() - a8.kv_bytes()) + inserted16 // 2 - a8.scale_bytes()
    (fb16, _), (ab16, _) = l16.kernels()
    (fb8, _), (ab8, _) = l8.kernels()
    assert fb16 - fb8 == inserted16 // 2 - 12 and (ab16, ab8) == (a16.bytes(), a8.bytes())
    assert l8.front().cache_dtype == "fp8" and l8.front().flops() == l16.front().flops()


def test_every_fp8_suite_case_builds_on_the_cpu():
    """--suite fp8: every attn2 and layer case in both dtypes, its name, bytes, FLOPs, kernels and
    bound (the construction and arithmetic the GPU run does before it builds inputs)."""
    from bench import cases as C, layer as LY
    floors = {"hbm_tbps": 3.35, "tensor_tflops": 700.0, "node_us": 1.0}
    names = set()
    for spec in C.FP8_ATTN2_CASES:
        c16, c8 = C.attn2_case(spec), C.attn2_case(spec, "fp8")
        assert c8.name == c16.name + " fp8" and c8.flops() == c16.flops()
        assert c8.kv_bytes() * 2 == c16.kv_bytes() and c8.bytes() < c16.bytes()
        assert run.kernel_bound([(c8.bytes(), c8.flops())], floors)[1] == "hbm"
        names |= {c16.name, c8.name}
    for spec in LY.FP8_LAYER_CASES:
        l16, l8 = LY.layer_case(spec), LY.layer_case(spec, "fp8")
        assert l8.name == l16.name + " fp8" and l8.bytes() < l16.bytes()
        assert l8.config.rope == bool(spec[2]) and l8.config.cache_dtype == torch.float8_e4m3fn
        run.kernel_bound(l8.kernels(), floors)
        names |= {l16.name, l8.name}
    assert len(names) == 2 * (len(C.FP8_ATTN2_CASES) + len(LY.FP8_LAYER_CASES)) - 2 * len(
        {C.attn2_case(s).name for s in C.FP8_ATTN2_CASES} & {LY.layer_case(s).name for s in LY.FP8_LAYER_CASES})
    want = {"B=128 L=16384", "B=128 L=16384 decode", "B=16 L=65536", "B=8 L=32768", "B=32 L=4096 Hkv=16",
            "B=64 L=8192", "B=1 L=8192", "B=64 L=8192 W=2048"}
    assert {C.attn2_case(s).name for s in C.FP8_ATTN2_CASES} == want
    assert {LY.layer_case(s).name for s in LY.FP8_LAYER_CASES} == {
        f"B={b} L=8192" + w for b in (1, 8, 32, 64, 128) for w in ("", " W=2048")}


def test_fp8_inputs_hold_scaled_e4m3_of_normal_values():
    """An FP8 case's cache: e4m3 bytes whose dequantized values (x scale: k per tensor, v per KV
    head) are N(0,1); the scales are the case's, as fp32 tensors."""
    from bench import cases as C
    case = C.attn2_case((2, 300, 0, 8, 3), "fp8")
    inp = C.build_attn2(case, "cpu", 1, sets=2)
    assert inp.kv_cache.dtype == torch.float8_e4m3fn and inp.k_scale.tolist() == [
        pytest.approx(v) for v in case.scales[0]]
    assert inp.v_scale.numel() == 3 and len(set(inp.v_scale.tolist())) == 3
    kv = inp.kv_cache.float()
    k = kv[..., :64] * inp.k_scale
    v = kv[..., 64:] * inp.v_scale[None, :, None, None]
    for t in (k, v):
        assert torch.isfinite(t).all() and abs(float(t.mean())) < 0.05 and abs(float(t.std()) - 1) < 0.05
    assert C.build_attn2(C.attn2_case((2, 300, 0)), "cpu", 1, sets=1).k_scale is None


def test_kv_capacity_table():
    """tokens = 90% of the GPU's GiB / (Hkv x 128 x element size): FP8 holds twice bf16's."""
    from bench import cases as C
    assert C.kv_cache_tokens(80, 2, "bf16") == int(80 * 2**30 * 0.9) // 512 == 150_994_944
    assert C.kv_cache_tokens(80, 2, "fp8") == 301_989_888
    assert C.kv_cache_tokens(141, 16, "bf16") == int(141 * 2**30 * 0.9) // 4096
    assert C.kv_cache_tokens(141, 16, "fp8") == int(141 * 2**30 * 0.9) // 2048
    rows = C.kv_tokens_table()
    assert [(r["gpu_gb"], r["kv_heads"]) for r in rows] == [(80, 2), (80, 16), (141, 2), (141, 16)]
    for r in rows:
        assert r["bytes_per_token"] == {"bf16": r["kv_heads"] * 256, "fp8": r["kv_heads"] * 128}
        assert r["tokens"]["fp8"] in (2 * r["tokens"]["bf16"], 2 * r["tokens"]["bf16"] + 1)
    text = C.format_kv_tokens_table(rows)
    assert "90%" in text and "| 80 GB | 2 | 512 | 256 | 150,994,944 | 301,989,888 | 2.00 |" in text


def _row(case, results, ran=None, check=None):
    return {"case": case.name, "base": case.base_name, "cache_dtype": case.cache_dtype, "bytes": case.bytes(),
            "kernels": [(case.bytes(), case.flops())], "results": results, "ran": ran or {},
            "eager_us": {}, "check": check or {}, "note": "", "sets": 1}


def test_fp8_table_sets_each_fp8_row_beside_its_bf16_row():
    """The side-by-side table from (synthetic) GPU rows: muse FP8 us with what ran, its floor and
    ratio, muse bf16 us, bf16 / FP8, every FP8 peer (absent ones say so), best paged peer / ours;
    the layer's stock paths in both dtypes. The markdown carries it and the capacity table."""
    from bench import cases as C, layer as LY
    floors = {"hbm_tbps": 4.0, "tensor_tflops": 800.0, "node_us": 1.0}
    c16, c8 = C.attn2_case((128, 16384, 0)), C.attn2_case((128, 16384, 0), "fp8")
    r16 = _row(c16, {"muse:cutedsl": {"us": 140.0}, "flashinfer+normgate": {"us": 160.0},
                     "fa3(contig)+normgate": {"us": 150.0}}, ran={"muse:cutedsl": {"attn2": "cutedsl"}})
    r8 = _row(c8, {"muse:cutedsl": {"absent": "no FP8 kernel"}, "muse:default": {"us": 700.0},
                   "flashinfer+normgate": {"us": 90.0}, "fa3(contig)+normgate": {"us": 85.0}},
              ran={"muse:default": {"attn2": "reference"}})
    w8 = _row(C.attn2_case((64, 8192, 2048), "fp8"), {"muse:cutedsl": {"us": 20.0},
                                                      "flashinfer+normgate": {"absent": "no window"}},
              ran={"muse:cutedsl": {"attn2": "cutedsl"}})
    names = ["muse:cutedsl", "muse:default", "flashinfer+normgate", "fa3(contig)+normgate"]
    for r in (r16, r8, w8):
        run.summarize(r, floors, run.PEERS_ATTN2)
    assert r8["ours"] == "muse:default" and r8["best_peer"] == "flashinfer+normgate"
    t = run.format_fp8_table("attn2", [r16, r8, w8], names, "### t")
    lines = t.split("\n")
    assert lines[1].split(" | ")[:7] == ["| case", "muse FP8 us", "FP8 floor us", "FP8 ours/floor", "FP8 bound us",
                                         "muse bf16 us", "bf16 / FP8"]
    assert "flashinfer+normgate FP8" in lines[1] and "fa3(contig)+normgate FP8" in lines[1]
    b128 = lines[3].split(" | ")
    assert b128[0] == "| B=128 L=16384" and b128[1] == "700.0 (reference)"
    assert b128[2] == f"{c8.bytes() / 4e12 * 1e6:.1f}" and b128[3] == f"{700.0 / (c8.bytes() / 4e12 * 1e6):.2f}"
    assert b128[5] == "140.0" and b128[6] == f"{140.0 / 700.0:.2f}" and b128[7:9] == ["90.0", "85.0"]
    assert b128[9].startswith(f"{90.0 / 700.0:.2f} (flashinfer+normgate)")
    w = lines[4].split(" | ")
    assert w[0] == "| B=64 L=8192 W=2048" and w[1] == "20.0" and w[5] == "-" and w[7] == "absent"
    # the layer: muse (qkv_front's kernel, attn2's reference) against both stock paths, both dtypes
    l16, l8 = LY.layer_case((8, 8192, 0)), LY.layer_case((8, 8192, 0), "fp8")
    lr16 = _row(l16, {"muse:cutedsl": {"us": 30.0}, "stock": {"us": 46.0}, "stock(fa3)": {"absent": "x"}},
                ran={"muse:cutedsl": {"qkv_front": "cutedsl", "attn2": "cutedsl"}})
    lr8 = _row(l8, {"muse:cutedsl": {"absent": "attn2"}, "muse:default": {"us": 60.0}, "stock": {"us": 40.0}},
               ran={"muse:default": {"qkv_front": "cutedsl", "attn2": "reference"}})
    for r in (lr16, lr8):
        run.summarize(r, floors, LY.PEERS_LAYER)
    lt = run.format_fp8_table("layer", [lr16, lr8], ["muse:cutedsl", "muse:default", "stock", "stock(fa3)"], "### l")
    head, row = lt.split("\n")[1], lt.split("\n")[3].split(" | ")
    assert "stock FP8 | stock(fa3) FP8 | stock bf16 | stock(fa3) bf16" in head
    assert row[1] == "60.0 (qkv_front cutedsl, attn2 reference)" and row[5] == "30.0" and row[6] == "0.50"
    assert row[7:11] == ["40.0", "-", "46.0", "absent"] and row[11].startswith("0.67 (stock)")
    result = {"env": {"date": "2026-12-06", "gpu": "NVIDIA H100"}, "floors": floors, "device_type": "cuda",
              "attn2_names": names, "attn2": [r16, r8, w8], "layer_names": ["muse:cutedsl", "muse:default", "stock"],
              "layer": [lr16, lr8], "qkv_front": [], "qkv_names": [], "chain": []}
    md = run.render_markdown(result)
    assert "### attn2: FP8 cache beside bf16 (us)" in md and "### layer: FP8 cache beside bf16 (us)" in md
    assert "### KV cache capacity" in md and "FP8 rows (case name ending in fp8)" in md
    assert "| B=128 L=16384 fp8 | absent | 700.0 (reference) |" in md          # the main table's label
    # no FP8 row: neither table nor notes
    plain = dict(result, attn2=[r16], layer=[lr16])
    text = run.render_markdown(plain)
    assert "FP8 cache beside" not in text and "KV cache capacity" not in text


def test_muse_default_is_timed_where_no_muse_backend_of_the_run_times_the_same(tmp_path):
    """muse:default (no backend named) is absent where muse:<its pick> is in the run, and runs,
    labelled with what ran (muse_ops.last_backend), where it is not."""
    out = tmp_path / "b.json"
    assert run.main(["--device", "cpu", "--cases", "attn2", "--cache-dtype", "fp8", "--contenders", "muse:cutedsl",
                     "muse:default", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["cache_dtypes"] == ["fp8"] and all(r["case"].endswith(" fp8") for r in res["attn2"])
    for r in res["attn2"]:
        assert r["results"]["muse:default"]["us"] > 0 and r["ran"]["muse:default"] == {"attn2": "reference"}
        assert r["ours"] == "muse:default" and r["check"]["muse:default"]["ok"]
    assert run.main(["--device", "cpu", "--cache-dtype", "fp9"]) == 2


def test_render_merges_the_contenders_of_several_runs(tmp_path):
    """Two runs' JSON in one section: the second's contenders join the first's columns."""
    from bench import cases as C
    c = C.attn2_case((1, 8192, 0), "fp8")
    a = {"env": {"commit": "a"}, "attn2_names": ["muse:cutedsl", "flashinfer+normgate"],
         "attn2": [_row(c, {"muse:cutedsl": {"us": 9.0}, "flashinfer+normgate": {"us": 12.0}})]}
    b = {"env": {"commit": "b"}, "attn2_names": ["muse:cutedsl", "fa3(contig)+normgate"],
         "attn2": [_row(c, {"muse:cutedsl": {"us": 9.5}, "fa3(contig)+normgate": {"us": 11.0}})]}
    paths = []
    for i, r in enumerate((a, b)):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(r))
    md = tmp_path / "m.md"
    md.write_text("# results\n")
    assert run.main(["--render", *map(str, paths), "--append", str(md)]) == 0
    text = md.read_text()
    assert "| case | muse:cutedsl | flashinfer+normgate | fa3(contig)+normgate |" in text
    assert "| B=1 L=8192 fp8 | 9.0 | 12.0 | 11.0 |" in text


# ------------------------------------------------------------------------------ the FP8 peers' plumbing (CPU)
def test_fa3_peer_aliases_its_config_and_is_absent_with_a_reason(tmp_path, monkeypatch):
    """The wheel's interface imports flash_attn_config: fa3_peer aliases fa3_fwd_config under that
    name first (a stand-in wheel here); without the wheel, Absent says how to install it; the
    wheel's build flags rule out sliding windows."""
    import sys
    from bench import fa3_peer
    for m in ("fa3_fwd_config", "fa3_fwd_interface", "flash_attn_config"):
        monkeypatch.delitem(sys.modules, m, raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "fa3" not in p])
    with pytest.raises(fa3_peer.Absent, match="fa3_device_env.sh"):
        fa3_peer.interface()
    assert fa3_peer.version() is None or isinstance(fa3_peer.version(), str)
    (tmp_path / "fa3_fwd_config.py").write_text(
        "CONFIG = {'build_flags': {'FLASHATTENTION_DISABLE_LOCAL': True, 'FLASHATTENTION_DISABLE_PAGEDKV': True}}\n")
    (tmp_path / "fa3_fwd_interface.py").write_text(
        "from flash_attn_config import CONFIG\nLOCAL_OFF = CONFIG['build_flags']['FLASHATTENTION_DISABLE_LOCAL']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = fa3_peer.interface()
    assert mod.LOCAL_OFF is True and sys.modules["flash_attn_config"] is sys.modules["fa3_fwd_config"]
    fa3_peer.check_case(0)
    with pytest.raises(fa3_peer.Absent, match="FLASHATTENTION_DISABLE_LOCAL"):
        fa3_peer.check_case(2048)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_fa3_contiguous_caches_hold_each_requests_tokens(dtype):
    """FA3's [B, Lmax, Hkv, 64] K and V, gathered from the pages: request b's token t at [b, t], the
    same bytes as the paged cache (float64 oracle's token_rows, undequantized)."""
    from bench import cases as C, fa3_peer
    from muse_ops.testing import token_rows
    case = C.Attn2Case("mixed", [37, 100, 16, 61], 0, 100, cache_dtype=dtype)
    inp = C.build_attn2(case, "cpu", 1, sets=2)
    for s in range(2):
        k, v = fa3_peer.contiguous_caches(inp.kv_cache, inp.page_tables[s], case.lens)
        assert k.shape == (4, 112, 2, 64) and k.dtype == inp.kv_cache.dtype
        assert k.is_contiguous() and v.is_contiguous()
        for b in range(4):
            L = case.lens[b]
            rows = token_rows(inp.kv_cache, inp.page_tables[s], b, 0, L).permute(1, 0, 2)   # [L, Hkv, 128]
            assert torch.equal(torch.cat((k[b, :L], v[b, :L]), -1).double(), rows)
    one = torch.tensor([0.5])
    d = fa3_peer.descales(one, 3, 2)
    assert d.shape == (3, 2) and d.is_contiguous() and bool((d == 0.5).all())
    assert fa3_peer.descales(torch.tensor([1.0, 2.0]), 2, 2).tolist() == [[1.0, 2.0], [1.0, 2.0]]


def test_fa3_slots_address_the_block_in_the_contiguous_caches():
    """stock(fa3)'s insert: the Triton kernel writes token (b, pos) at row b * Lmax + pos of FA3's
    caches seen as 16-row pages (interpreted on the CPU); e4m3 with the case's scales."""
    from bench import cases as C, fa3_peer, stock_triton
    from bench.layer import fa3_slots
    from muse_ops.reference import quantize_rows
    if not stock_triton.HAVE_TRITON:
        pytest.skip("triton not importable")
    lens = [37, 20]
    seq = torch.tensor(lens, dtype=torch.int32)
    lmax = fa3_peer.padded_len(lens)
    slots = fa3_slots(seq, 8, lmax)
    assert slots.tolist() == [p for b, L in enumerate(lens) for p in range(b * lmax + L - 8, b * lmax + L)]
    kv_heads = 2
    k = torch.full((2, lmax, kv_heads, 64), 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn)
    v = k.clone()
    y = torch.randn(16, 1152 * kv_heads).to(torch.bfloat16)
    ks, vs = (torch.tensor(s, dtype=torch.float32) for s in C.fp8_scales(kv_heads))
    pos = torch.tensor([p for L in lens for p in range(L - 8, L)])
    stock_triton.qk_norm_rope_insert(y, pos, slots, None, k.view(-1, 16, kv_heads, 64), v.view(-1, 16, kv_heads, 64),
                                     kv_heads, k_scale=ks, v_scale=vs)
    yk = y.view(16, -1, 64)
    rows = torch.cat((yk[:, 16:18], yk[:, 18:20]), -1)
    want = quantize_rows(rows, ks, vs).view(torch.uint8)
    got = torch.cat((k, v), -1).view(torch.uint8)
    for t, (b, p) in enumerate((b, p) for b, L in enumerate(lens) for p in range(L - 8, L)):
        assert torch.equal(got[b, p], want[t])
    assert int((got != 0x7F).any(-1).any(-1).sum()) == 16        # nothing else written


def test_flashinfer_fp8_plumbing():
    """FlashInfer's scales: k one float (per KV head refused), v a float or [Hq, 1] (each query
    head its KV head's); its HND caches of an e4m3 cache are the same bytes."""
    from bench import cases as C, flashinfer_peer as FP
    ks, vs = (torch.tensor(s, dtype=torch.float32) for s in C.fp8_scales(2))
    k, v = FP.fp8_scales(ks, vs, 2)
    assert k == pytest.approx(float(ks[0])) and v.shape == (16, 1)
    assert v[:8].eq(vs[0]).all() and v[8:].eq(vs[1]).all()
    assert FP.fp8_scales(ks, torch.tensor([0.5]), 2) == (pytest.approx(float(ks[0])), 0.5)
    assert FP.fp8_scales(torch.tensor([0.2, 0.2]), torch.tensor([0.5, 0.5]), 2) == (pytest.approx(0.2), 0.5)
    with pytest.raises(FP.Absent, match="one k_scale"):
        FP.fp8_scales(torch.tensor([0.1, 0.2]), vs, 2)
    inp = C.build_attn2(C.attn2_case((1, 40, 0), "fp8"), "cpu", 1, sets=1)
    hk, hv = FP.hnd_caches(inp.kv_cache)
    assert hk.dtype == torch.float8_e4m3fn and hk.is_contiguous() and hk.shape == (3, 2, 16, 64)
    assert torch.equal(torch.cat((hk, hv), -1).view(torch.uint8), inp.kv_cache.view(torch.uint8))
    with pytest.raises(FP.Absent, match="without a window"):
        FP.PagedAttention(inp.page_tables, inp.seq_lens, hk, hv, q_len=8, q_heads=16, kv_heads=2, window=2048,
                          scale=0.68, k_scale=k, v_scale=v)


# A stand-in for the fa3-fwd wheel's interface with FA3's documented semantics, in torch: causal
# aligned to the end of each request's cache_seqlens keys, query head h reads KV head h // (Hq /
# Hkv), descales (batch, Hkv) multiply q, k and v, output bf16 [B, Sq, Hq, D]
FA3_STAND_IN = '''
import torch
from flash_attn_config import CONFIG
calls = []

def flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), q_descale=None, k_descale=None, v_descale=None, **kw):
    assert causal and window_size == (-1, -1) and cache_seqlens.dtype == torch.int32 and q.stride(-1) == 1
    assert (q.dtype == torch.float8_e4m3fn) == (k_cache.dtype == torch.float8_e4m3fn) == (q_descale is not None)
    calls.append(q.dtype)
    b, sq, hq, d = q.shape
    hkv = k_cache.shape[2]
    g = hq // hkv
    one = torch.ones(b, hkv)
    qd, kd, vd = (one if t is None else t.float() for t in (q_descale, k_descale, v_descale))
    out = torch.empty(b, sq, hq, d, dtype=torch.bfloat16)
    for r in range(b):
        L = int(cache_seqlens[r])
        for h in range(hq):
            kh = h // g
            k = k_cache[r, :L, kh].double() * float(kd[r, kh])
            v = v_cache[r, :L, kh].double() * float(vd[r, kh])
            qq = q[r, :, h].double() * float(qd[r, kh])
            s = (qq @ k.T) * softmax_scale
            keep = torch.arange(L)[None, :] <= (L - sq + torch.arange(sq))[:, None]
            p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1)
            out[r, :, h] = (p @ v).to(torch.bfloat16)
    return out
'''


@pytest.fixture
def fa3_stand_in(tmp_path, monkeypatch):
    import sys
    for m in ("fa3_fwd_config", "fa3_fwd_interface", "flash_attn_config"):
        monkeypatch.delitem(sys.modules, m, raising=False)
    (tmp_path / "fa3_fwd_config.py").write_text(
        "CONFIG = {'build_flags': {'FLASHATTENTION_DISABLE_LOCAL': True, 'FLASHATTENTION_DISABLE_PAGEDKV': True}}\n")
    (tmp_path / "fa3_fwd_interface.py").write_text(FA3_STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for m in ("fa3_fwd_config", "fa3_fwd_interface", "flash_attn_config"):
        sys.modules.pop(m, None)


def _q_in_e4m3(y: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """y with its q columns rounded to e4m3 (what FA3's FP8 path reads)."""
    yq = y.clone()
    n = 8 * kv_heads * 64
    yq[:, :n] = y[:, :n].to(torch.float8_e4m3fn).to(y.dtype)
    return yq


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("q_len", [8, 1])
def test_fa3_contender_plumbing_with_a_stand_in(fa3_stand_in, dtype, q_len):
    """The fa3(contig) contenders on the CPU through a stand-in interface: the contiguous caches,
    cache_seqlens, q from y's columns (FP8: cast to e4m3, descales ones / k_scale / v_scale per
    request and KV head) and the norm-gate give attn2's float64 result (FP8: of q rounded to e4m3);
    the attention alone ("attn only") is the same before the norm-gate, its q cast beforehand."""
    import sys
    from bench import cases as C, contenders as K
    from muse_ops.testing import attn2_f64, tolerance_report
    case = C.Attn2Case("t", [40, 77, 9], 0, 128, kv_heads=2, q_len=q_len, cache_dtype=dtype)
    inp = C.build_attn2(case, "cpu", 1, sets=2)
    full = K._fa3("fa3(contig)+normgate", inp)
    alone = K._fa3("fa3(contig) (attn only)", inp)
    for i in range(2):
        y = inp.ys[i]
        ref = attn2_f64(_q_in_e4m3(y, 2) if dtype == "fp8" else y, inp.kv_cache, inp.page_tables[i], inp.seq_lens,
                        q_len=q_len, window=0, scale=case.scale, k_scale=inp.k_scale, v_scale=inp.v_scale)
        rep = tolerance_report(full(i), ref)
        assert rep["ok"], rep
        o = alone(i)
        assert o.shape == (3 * q_len, 16 * 64)
        from bench import stock_triton
        assert torch.equal(stock_triton.norm_gate(o, y, 2), full(i))
    calls = sys.modules["fa3_fwd_interface"].calls
    assert set(calls) == {torch.float8_e4m3fn if dtype == "fp8" else torch.bfloat16}
    with pytest.raises(K.Absent, match="FLASHATTENTION_DISABLE_LOCAL"):
        K._fa3("fa3(contig)+normgate", C.build_attn2(C.Attn2Case("w", [40], 16, 64, cache_dtype=dtype), "cpu", 1,
                                                     sets=1))


def _record_inserts(monkeypatch, stock_triton) -> list:
    """The projections y the stock path's Triton insert sees, in call order (the kernel's own y)."""
    ys = []
    insert = stock_triton.qk_norm_rope_insert

    def recording(p, *args, **kw):
        out = insert(p, *args, **kw)
        ys.append(p.clone())
        return out
    monkeypatch.setattr(stock_triton, "qk_norm_rope_insert", recording)
    return ys


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_stock_fa3_layer_with_a_stand_in(fa3_stand_in, monkeypatch, dtype):
    """stock(fa3) on the CPU through the stand-in: torch.matmul in cuBLAS's place, the Triton insert
    (FP8: quantizing) into FA3's contiguous caches at rows b * Lmax + pos (each request's history
    kept), FA3, the norm-gate: attn2's float64 result on the step's own y (the interpreter rounds
    bf16 by truncation, so the y is the kernel's) and the paged cache with its rows inserted (FP8:
    with q rounded to e4m3, as FA3's FP8 path reads it)."""
    from bench import layer as LY, stock_triton
    from muse_ops.reference import quantize_rows
    from muse_ops.testing import attn2_f64, inserted_rows_f64, tolerance_report
    case = LY.LayerCase(LY.C.Attn2Case("t", [40, 77], 0, 128, kv_heads=1, q_len=8, cache_dtype=dtype))
    inp = LY.build_layer(case, "cpu", 1, sets=1)
    pool = inp.kv.kv_cache.clone()
    ys = _record_inserts(monkeypatch, stock_triton)
    out = LY._stock_fa3(inp, "cpu")(0)
    y = ys[-1]
    rows = inserted_rows_f64(y.double(), 1).to(torch.bfloat16)              # the step's own k' | v
    if dtype == "fp8":
        rows = quantize_rows(rows, inp.kv.k_scale, inp.kv.v_scale)
    k, v = inp.kv.extra["fa3_k"][0], inp.kv.extra["fa3_v"][0]
    raw = lambda t: t.view(torch.uint8) if dtype == "fp8" else t            # noqa: E731
    lmax = k.shape[1]
    for t, s in enumerate(LY.fa3_slots(inp.kv.seq_lens, 8, lmax).tolist()):
        assert torch.equal(raw(torch.cat((k[s // lmax, s % lmax], v[s // lmax, s % lmax]), -1)), raw(rows[t]))
    slots = inp.slots[0]
    raw(pool)[slots // 16, :, slots % 16] = raw(rows)
    ref = attn2_f64(_q_in_e4m3(y, 1) if dtype == "fp8" else y, pool, inp.kv.page_tables[0], inp.kv.seq_lens, q_len=8,
                    window=0, scale=case.attn.scale, k_scale=inp.kv.k_scale, v_scale=inp.kv.v_scale)
    rep = tolerance_report(out, ref)
    assert rep["ok"], rep


# A stand-in for FlashInfer 0.7.2's two paged wrappers as bench/flashinfer_peer.py drives them, in
# torch, with the semantics of its sources: HND K/V [pages, Hkv, 16, D], a request's keys the pages
# indices[indptr[r]:indptr[r + 1]] (last_page_len rows of the last), causal aligned to the end of its
# keys, window_left W - 1, k_scale multiplied into sm_scale, `out *= v_scale` after the kernel
FLASHINFER_STAND_IN = '''
import torch
__version__ = "stand-in"
calls = []

class _Wrapper:
    def __init__(self, ws, kv_layout="NHD", backend="auto", use_tensor_cores=False):
        assert kv_layout == "HND"

    def _plan(self, qo_indptr, indptr, indices, last, hq, hkv, d, page, causal, sm_scale, window_left, q_data_type,
              kv_data_type):
        self.qo, self.indptr, self.last = qo_indptr, indptr, last
        self._paged_kv_indices_buf = indices
        self.hq, self.hkv, self.page, self.causal = hq, hkv, page, causal
        self.sm_scale, self.window_left = sm_scale, window_left
        self.kv_dtype = kv_data_type

    def run(self, q, kv, k_scale=None, v_scale=None):
        k_cache, v_cache = kv
        assert k_cache.dtype == self.kv_dtype and q.dtype == torch.bfloat16
        calls.append((self.kv_dtype, k_scale, None if v_scale is None else type(v_scale).__name__))
        sm = self.sm_scale * (1.0 if k_scale is None else k_scale)
        out = torch.empty(q.shape, dtype=torch.bfloat16)
        g = self.hq // self.hkv
        for r in range(self.indptr.numel() - 1):
            pages = self._paged_kv_indices_buf[int(self.indptr[r]):int(self.indptr[r + 1])].long()
            L = (pages.numel() - 1) * self.page + int(self.last[r])
            k = k_cache[pages].double().permute(1, 0, 2, 3).reshape(self.hkv, -1, k_cache.shape[-1])[:, :L]
            v = v_cache[pages].double().permute(1, 0, 2, 3).reshape(self.hkv, -1, v_cache.shape[-1])[:, :L]
            q0, q1 = int(self.qo[r]), int(self.qo[r + 1])
            pos = L - (q1 - q0) + torch.arange(q1 - q0)
            keep = torch.arange(L)[None, :] <= pos[:, None]
            if self.window_left >= 0:
                keep &= torch.arange(L)[None, :] >= (pos - self.window_left)[:, None]
            for h in range(self.hq):
                s = (q[q0:q1, h].double() @ k[h // g].T) * sm
                out[q0:q1, h] = (torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v[h // g]).to(torch.bfloat16)
        if v_scale is not None and not (isinstance(v_scale, float) and v_scale == 1.0):
            out *= v_scale
        return out

class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    def plan(self, qo_indptr, indptr, indices, last, hq, hkv, d, page, causal=False, sm_scale=None, window_left=-1,
             q_data_type=None, kv_data_type=None):
        self._plan(qo_indptr, indptr, indices, last, hq, hkv, d, page, causal, sm_scale, window_left, q_data_type,
                   kv_data_type)

class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    def plan(self, indptr, indices, last, hq, hkv, d, page, window_left=-1, q_data_type=None, kv_data_type=None,
             sm_scale=None):
        qo = torch.arange(indptr.numel(), dtype=torch.int32)
        self._plan(qo, indptr, indices, last, hq, hkv, d, page, True, sm_scale, window_left, q_data_type, kv_data_type)
'''


@pytest.fixture
def flashinfer_stand_in(tmp_path, monkeypatch):
    import sys
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    (tmp_path / "flashinfer.py").write_text(FLASHINFER_STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("flashinfer", None)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("q_len,window", [(8, 0), (1, 0), (8, 16)])
def test_flashinfer_contender_plumbing_with_a_stand_in(flashinfer_stand_in, dtype, q_len, window):
    """The flashinfer contenders on the CPU through a stand-in of its wrappers: its HND caches (FP8:
    e4m3 bytes), kv_data_type, k_scale a float (into sm_scale), v_scale per KV head as a [Hq, 1]
    tensor, each set's pages, the norm-gate: attn2's float64 result; an FP8 case with a window is
    absent (no such prebuilt kernel)."""
    import sys
    from bench import cases as C, contenders as K
    from muse_ops.testing import attn2_f64, tolerance_report
    case = C.Attn2Case("t", [40, 77, 9 if window == 0 else 30], window, 128, kv_heads=2, q_len=q_len,
                       cache_dtype=dtype)
    inp = C.build_attn2(case, "cpu", 1, sets=2)
    if dtype == "fp8" and window:
        with pytest.raises(K.Absent, match="without a window"):
            K._flashinfer("flashinfer+normgate", inp)
        return
    fn = K._flashinfer("flashinfer+normgate", inp)
    for i in range(2):
        ref = attn2_f64(inp.ys[i], inp.kv_cache, inp.page_tables[i], inp.seq_lens, q_len=q_len, window=window,
                        scale=case.scale, k_scale=inp.k_scale, v_scale=inp.v_scale)
        rep = tolerance_report(fn(i), ref)
        assert rep["ok"], rep
    kv_dtype, k_scale, v_scale = sys.modules["flashinfer"].calls[-1]
    if dtype == "fp8":
        assert kv_dtype == torch.float8_e4m3fn and k_scale == pytest.approx(C.FP8_K_SCALE) and v_scale == "Tensor"
    else:
        assert (kv_dtype, k_scale, v_scale) == (torch.bfloat16, None, None)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_stock_layer_with_a_flashinfer_stand_in(flashinfer_stand_in, monkeypatch, dtype):
    """The stock layer on the CPU through the stand-in: the Triton insert (FP8: quantizing) into
    FlashInfer's HND caches at the step's slots, FlashInfer with its scales, the norm-gate: attn2's
    float64 result on the step's own y and the paged cache with its rows inserted."""
    from bench import layer as LY, stock_triton
    from muse_ops.reference import quantize_rows
    from muse_ops.testing import attn2_f64, inserted_rows_f64, tolerance_report
    case = LY.LayerCase(LY.C.Attn2Case("t", [40, 77], 0, 128, kv_heads=1, q_len=8, cache_dtype=dtype))
    inp = LY.build_layer(case, "cpu", 1, sets=2)
    pool = inp.kv.kv_cache.clone()
    ys = _record_inserts(monkeypatch, stock_triton)
    fn = LY._stock(inp, "cpu")
    raw = lambda t: t.view(torch.uint8) if dtype == "fp8" else t            # noqa: E731
    for i in range(2):
        out = fn(i)
        rows = inserted_rows_f64(ys[-1].double(), 1).to(torch.bfloat16)
        if dtype == "fp8":
            rows = quantize_rows(rows, inp.kv.k_scale, inp.kv.v_scale)
        slots = inp.slots[i]
        raw(pool)[slots // 16, :, slots % 16] = raw(rows)
        ref = attn2_f64(ys[-1], pool, inp.kv.page_tables[i], inp.kv.seq_lens, q_len=8, window=0,
                        scale=case.attn.scale, k_scale=inp.kv.k_scale, v_scale=inp.kv.v_scale)
        rep = tolerance_report(out, ref)
        assert rep["ok"], rep


def test_every_serving_suite_case_builds_on_the_cpu():
    """--suite serving (issue 49): qkv_front from 128 to 2048 tokens at Hkv 2 and 512 / 1024 tokens
    at Hkv 1, 4, 8, 16, each beside cuBLAS's matmul; the layer at B = 1 to 128 (L=8192, full and
    sliding) and TP1 B=32 L=4096."""
    from bench import cases as C, layer as LY
    floors = {"hbm_tbps": 3.35, "tensor_tflops": 700.0, "node_us": 1.0}
    qkv = [C.qkv_case(s) for s in C.SERVING_QKV_CASES]
    names = {c.name for c in qkv}
    assert {f"M={m}" for m in (128, 768, 1024, 1536, 2048)} <= names
    assert {f"M={m} Hkv={h}" for m in (512, 1024) for h in (1, 4, 8, 16)} <= names
    from bench import contenders
    assert "cublas" in contenders.qkv_contenders("cuda")   # the matmul alone, timed beside every row
    for c in qkv:
        assert c.flops() == 2.0 * c.m * 8192 * 1152 * c.kv_heads
        run.kernel_bound([(c.bytes(), c.flops())], floors)
    layers = [LY.layer_case(s) for s in LY.SERVING_LAYER_CASES]
    assert {"B=128 L=8192", "B=128 L=8192 W=2048", "B=32 L=4096 Hkv=16"} <= {c.name for c in layers}


def test_round_robin_opens_each_round_with_the_reference_and_rotates_what_follows_it(monkeypatch):
    """bench.timing.round_robin_us (the A/B tools' timing): the reference graph opens every round,
    and each graph follows it in one round of every len(graphs), so the bias of the slot right
    after cuBLAS lands on each graph once; every graph is timed once a round."""
    from bench import timing as T
    order = []
    monkeypatch.setattr(T, "time_graph_us", lambda graph, calls, n_sets, replays: order.append(graph) or {"us": 1.0})
    times, ref = T.round_robin_us([("a", 1), ("b", 1), ("c", 1)], ("ref", 1), n_sets=2, rounds=3)
    assert order == ["ref", "a", "b", "c", "ref", "b", "c", "a", "ref", "c", "a", "b"]
    assert [len(t) for t in times] == [3, 3, 3] and len(ref) == 3


def test_reverse_order_times_the_contenders_last_to_first_and_keeps_the_columns(tmp_path, capsys):
    """--reverse-order runs each case's contenders from the last to the first (a check of whether
    a contender's slot after another changes its time); the result's columns stay in their order."""
    out = tmp_path / "r.json"
    assert run.main(["--device", "cpu", "--cases", "M=8", "--contenders", "muse:cutedsl", "muse:reference",
                     "--reverse-order", "--no-check", "--json", str(out)]) == 0
    log = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["qkv_names"] == ["muse:cutedsl", "muse:reference"] and res["qkv_front"]
    case = res["qkv_front"][0]["case"]
    timed = [line.split()[len(case.split())] for line in log.splitlines() if line.strip().startswith(case + " ")]
    assert timed[:2] == ["muse:reference", "muse:cutedsl"], log


def test_interleaved_us_rotates_the_graphs_round_by_round(monkeypatch):
    """bench.timing.interleaved_us (how the bench times a case's contenders on a GPU): every graph
    once a round, round r starting at graph r, max(3, n) rounds by default; per graph the median of
    its rounds, with the lowest and highest beside it."""
    from bench import timing as T
    order = []
    # each timing reads its own position in the run: 1, 2, 3, ...
    monkeypatch.setattr(T, "time_graph_us", lambda graph, calls, n_sets, replays: order.append(graph) or {"us": len(order)})
    res = T.interleaved_us([("a", 1), ("b", 2), ("c", 3), ("d", 4)], n_sets=2)
    assert "".join(order) == "abcd" "bcda" "cdab" "dabc"
    assert res[0]["rounds"] == [1, 8, 11, 14] and res[0]["us"] == 9.5
    assert (res[0]["p20"], res[0]["p80"]) == (1, 14) and res[1]["calls"] == 2
    order.clear()
    assert T.interleaved_us([("x", 1)], n_sets=1)[0]["rounds"] == [1, 2, 3]


def test_gpu_path_keeps_each_contenders_closure_alive_until_its_graph_is_timed(monkeypatch):
    """run_case on a GPU captures every contender's graph before timing any: each contender's fn
    (which owns the outputs and workspaces its graph writes) must still be alive when the graphs
    are timed, or the next contender's allocations take that memory (an illegal address on the
    H100, thirty-eighth session). Faked here: the capture hands back a weak reference to fn, and
    the timing checks every one is alive."""
    import gc
    import weakref
    from bench import cases as C, timing as T

    def build(name, inp, device):
        buf = torch.zeros(4)                      # what a contender's closure owns
        return lambda i: buf.add_(1)

    alive = []
    monkeypatch.setitem(run.BUILDERS, "qkv_front", build)
    monkeypatch.setattr(T, "capture_calls", lambda fn, n_sets: (weakref.ref(fn), 1))
    monkeypatch.setattr(T, "eager_time_us", lambda fn, n_sets: 1.0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def timed(graphs, n_sets):
        gc.collect()
        alive.extend(g() is not None for g, _ in graphs)
        return [{"us": 1.0, "rounds": [1.0]} for _ in graphs]
    monkeypatch.setattr(T, "interleaved_us", timed)
    case = C.QkvCase(8)
    inp = C.build_qkv(case, torch.device("cpu"), 1 << 20, sets=2)
    row = run.run_case("qkv_front", case, inp, ["muse:cutedsl", "cublas", "muse:reference"], torch.device("cpu"),
                       cpu=False, check=False, ref_fn=None, log=lambda s: None)
    assert alive == [True, True, True] and all(r["us"] == 1.0 for r in row["results"].values())
