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
    appended = tmp_path / "RESULTS.md"
    appended.write_text("# header\n")
    assert run.main(["--render", str(out), "--append", str(appended)]) == 0
    assert appended.read_text().startswith("# header\n") and "## " in appended.read_text()
