#!/usr/bin/python3
"""pair2.py "CASE" REPS ROUNDS A B: like pair.py, but each process runs the case twice and the second run counts (the bench worker's later cases)"""
import json, subprocess, sys, statistics
case, reps, rounds, A, B = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
def t(b):
    out = subprocess.run([b, "--threads", "2", "--reps", str(reps), "--case", case, "--case", case], capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["median_ms"]
rs=[]; ta=[]; tb=[]
for r in range(rounds):
    if r % 2: b = t(B); a = t(A)
    else: a = t(A); b = t(B)
    rs.append(a / b); ta.append(a); tb.append(b)
print("%-34s A/B %.3f  [%s]  A %.4f B %.4f" % (case, statistics.median(rs), " ".join("%.2f" % x for x in rs), statistics.median(ta), statistics.median(tb)), flush=True)
