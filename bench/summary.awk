# Reads the TSV written by bench/pooler.sh (mode, target, round, tps, latency_ms, cpu_us_per_tx,
# transactions, and with `-v split_cpu=1` user_us_per_tx and sys_us_per_tx) and prints one
# markdown table row per (mode, target): medians, and ratios of tps and latency against the
# target named by `-v base=NAME` (default direct) of the same mode.
# Needs median.awk: awk -f bench/median.awk -f bench/summary.awk.

function ratio(value, base) {
    if (value == "-" || base == "-" || base + 0 == 0) return "-"
    return sprintf("%.3f", value / base)
}

NR > 1 {
    key = $1 SUBSEP $2
    if (!(key in tps)) order[++keys] = key
    tps[key] = tps[key] " " $4
    lat[key] = lat[key] " " $5
    cpu[key] = cpu[key] " " $6
    user[key] = user[key] " " $8
    sys[key] = sys[key] " " $9
}

END {
    for (k = 1; k <= keys; k++) {
        key = order[k]
        split(key, part, SUBSEP)
        direct = part[1] SUBSEP (base == "" ? "direct" : base)
        t = median(tps[key]); l = median(lat[key]); c = median(cpu[key])
        if (c != "-") c = sprintf("%.2f", c)
        dt = (direct in tps) ? median(tps[direct]) : "-"
        dl = (direct in lat) ? median(lat[direct]) : "-"
        printf "| %s | %s | %.0f | %.3f | %s | %s | %s |", part[1], part[2], t, l, c, ratio(t, dt), ratio(l, dl)
        if (split_cpu) {
            u = median(user[key]); s = median(sys[key])
            printf " %s |", (u == "-" ? "-" : sprintf("%.2f / %.2f", u, s))
        }
        printf "\n"
    }
}
