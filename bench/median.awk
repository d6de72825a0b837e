# median(list): the median of the numbers in a space-separated list; "-" when it is empty or
# its first value is "-". Used with summary.awk and rogue.awk (awk -f median.awk -f ...).

function median(list,    values, n, i, j, tmp) {
    n = split(list, values, " ")
    if (n == 0 || values[1] == "-") return "-"
    for (i = 2; i <= n; i++) {
        tmp = values[i] + 0
        for (j = i - 1; j >= 1 && values[j] + 0 > tmp; j--) values[j + 1] = values[j]
        values[j + 1] = tmp
    }
    if (n % 2) return values[(n + 1) / 2]
    return (values[n / 2] + values[n / 2 + 1]) / 2
}
