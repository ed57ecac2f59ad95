#!/usr/bin/python3
"""pair.py [--twice] "CASE" REPS ROUNDS A B

Runs two benchmark workers (A, B: build/tools/norma-bench-norma, norma-bench-dnnl, or a wrapper
script that sets an environment first) on one case, one process per measurement, 2 threads,
the order flipped each round; prints the median of the per-round time ratios A/B (above 1: B
faster) and the median times.  --twice: each process runs the case twice and the second run
counts, so that the tensors lie as in norma-bench's workers from their second case on (each
allocated right after the last)."""
import json
import statistics
import subprocess
import sys

args = sys.argv[1:]
twice = args[:1] == ["--twice"]
if twice:
    args = args[1:]
case, reps, rounds, A, B = args[0], int(args[1]), int(args[2]), args[3], args[4]


def t(b):
    argv = [b, "--threads", "2", "--reps", str(reps), "--case", case]
    if twice:
        argv += ["--case", case]
    out = subprocess.run(argv, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["median_ms"]


rs, ta, tb = [], [], []
for r in range(rounds):
    if r % 2:
        b = t(B)
        a = t(A)
    else:
        a = t(A)
        b = t(B)
    rs.append(a / b)
    ta.append(a)
    tb.append(b)
print("%-34s A/B %.3f  [%s]  A %.4f B %.4f" % (case, statistics.median(rs), " ".join("%.2f" % x for x in rs),
                                               statistics.median(ta), statistics.median(tb)), flush=True)
