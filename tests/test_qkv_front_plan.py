"""CPU: qkv_front's host plan (no cutlass needed). Which token tile a launch above
WAVE_TILES_ABOVE tokens takes, against the fastest tile measured on the H200 at every row of the
tile sweeps of bench/RESULTS.md (twenty-seventh and twenty-eighth runs: each tile forced by
tools/qkv_front/ab.py, cold weights). A change of wave_tile's cost that picks a slower tile at
a measured row fails here; rows where two tiles were within 1% accept either."""
import pytest

from muse_ops.cutedsl import qkv_front_plan as Q

# (Hkv, M): the two-head tiles (tokens) measured fastest, us of each in RESULTS.md
FASTEST = {
    (4, 300): {128}, (4, 384): {128}, (4, 512): {192}, (4, 768): {256}, (4, 1024): {192},
    (8, 300): {128}, (8, 448): {128, 256}, (8, 512): {128, 256}, (8, 600): {128}, (8, 640): {128},
    (8, 900): {192}, (8, 1024): {256}, (8, 1100): {192},
    (16, 512): {256}, (16, 600): {128}, (16, 640): {128}, (16, 800): {192}, (16, 832): {192},
    (16, 1024): {256}, (16, 1300): {192},
    (2, 512): {256}, (2, 576): {192}, (2, 768): {192}, (2, 832): {256}, (2, 1024): {256}, (2, 1100): {192},
    (1, 300): {128}, (1, 448): {128}, (1, 512): {128}, (1, 576): {192}, (1, 640): {192}, (1, 1100): {192},
    (6, 1100): {128},
}


@pytest.mark.parametrize("kv_heads,m", sorted(FASTEST))
def test_the_grid_cost_picks_the_measured_fastest_tile(kv_heads, m):
    tile, heads_per_cta, _, _ = Q.tile_for(m, kv_heads)
    assert heads_per_cta == 2 and tile in FASTEST[kv_heads, m], (kv_heads, m, tile)


def test_tiles_up_to_256_tokens_come_from_the_table():
    for kv_heads in (1, 2, 4, 8, 16):
        for m in range(1, Q.WAVE_TILES_ABOVE + 1):
            limit, tile, hpc, kps = next(row for row in Q.TILES if m <= row[0])
            assert Q.tile_for(m, kv_heads) == Q.Tile(tile, hpc, kps), (kv_heads, m)


def test_only_hkv_1_and_2_weights_fit_the_l2():
    assert [h for h in range(1, 17) if Q.weight_fits_l2(h)] == [1, 2]


def test_the_ring_release_and_the_trigger_point_follow_the_measured_rules():
    """Every variant a deployment launches: tiles of up to RELEASE_AT_ONCE_TILE tokens release a
    stage at once (mma_lag 0, thirtieth run), larger ones a stage late; tiles of up to
    TRIGGER_AT_LAST_LOAD_TILE tokens trigger the dependent launch at the last load (twenty-ninth
    run), larger ones after the main loop. Neither changes with the index dtypes or RoPE."""
    seen = set()
    for rope in (False, True):
        for cfg in Q.deployment_variants(2, rope):
            assert cfg.mma_lag == (0 if cfg.token_tile <= Q.RELEASE_AT_ONCE_TILE else 1), cfg
            assert cfg.trigger_point == ("last_load" if cfg.token_tile <= Q.TRIGGER_AT_LAST_LOAD_TILE
                                         else "main_loop"), cfg
            seen.add((cfg.token_tile, cfg.mma_lag, cfg.trigger_point))
    assert (8, 0, "last_load") in seen and (32, 1, "last_load") in seen and (256, 1, "main_loop") in seen
    assert Q.QkvFrontConfig.create(8, 1, True, pdl=False).trigger_point is None
