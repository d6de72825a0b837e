# Reads the TSV written by bench/pooler.sh and prints, per mode, the median over rounds of
# pgward's TPS and CPU per transaction as ratios of PgBouncer's in the same round (the two ran
# next to each other in time, so a round's ratio is less exposed to the machine's drift than a
# ratio of medians), and in how many rounds pgward met each target (TPS at least PgBouncer's,
# CPU per transaction at most PgBouncer's). Prints nothing for a mode where either target is
# missing.
# Needs median.awk: awk -f bench/median.awk -f bench/paired.awk.

NR > 1 && ($2 == "pgward" || $2 == "pgbouncer") {
    key = $1 SUBSEP $3
    if (!($1 in seen)) { seen[$1] = 1; modes[++n] = $1 }
    tps[key, $2] = $4
    cpu[key, $2] = $6
}

END {
    for (m = 1; m <= n; m++) {
        t = ""; c = ""; rounds = 0; tps_met = 0; cpu_met = 0; cpu_rounds = 0
        for (k in tps) {
            split(k, part, SUBSEP)
            if (part[1] != modes[m] || part[3] != "pgward") continue
            round = part[1] SUBSEP part[2]
            if (!((round, "pgbouncer") in tps) || tps[round, "pgbouncer"] + 0 == 0) continue
            rounds++
            t = t " " tps[round, "pgward"] / tps[round, "pgbouncer"]
            if (tps[round, "pgward"] + 0 >= tps[round, "pgbouncer"] + 0) tps_met++
            if (cpu[round, "pgbouncer"] + 0 > 0 && cpu[round, "pgward"] + 0 > 0) {
                c = c " " cpu[round, "pgward"] / cpu[round, "pgbouncer"]
                cpu_rounds++
                if (cpu[round, "pgward"] + 0 <= cpu[round, "pgbouncer"] + 0) cpu_met++
            }
        }
        if (rounds == 0) continue
        printf "| %s | %d | %.3f | %s | %d of %d | %s |\n", modes[m], rounds, median(t),
            (c == "" ? "-" : sprintf("%.3f", median(c))), tps_met, rounds,
            (c == "" ? "-" : sprintf("%d of %d", cpu_met, cpu_rounds))
    }
}
