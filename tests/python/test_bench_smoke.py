"""Smoke test of tools/norma-bench: a tiny run (norma only, one small shape) must finish and
write a JSON / CSV / SVG with the documented fields.  No timing is asserted.

The build directory is NORMA_BENCH_BUILD_DIR, else the directory of NORMA_LIBRARY, else the
<repo>/build* directory whose tools/norma-bench-norma is the newest; the tests are skipped when
there is none."""

import csv
import glob
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "tools", "norma-bench")
WORKER = os.path.join("tools", "norma-bench-norma")


def _build_dir():
    if os.environ.get("NORMA_BENCH_BUILD_DIR"):
        d = os.environ["NORMA_BENCH_BUILD_DIR"]
        return d if os.path.exists(os.path.join(d, WORKER)) else None
    # the build of the library under test (scripts/test.sh sets NORMA_LIBRARY=build/libnorma.so)
    if os.environ.get("NORMA_LIBRARY"):
        d = os.path.dirname(os.path.abspath(os.environ["NORMA_LIBRARY"]))
        if os.path.exists(os.path.join(d, WORKER)):
            return d
    # else the most recently built <repo>/build* (a stale one would test old code)
    cands = [d for d in glob.glob(os.path.join(REPO, "build*"))
             if os.path.exists(os.path.join(d, WORKER))]
    if not cands:
        return None
    return max(cands, key=lambda d: os.path.getmtime(os.path.join(d, WORKER)))


def _run(args, timeout=60):
    build = _build_dir()
    if build is None:
        pytest.skip("norma-bench-norma is not built (cmake --build build)")
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    return subprocess.run([python, BENCH, "--build-dir", build, "--retries", "0"] + args,
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_quick_run_writes_json_csv_svg(tmp_path):
    js, cs, sv = tmp_path / "b.json", tmp_path / "b.csv", tmp_path / "b.svg"
    r = _run(["--quick", "--peers", "none", "--ops", "fwd,bwd", "--shape", "2,3,4,4",
              "--shape", "4,8", "--threads", "2", "--out-dir", str(tmp_path),
              "--json", str(js), "--csv", str(cs), "--svg", str(sv)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "norma ms" in r.stdout  # the human table
    assert "[1/" in r.stderr       # the progress line

    doc = json.loads(js.read_text())
    for key in ("date", "command", "threads", "reps", "warmup", "machine", "bandwidth",
                "norma", "peers", "libs", "notes", "cases", "summary"):
        assert key in doc, key
    assert doc["libs"] == ["norma"]
    bw = doc["bandwidth"]
    assert bw["status"] == "ok"
    for key in ("copy_nt_GBps", "copy_GBps", "read_GBps", "bytes", "threads"):
        assert key in bw, key
    assert bw["bytes"] >= 256 << 20
    assert bw["copy_nt_GBps"] > 0
    m = doc["machine"]
    assert m["fits_in_cache_bytes"] > 0 and "l2_share_bytes" in m["cache"]

    # 2 ops x (2 layouts of the 4-D shape + 1 of the 2-D shape)
    assert len(doc["cases"]) == 6
    seen = set()
    for c in doc["cases"]:
        seen.add((c["op"], c["layout"]))
        for key in ("op", "layout", "dtype", "shape", "results", "bytes_min", "model",
                    "model_bytes", "fits_in_cache", "eff_GBps", "pct_copy_bw", "speedup"):
            assert key in c, key
        assert c["model"] in ("1-pass", "2-pass")
        plan = c["results"]["norma"].get("plan")  # norma_bn_query_plan (absent: older worker)
        if plan is not None:
            assert c["model_source"] == "norma"
            assert c["model"] == "%d-pass" % plan["dram_passes"]
        else:
            assert c["model_source"] == "rule"
        assert isinstance(c["fits_in_cache"], bool)
        r = c["results"]["norma"]
        assert r["status"] == "ok", r
        for key in ("min_ms", "median_ms", "max_ms", "reps", "warmup", "impl"):
            assert key in r, key
        assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"]
        assert r["reps"] >= 1
        assert c["eff_GBps"]["norma"] > 0 and c["pct_copy_bw"]["norma"] > 0
    assert ("fwd", "nc") in seen and ("bwd", "nhwc") in seen
    e = doc["cases"][0]
    assert e["bytes_min"] == 2 * 2 * 3 * 4 * 4 * 4  # fwd f32: read x + write y
    groups = doc["summary"]["groups"]
    assert groups and all("geomean_pct_copy_bw" in g and "geomean_speedup" in g for g in groups)

    rows = list(csv.DictReader(cs.open()))
    assert len(rows) == 6
    for key in ("op", "layout", "dtype", "shape", "lib", "status", "median_ms", "eff_GBps",
                "pct_copy_bw", "model", "fits_in_cache"):
        assert key in rows[0], key

    root = ET.parse(str(sv)).getroot()  # well-formed
    assert root.tag.endswith("svg")
    assert "norma" in sv.read_text()


def test_list_cases():
    r = _run(["--suite", "seed_nc", "--ops", "fwd", "--list"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert "fwd nc f32 64,1024" in lines
    assert len([x for x in lines if x]) == 4


def test_peers_on_a_tiny_shape(tmp_path):
    """PyTorch and oneDNN workers, where installed, answer in the same format; oneDNN has no
    fused add + ReLU (n/a)."""
    js = tmp_path / "p.json"
    r = _run(["--quick", "--peers", "torch,dnnl", "--ops", "fwd,add_relu_fwd", "--layouts",
              "nhwc", "--shape", "2,3,4,4", "--threads", "2", "--no-files", "--json", str(js)],
             timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(js.read_text())
    ran = [p for p in ("torch", "dnnl") if doc["peers"].get(p, {}).get("available")]
    if not ran:
        pytest.skip("neither PyTorch nor oneDNN is available")
    assert doc["libs"] == ["norma"] + ran
    for c in doc["cases"]:
        for p in ran:
            res = c["results"][p]
            if p == "dnnl" and c["op"] == "add_relu_fwd":
                assert res["status"] == "n/a", res
            else:
                assert res["status"] == "ok", res
                assert res["median_ms"] > 0 and "impl" in res
                assert c["speedup"][p] > 0
    for g in doc["summary"]["groups"]:
        assert set(g["geomean_speedup"]) == set(ran)


def test_list_norm_family_and_fewc_suites():
    """The suites of the norm family and fewc, as the workers receive them (no worker runs)."""
    r = _run(["--suite", "norms", "--list"])
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.split("\n") if x]
    for want in ("ln_fwd rows f32 8,128,768", "ln_res_bwd rows f32 32,512,1024",
                 "ln_res_fwd rows f32 8,1024,1280", "rms_bwd rows f32 4,2048,5120",
                 "gn_silu_bwd nhwc f32 2,320,64,64 groups=32", "gn_fwd nchw f32 2,1280,8,8 groups=32",
                 "in_bwd nhwc f32 4,32,256,256", "in_fwd nchw f32 1,128,64,64"):
        assert want in lines, want
    ops = {x.split()[0] for x in lines}
    assert ops == {"ln_fwd", "ln_bwd", "ln_res_fwd", "ln_res_bwd", "rms_fwd", "rms_bwd",
                   "gn_fwd", "gn_bwd", "gn_silu_fwd", "gn_silu_bwd", "in_fwd", "in_bwd"}
    r = _run(["--suite", "fewc", "--list"])
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.split("\n") if x]
    assert len(lines) == 6 * 2 * 2 * 3  # C x layouts x dtypes x (fwd, infer, bwd)
    assert "bwd nhwc f16 16,3,1182,1182 reps=5 warmup=1" in lines
    for x in lines:
        n, c, h, w = map(int, x.split()[3].split(","))
        assert abs(n * c * h * w - 2 ** 26) < 2 ** 26 * 0.002
    r = _run(["--suite", "gn_sd", "--ops", "relu", "--list"])  # no such op for GroupNorm
    assert r.returncode != 0 and "applies to none" in r.stderr
    r = _run(["--isa", "avx9", "--list"])
    assert r.returncode != 0 and "unknown ISA" in r.stderr


def test_quick_norm_family_fewc_isa(tmp_path):
    """--quick of every new suite with the peers and two ISA caps side by side: every case of
    norma runs, each norma column says the ISA it ran, the peers answer or say n/a where they
    have no such operator, and the summary names the worst case against the faster peer."""
    js = tmp_path / "n.json"
    r = _run(["--suite", "norms,fewc", "--quick", "--isa", "avx2,scalar", "--reps", "1",
              "--warmup", "0", "--probe-mb", "16", "--settle-ms", "0", "--threads", "2",
              "--no-files", "--json", str(js)], timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(js.read_text())
    nlibs = ["norma:avx2", "norma:scalar"]
    assert doc["libs"][:2] == nlibs and doc["norma_libs"] == nlibs
    ran = [p for p in ("torch", "dnnl") if doc["peers"].get(p, {}).get("available")]
    assert doc["libs"][2:] == ran
    isa = {nl: doc["norma_variants"][nl]["isa"] for nl in nlibs}
    assert isa["norma:scalar"] == "scalar"
    assert doc["norma_variants"]["norma:avx2"]["max_isa"] == "avx2"
    ops = set()
    for c in doc["cases"]:
        ops.add(c["op"])
        for nl in nlibs:
            res = c["results"][nl]
            assert res["status"] == "ok", (c["op"], c["shape"], res)
            assert res["isa"] == isa[nl]
        fam, direction = c["family"], c["op"].rsplit("_", 1)[-1]
        t = c["bytes_min"] // (4 if c["dtype"] == "f32" else 2)
        elems = 1
        for d in c["shape"]:
            elems *= d
        if c["op"] in ("ln_res_fwd", "ln_res_bwd"):
            assert t == 4 * elems
        elif direction == "bwd":
            assert t == 3 * elems
        else:
            assert t == 2 * elems
        for p in ran:
            res = c["results"][p]
            na = (p == "dnnl" and (fam in ("rms", "gn") or c["dtype"] == "f16")) or \
                 (p == "torch" and c["dtype"] == "f16")
            assert res["status"] == ("n/a" if na else "ok"), (p, c["op"], c["dtype"], res)
    assert ops == {"ln_fwd", "ln_bwd", "ln_res_fwd", "ln_res_bwd", "rms_fwd", "rms_bwd",
                   "gn_fwd", "gn_bwd", "gn_silu_fwd", "gn_silu_bwd", "in_fwd", "in_bwd",
                   "fwd", "infer", "bwd"}
    assert {c["layout"] for c in doc["cases"] if c["family"] == "gn"} == {"nchw", "nhwc"}
    assert {c["dtype"] for c in doc["cases"] if c["family"] == "bn"} == {"f32", "f16"}
    for g in doc["summary"]["groups"]:
        assert set(g["by_norma"]) == set(nlibs)
        if ran and g["dtype"] == "f32":
            w = g["by_norma"]["norma:scalar"]["worst_vs_best"]
            assert w and w["peer"] in ran and w["speedup"] > 0 and w["shape"]
    assert "worst vs best" in r.stdout and "norma scalar" in r.stdout
    # the saved run prints again
    r2 = _run(["--report", str(js), "--no-files"])
    assert r2.returncode == 0, r2.stderr
    assert "worst vs best" in r2.stdout


def _listed(args):
    r = _run(args + ["--list"])
    assert r.returncode == 0, r.stderr
    return [x for x in r.stdout.split("\n") if x]


def test_random_shapes_repeat_from_their_seed(tmp_path):
    """--random: the same seed lists the same shapes, another seed others; the first line says
    how to run them again (with the seed drawn from the clock too); every shape within the
    bounds; a run names them and records the seed in the JSON's notes."""
    a = _listed(["--random", "12", "--seed", "41", "--ops", "fwd"])
    assert a == _listed(["--random", "12", "--seed", "41", "--ops", "fwd"])
    assert a != _listed(["--random", "12", "--seed", "42", "--ops", "fwd"])
    assert a[0] == "# 12 random shapes: --random 12 --seed 41 --random-max-mb 256 runs them again"
    for x in a[1:]:
        op, layout, dt, shape = x.split()[:4]
        dims = [int(v) for v in shape.split(",")]
        assert op == "fwd" and dt == "f32" and min(dims) >= 1
        assert (layout == "nc") == (len(dims) == 2) and len(dims) in (2, 4)
        values = 1
        for d in dims:
            values *= d
        assert 4096 <= values <= 256 * 2 ** 20 // 4, x
    # 4-D shapes run in both layouts, [N, C] once: 12 shapes give between 12 and 24 cases
    assert 12 <= len(a) - 1 <= 24
    drawn = _listed(["--random", "3", "--ops", "bwd", "--layouts", "nhwc"])
    seed = int(drawn[0].split("--seed ")[1].split()[0])
    assert drawn == _listed(["--random", "3", "--seed", str(seed), "--ops", "bwd",
                             "--layouts", "nhwc"])
    for bad, msg in ((["--random", "-1"], "must be >= 0"), (["--seed", "3"], "goes with"),
                     (["--random", "2", "--random-max-mb", "0.001"], "must allow")):
        r = _run(bad + ["--list"])
        assert r.returncode != 0 and msg in r.stderr, (bad, r.stderr)
    js = tmp_path / "r.json"
    r = _run(["--random", "2", "--seed", "7", "--random-max-mb", "0.25", "--peers", "none",
              "--ops", "fwd", "--reps", "1", "--warmup", "0", "--threads", "2", "--no-files",
              "--json", str(js)], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(js.read_text())
    assert "--random 2 --seed 7 --random-max-mb 0.25" in " ".join(doc["notes"])
    assert {c["name"] for c in doc["cases"]} == {"random1", "random2"}
    for c in doc["cases"]:
        assert c["results"]["norma"]["status"] == "ok" and c["results"]["norma"]["median_ms"] > 0


def _worker_counts(argv):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["status"] == "ok", res
    # the percentiles lie between min and max; with 10 runs or fewer they are min and max
    assert res["min_ms"] <= res["p10_ms"] <= res["median_ms"] <= res["p90_ms"] <= res["max_ms"]
    if res["reps"] <= 10:
        assert (res["p10_ms"], res["p90_ms"]) == (res["min_ms"], res["max_ms"]), res
    return res["reps"], res["warmup"]


def test_time_floors_add_runs():
    """--min-warmup-ms / --min-time-ms: a call of microseconds runs past --warmup / --reps until
    the floors are filled (here 50 ms: more than 2 runs unless a 2x3x4x4 call took 25 ms);
    without them exactly --warmup and --reps runs.  The PyTorch worker behaves the same."""
    build = _build_dir()
    if build is None:
        pytest.skip("norma-bench-norma is not built (cmake --build build)")
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    workers = [[os.path.join(build, WORKER)]]
    try:
        import torch  # noqa: F401
        workers.append([python, os.path.join(REPO, "bench", "peer_torch.py")])
    except ImportError:
        pass
    case = ["--threads", "1", "--reps", "2", "--warmup", "1", "--case", "fwd nhwc f32 2x3x4x4"]
    for w in workers:
        assert _worker_counts(w + case) == (2, 1)
        reps, warm = _worker_counts(w + case + ["--min-warmup-ms", "50", "--min-time-ms", "50"])
        assert reps > 2 and warm > 1, (w, reps, warm)
    doc_run = _run(["--quick", "--peers", "none", "--ops", "fwd", "--layouts", "nhwc", "--shape",
                    "2,3,4,4", "--threads", "1", "--no-files", "--min-time-ms", "5"])
    assert doc_run.returncode == 0, doc_run.stdout + doc_run.stderr
    assert "more runs where those take under 5 ms / 0 ms" in doc_run.stdout


def test_rounds_keep_the_median_round(tmp_path):
    """--rounds 3: every case runs three times per library; the result kept is the round whose
    median is the middle one of the three, which 'round_medians' lists."""
    js = tmp_path / "r.json"
    r = _run(["--quick", "--rounds", "3", "--peers", "none", "--ops", "fwd", "--layouts",
              "nhwc", "--shape", "2,3,4,4", "--threads", "1", "--no-files", "--json", str(js)])
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(js.read_text())
    assert doc["rounds"] == 3
    res = doc["cases"][0]["results"]["norma"]
    assert res["rounds"] == 3 and len(res["round_medians"]) == 3
    assert res["median_ms"] == sorted(res["round_medians"])[1]
    assert "of 3 rounds" in r.stdout


def test_pick_round():
    """pick_round on made-up rounds: the middle median (the lower middle of an even count);
    a failed round stands for the case."""
    import importlib.machinery
    import types
    loader = importlib.machinery.SourceFileLoader("norma_bench_tool", BENCH)
    mod = types.ModuleType(loader.name)
    mod.__file__ = BENCH
    loader.exec_module(mod)
    ok = lambda m: {"status": "ok", "median_ms": m, "min_ms": m / 2}
    r = mod.pick_round([ok(3.0), ok(1.0), ok(2.0)])
    assert r["median_ms"] == 2.0 and r["min_ms"] == 1.0 and r["round_medians"] == [3.0, 1.0, 2.0]
    assert mod.pick_round([ok(4.0), ok(1.0), ok(3.0), ok(2.0)])["median_ms"] == 2.0
    assert mod.pick_round([ok(5.0)]) == ok(5.0)
    bad = {"status": "n/a", "reason": "x"}
    assert mod.pick_round([ok(1.0), bad]) == bad
