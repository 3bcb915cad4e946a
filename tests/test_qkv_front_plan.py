"""CPU: qkv_front's host plan (no cutlass needed). Which token tile a launch above
WAVE_TILES_ABOVE tokens takes, against the fastest tile measured on the H200 at every row of the
tile sweeps of bench/RESULTS.md (twenty-seventh and twenty-eighth runs: each tile forced by
tools/qkv_front/ab.py, cold weights). A change of wave_tile's cost that picks a slower tile at
a measured row fails here; rows where two tiles were within 1% accept either. Whole-K tiles
against the cluster tile: the thirty-sixth session's H100 sweep (WHOLE_K_SWEEP), and at Hkv 3 to 16
the thirty-seventh's (HBM_WEIGHT_SWEEP)."""
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
def test_the_grid_cost_picks_the_measured_fastest_cluster_tile(kv_heads, m):
    """Among the two-head cluster tiles (the sweeps above measured no whole-K tile)."""
    tile = Q.wave_tile(m, kv_heads, Q.CLUSTER_WAVE_TILES)
    assert tile.heads == 2 and not tile.whole_k and tile.tokens in FASTEST[kv_heads, m], (kv_heads, m, tile)


# (Hkv, M): us of the tiles forced by tools/qkv_front/ab.py on the H100 in one call (thirty-sixth
# session, bench/RESULTS.md): the plan's cluster tile ("cluster") and whole-K tiles ((tokens,
# heads)); the plan must pick a tile within 2% of the fastest of them
WHOLE_K_SWEEP = {
    (2, 512): {"cluster": 42.99, (128, 2): 51.32, (160, 2): 59.74, (96, 3): 56.13},
    (2, 768): {"cluster": 68.36, (128, 2): 55.13, (160, 2): 66.90, (96, 3): 60.64},
    (2, 1024): {"cluster": 84.11, (128, 2): 106.04, (160, 2): 70.99, (96, 3): 71.78},
    (2, 1536): {"cluster": 124.08, (128, 2): 113.88, (160, 2): 133.82, (96, 3): 123.61},
    (2, 2048): {"cluster": 172.82, (128, 2): 177.79, (160, 2): 141.14, (96, 3): 141.54},
    (1, 1024): {"cluster": 38.59, (128, 2): 50.24, (160, 2): 59.36, (96, 3): 53.83},
    (8, 1024): {"cluster": 289.02, (128, 2): 300.60, (160, 2): 297.96, (96, 3): 283.62},
}


@pytest.mark.parametrize("kv_heads,m", sorted(WHOLE_K_SWEEP))
def test_the_grid_cost_picks_a_measured_fastest_whole_k_or_cluster_tile(kv_heads, m):
    """Among the tiles that sweep measured (the cluster tiles and its whole-K tiles; the tiles
    added since are weighed by the forty-fourth session's sweep below)."""
    row = WHOLE_K_SWEEP[kv_heads, m]
    tile = Q.wave_tile(m, kv_heads, tuple(t for t in Q.WAVE_TILES if not t.whole_k or (t.tokens, t.heads) in row))
    picked = row[(tile.tokens, tile.heads)] if tile.whole_k else row["cluster"]
    assert picked <= 1.02 * min(row.values()), (kv_heads, m, tile, row)


# (Hkv, M): us of cluster tiles (tokens, heads, False) and whole-K tiles (tokens, heads, True)
# forced by tools/qkv_front/ab.py at Hkv 3 to 16, where the weight streams from HBM (the
# thirty-seventh session's H100 call, bench/RESULTS.md): the plan's pick must be within 3.5% of
# the fastest tile it could have picked (two tiles closer than that traded places between runs).
HBM_WEIGHT_SWEEP = {
    (3, 512): {(128, 2, False): 70.32, (192, 2, False): 80.83, (256, 2, False): 50.9, (112, 3, True): 71.26, (96, 3, True): 63.19, (80, 3, True): 63.82, (64, 3, True): 98.04, (128, 2, True): 54.32, (160, 2, True): 67.51},
    (3, 1024): {(128, 2, False): 137.88, (192, 2, False): 129.54, (256, 2, False): 106.67, (112, 3, True): 138.46, (96, 3, True): 123.93, (80, 3, True): 127.51, (64, 3, True): 140.79, (128, 2, True): 118.17, (160, 2, True): 131.32},
    (3, 2048): {(128, 2, False): 261.92, (192, 2, False): 235.54, (256, 2, False): 224.0, (112, 3, True): 229.94, (96, 3, True): 211.23, (80, 3, True): 243.84, (64, 3, True): 241.6, (128, 2, True): 238.0, (160, 2, True): 212.75},
    (4, 512): {(128, 2, False): 111.82, (192, 2, False): 78.08, (256, 2, False): 93.88, (112, 3, True): 73.53, (96, 3, True): 129.0, (80, 3, True): 117.82, (64, 3, True): 102.42, (128, 2, True): 103.95, (160, 2, True): 120.45},
    (4, 768): {(128, 2, False): 116.67, (192, 2, False): 152.61, (256, 2, False): 97.08, (112, 3, True): 145.82, (96, 3, True): 127.1, (80, 3, True): 127.24, (64, 3, True): 142.84, (128, 2, True): 114.67, (160, 2, True): 132.18},
    (4, 1024): {(128, 2, False): 170.86, (192, 2, False): 158.63, (256, 2, False): 187.79, (112, 3, True): 141.07, (96, 3, True): 140.69, (80, 3, True): 189.14, (64, 3, True): 154.34, (128, 2, True): 172.54, (160, 2, True): 142.74},
    (4, 1536): {(128, 2, False): 245.57, (192, 2, False): 238.49, (256, 2, False): 194.64, (112, 3, True): 222.26, (96, 3, True): 209.14, (80, 3, True): 240.21, (64, 3, True): 235.99, (128, 2, True): 235.26, (160, 2, True): 209.38},
    (4, 2048): {(128, 2, False): 311.26, (192, 2, False): 270.35, (256, 2, False): 310.56, (112, 3, True): 296.28, (96, 3, True): 282.9, (80, 3, True): 312.96, (64, 3, True): 310.76, (128, 2, True): 307.26, (160, 2, True): 288.56},
    (8, 512): {(128, 2, False): 175.33, (192, 2, False): 173.58, (256, 2, False): 163.47, (112, 3, True): 149.2, (96, 3, True): 201.78, (80, 3, True): 193.21, (64, 3, True): 174.24, (128, 2, True): 169.56, (160, 2, True): 199.34},
    (8, 1024): {(128, 2, False): 344.2, (192, 2, False): 320.98, (256, 2, False): 281.41, (112, 3, True): 317.07, (96, 3, True): 287.78, (80, 3, True): 332.44, (64, 3, True): 329.94, (128, 2, True): 300.23, (160, 2, True): 297.2},
    (8, 1536): {(128, 2, False): 510.35, (192, 2, False): 435.25, (256, 2, False): 411.03, (112, 3, True): 455.44, (96, 3, True): 423.54, (80, 3, True): 483.95, (64, 3, True): 458.94, (128, 2, True): 427.47, (160, 2, True): 443.38},
    (8, 2048): {(128, 2, False): 676.93, (192, 2, False): 614.02, (256, 2, False): 530.89, (112, 3, True): 555.58, (96, 3, True): 564.06, (80, 3, True): 658.32, (64, 3, True): 683.85, (128, 2, True): 626.28, (160, 2, True): 594.56},
    (16, 512): {(128, 2, False): 339.06, (192, 2, False): 323.23, (256, 2, False): 287.58, (112, 3, True): 321.69, (96, 3, True): 355.73, (80, 3, True): 371.77, (64, 3, True): 358.5, (128, 2, True): 303.67, (160, 2, True): 362.62},
    (16, 1024): {(128, 2, False): 682.8, (192, 2, False): 634.49, (256, 2, False): 523.82, (112, 3, True): 632.0, (96, 3, True): 576.29, (80, 3, True): 697.64, (64, 3, True): 708.63, (128, 2, True): 608.08, (160, 2, True): 617.52},
}


@pytest.mark.parametrize("kv_heads,m", sorted(HBM_WEIGHT_SWEEP))
def test_the_grid_cost_picks_a_measured_fastest_tile_where_the_weight_streams_from_hbm(kv_heads, m):
    """Among the tiles that sweep measured (as above)."""
    row = HBM_WEIGHT_SWEEP[kv_heads, m]
    candidates = {(t.tokens, t.heads, t.whole_k) for t in Q.WAVE_TILES}
    tile = Q.wave_tile(m, kv_heads, tuple(t for t in Q.WAVE_TILES if (t.tokens, t.heads, t.whole_k) in row))
    pick = (tile.tokens, tile.heads, tile.whole_k)
    assert pick in row, (kv_heads, m, tile)
    assert row[pick] <= 1.035 * min(us for key, us in row.items() if key in candidates), (kv_heads, m, tile, row)


# (Hkv, M): us of launch tiles forced by tools/qkv_front/ab.py on the H100 in the forty-fourth
# session (bench/RESULTS.md; tools/qkv_front/realloc_device.sh and realloc_plan_device.sh): the
# reallocated whole-K tiles 160, 192 and 224 x 2 beside the tile the plan took before them, at
# rows where the pick changed and at Hkv 2 M=1024 and 2048 and Hkv 1 M=1536, where it did not.
# The plan's pick among every tile must be one measured here, within 2% of the fastest.
_C, _WK, _MC = (lambda t, h: Q.Tile(t, h)), (lambda t, h: Q.Tile(t, h, 1, True)), Q.Tile(128, 2, 1, True, True)
REALLOCATION_SWEEP = {
    (2, 1024): {_WK(96, 3): 65.54, _WK(160, 2): 72.85, _WK(192, 2): 81.92, _WK(224, 2): 88.48},
    (2, 1300): {_WK(192, 2): 84.65, _MC: 111.54},
    (2, 1536): {_MC: 105.67, _WK(160, 2): 129.34, _WK(192, 2): 149.03, _WK(224, 2): 90.57},
    (2, 2048): {_WK(96, 3): 135.84, _WK(160, 2): 140.33, _WK(192, 2): 157.62, _WK(224, 2): 175.52},
    (1, 1536): {_MC: 51.29, _WK(160, 2): 64.29, _WK(192, 2): 73.48, _WK(224, 2): 80.35},
    (3, 896): {_WK(224, 2): 89.34, _C(128, 2): 110.80, _C(256, 2): 108.63, _WK(96, 3): 126.83},
    (3, 1664): {_WK(192, 2): 164.33, _C(128, 2): 217.32, _C(256, 2): 171.58, _WK(96, 3): 192.80},
    (3, 2016): {_WK(224, 2): 195.02, _C(128, 2): 258.26, _C(256, 2): 222.60, _WK(96, 3): 199.47},
    (4, 640): {_WK(224, 2): 95.82, _C(256, 2): 100.01},
    (4, 1536): {_WK(224, 2): 197.44, _C(256, 2): 204.54},
    (8, 1536): {_WK(224, 2): 381.60, _WK(96, 3): 405.28, _C(256, 2): 406.14},
    (8, 1700): {_WK(192, 2): 436.97, _WK(96, 3): 475.38, _C(256, 2): 465.26},
    (8, 2000): {_WK(224, 2): 495.54, _WK(96, 3): 543.69, _C(256, 2): 531.60},
    (16, 1500): {_WK(192, 2): 771.98, _WK(112, 3): 862.46, _C(256, 2): 797.67},
    (16, 1792): {_WK(224, 2): 883.35, _WK(112, 3): 952.08, _C(256, 2): 931.74},
    (16, 2048): {_WK(192, 2): 1088.78, _WK(112, 3): 1123.22, _C(256, 2): 1081.35},
}


# (Hkv, M): us of the 128 x 2 cluster tile with and without x multicast (the forty-fourth session's
# tools/qkv_front/x_traffic_device.sh, bench/RESULTS.md), and where it is slower: the one-head table
# tile at M=128 and the whole-K tile at M=512 (the plan's pick within 2% of the fastest, as above)
X_MULTICAST_SWEEP = {
    (16, 256): {Q.X_MULTICAST_TILE: 168.11, _C(128, 2): 180.41, _C(256, 2): 179.66, _MC: 169.34},
    (8, 256): {Q.X_MULTICAST_TILE: 94.70, _C(128, 2): 97.99, _C(256, 2): 115.41, _MC: 107.93},
    (16, 128): {_C(128, 1): 130.87, Q.Tile(128, 1, x_multicast=True): 133.93, _C(256, 2): 159.60},
    (8, 512): {_WK(112, 3): 148.10, Q.Tile(112, 3, 1, True, x_multicast=True): 152.53, _C(256, 2): 171.94},
}
FORTY_FOURTH_SWEEPS = {**REALLOCATION_SWEEP, **X_MULTICAST_SWEEP}


@pytest.mark.parametrize("kv_heads,m", sorted(FORTY_FOURTH_SWEEPS))
def test_the_plan_picks_a_measured_fastest_tile_in_the_forty_fourth_sweeps(kv_heads, m):
    row = FORTY_FOURTH_SWEEPS[kv_heads, m]
    tile = Q.tile_for(m, kv_heads)
    assert tile in row, (kv_heads, m, tile)
    assert row[tile] <= 1.02 * min(row.values()), (kv_heads, m, tile, row)


def test_two_head_whole_k_tiles_from_160_tokens_reallocate_the_registers():
    """The rule is create's: every launch tile's variant follows it, and an override may turn it off."""
    for tile in Q.LAUNCH_TILES:
        cfg = Q.tile_config(tile, True)
        assert cfg.register_reallocation == (tile.whole_k and tile.heads == 2
                                             and tile.tokens >= Q.REALLOCATE_FROM_TILE), tile
        assert cfg.threads == 128 * tile.heads + (128 if cfg.register_reallocation else 32)
    off = Q.QkvFrontConfig.create(160, 2, True, whole_k=True, register_reallocation=False)
    assert not off.register_reallocation and off.threads == 288
    with pytest.raises(AssertionError):
        Q.QkvFrontConfig.create(192, 2, True, whole_k=True, register_reallocation=False)


def test_tile_runs_are_tile_for_at_every_m():
    """tile_runs (what the C++ ops' tables hold) asks tile_for only where it may change: the same
    tile as tile_for at every M up to 4096, at every Hkv the tables cover."""
    for kv_heads in range(1, 17):
        runs = Q.tile_runs(kv_heads, 4096)
        assert runs[-1][0] == 4096 and all(a[1] != b[1] for a, b in zip(runs, runs[1:]))
        first = 1
        for last, tile in runs:
            assert all(Q.tile_for(m, kv_heads) == tile for m in range(first, last + 1)), (kv_heads, first, last)
            first = last + 1


def test_tiles_up_to_256_tokens_come_from_the_table():
    """The table's tile, the two-head one with x multicast where the heads exceed a wave (Hkv >= 8)."""
    for kv_heads in (1, 2, 4, 7, 8, 9, 16):
        for m in range(1, Q.WAVE_TILES_ABOVE + 1):
            limit, tile, hpc, kps = next(row for row in Q.TILES if m <= row[0])
            x_multicast = hpc == 2 and kv_heads >= 8
            assert Q.tile_for(m, kv_heads) == Q.Tile(tile, hpc, kps, x_multicast=x_multicast), (kv_heads, m)
            assert Q.tile_config(Q.tile_for(m, kv_heads), True).x_multicast == x_multicast


def test_x_multicast_is_no_wave_candidate():
    """x multicast is the table's choice at 193-256 tokens only; wave_tile never weighs it."""
    assert Q.X_MULTICAST_TILE in Q.LAUNCH_TILES and Q.X_MULTICAST_TILE not in Q.WAVE_TILES
    assert all(not Q.tile_for(m, h).x_multicast for h in (8, 16) for m in range(Q.WAVE_TILES_ABOVE + 1, 2049))


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
