#!/bin/bash
# rounds.sh ROUNDS LABEL1 "CMD1" LABEL2 "CMD2" ...: runs the commands in turn, ROUNDS times, so
# that each round sees one phase of the machine; each command prints "median X" (the probes
# here do); prints each label's median over the rounds and the rounds' values
R=$1; shift
for r in $(seq $R); do set -- "$@"; i=0; args=("$@"); while [ $i -lt ${#args[@]} ]; do l=${args[$i]}; c=${args[$((i+1))]}; echo -n "$l "; eval "$c" | grep -o "median [0-9.]*" | head -1; i=$((i+2)); done; done | python3 -c "
import sys,collections,statistics
d=collections.defaultdict(list)
for l in sys.stdin:
    t=l.split(); d[t[0]].append(float(t[2]))
for k in d: print(k, 'median %.3f'%statistics.median(d[k]), ' '.join('%.2f'%v for v in d[k]))
"
