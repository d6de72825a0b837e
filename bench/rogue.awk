# Reads the TSV written by bench/rogue.sh (identity, target, round, p50_ms, p99_ms, quiet_p50_ms,
# quiet_p99_ms, tps, quiet_tps, rogue_reads, aborted, pays_for, check) and prints markdown table
# rows: with `-v table=medians`, one per (identity, target) with the medians over rounds; with
# `-v table=rounds`, one per line. Needs median.awk: awk -f bench/median.awk -f bench/rogue.awk.

function ratio(value, base) {
    if (value == "-" || base == "-" || base + 0 == 0) return "-"
    return sprintf("%.2f", value / base)
}

function add(list, value) {
    return list == "" ? value : list " " value
}

NR > 1 && table == "rounds" {
    printf "| %s | %s | %s | %.3f | %.3f | %.3f | %s | %s | %s |\n", $1, $3, $2, $4, $5, $7, $10, $11, $13
}

NR > 1 && table == "medians" {
    key = $1 SUBSEP $2
    if (!(key in p50)) order[++keys] = key
    p50[key] = add(p50[key], $4)
    p99[key] = add(p99[key], $5)
    quiet[key] = add(quiet[key], $7)
    tps[key] = add(tps[key], $8)
    quiet_tps[key] = add(quiet_tps[key], $9)
    reads[key] = add(reads[key], $10)
    aborted[key] += $11
    pays[key] = $12
    if ($13 != "-") {
        checked[key]++
        if ($13 == "PASS") passed[key]++
    }
}

END {
    if (table != "medians") exit
    for (k = 1; k <= keys; k++) {
        key = order[k]
        split(key, part, SUBSEP)
        p = median(p99[key]); q = median(quiet[key])
        checks = (key in checked) ? sprintf("%d/%d PASS", passed[key] + 0, checked[key]) : "-"
        printf "| %s | %s | %.3f | %.3f | %.3f | %s | %.0f (%.0f) | %s (%s) | %s | %d | %s |\n", \
            part[1], part[2], median(p50[key]), p, q, ratio(p, q), median(tps[key]), \
            median(quiet_tps[key]), median(reads[key]), reads[key], pays[key], aborted[key], checks
    }
}
