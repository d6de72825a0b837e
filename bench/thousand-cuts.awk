# Reads the TSV written by bench/thousand-cuts.sh (target, round, lookup_p50_ms, lookup_p99_ms,
# lookups_per_s, heavy_per_s, errors, refused) and prints markdown table rows: with
# `-v table=medians`, one per target with the medians over rounds (errors and refusals summed);
# with `-v table=rounds`, one per line. Needs median.awk:
# awk -f bench/median.awk -f bench/thousand-cuts.awk.

function add(list, value) {
    return list == "" ? value : list " " value
}

NR > 1 && table == "rounds" {
    printf "| %s | %s | %.3f | %.3f | %.1f | %.1f | %d | %d |\n", $2, $1, $3, $4, $5, $6, $7, $8
}

NR > 1 && table == "medians" {
    if (!($1 in p50)) order[++keys] = $1
    p50[$1] = add(p50[$1], $3)
    p99[$1] = add(p99[$1], $4)
    lookups[$1] = add(lookups[$1], $5)
    heavy[$1] = add(heavy[$1], $6)
    errors[$1] += $7
    refused[$1] += $8
}

END {
    if (table != "medians") exit
    for (k = 1; k <= keys; k++) {
        t = order[k]
        printf "| %s | %.3f | %.3f | %.1f | %.1f | %d | %d |\n", t, median(p50[t]), median(p99[t]),
            median(lookups[t]), median(heavy[t]), errors[t], refused[t]
    }
}
