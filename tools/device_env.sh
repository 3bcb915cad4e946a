# Source on the GPU machine after .device/prelude.sh: the checkout on PYTHONPATH, a compile cache
# under /tmp seeded from .device/muse_cache.tar.xz when present (tools/warm_cache.py builds it on
# a CPU machine), and $OUT for what comes back.
export PYTHONPATH=$PWD:$PYTHONPATH MUSE_OPS_CACHE_DIR=${MUSE_OPS_CACHE_DIR:-/tmp/muse_cache}
mkdir -p "$MUSE_OPS_CACHE_DIR"
if [ -f .device/muse_cache.tar.xz ] && [ ! -f "$MUSE_OPS_CACHE_DIR/.seeded" ]; then
  tar -xJf .device/muse_cache.tar.xz -C "$MUSE_OPS_CACHE_DIR" && touch "$MUSE_OPS_CACHE_DIR/.seeded"
fi
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
