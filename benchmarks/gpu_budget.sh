# Sourced by the GPU check scripts: `check NAME COMMAND...` runs COMMAND in what is left of BUDGET
# seconds (counted from the script's start) and skips it with under a minute left.
check() {
    local left=$((BUDGET - SECONDS))
    if ((left < 60)); then echo "== $1: skipped, ${left} s left"; return; fi
    echo "== $1 (${left} s left)"
    timeout "$left" "${@:2}"
    echo "== $1: exit $? at ${SECONDS} s"
}
