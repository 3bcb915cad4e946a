"""Compile attn2 variants on the CPU for sm_90a; dump PTX, print ptxas remarks."""
import os, sys, time
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
from muse_ops.cutedsl import attn2 as A, launch
dump = sys.argv[1] if len(sys.argv) > 1 else "/tmp/attn2_dump"
os.makedirs(dump, exist_ok=True)
for q_len, window in [(8, 0), (1, 0), (8, 2048), (1, 2048)]:
    for layout in A.deployment_layouts(window):
        cfg = A._config(q_len, window, 32768, layout)
        t = time.time()
        os.makedirs(f"{dump}/q{q_len}w{window}{layout}", exist_ok=True)   # the DSL writes no PTX into a missing folder
        launch.compile_attn2(cfg, f"--keep-ptx --dump-dir={dump}/q{q_len}w{window}{layout} remarks{{ptx}}")
        print(cfg, f"{time.time()-t:.1f}s", flush=True)
