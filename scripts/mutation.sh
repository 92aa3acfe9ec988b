#!/usr/bin/env bash
# Mutation testing of the engine core (runtime/engine) with mutmut, on demand (not in CI).
# Configuration: [tool.mutmut] in pyproject.toml; what the results mean: docs/MUTATION.md.
#
#   scripts/mutation.sh                          every file of runtime/engine (~90 min with one worker)
#   scripts/mutation.sh scheduler block_manager  only these files' mutants
#   scripts/mutation.sh --summary                only print the summary of the last run
#
# Environment: MUTATION_JOBS=N runs N mutants at once (default 1); MUTATION_KEEP=1 keeps ./mutants
# from the last run (mutant generation and test stats are reused; the named mutants are re-tested).
#
# mutmut works in ./mutants/ (a copy of the tree: keep it out of git) and logs there (mutants/run.log).
# The summary counts, per file: killed; timeout (detected too: the mutant loops, or hypothesis
# shrinks its failure for long); survived; equivalent and accepted (survivors docs/MUTATION.md lists);
# no tests (no selected test runs the code). Then it lists every survivor docs/MUTATION.md doesn't:
# a missing test, or a new equivalent to list.
set -euo pipefail
cd "$(dirname "$0")/.."

summary() {
    python3 - <<'PY'
import collections
import re
import subprocess
import sys

out = subprocess.run(["mutmut", "results", "--all", "true"], capture_output=True, text=True, check=True).stdout
try:
    doc = open("docs/MUTATION.md", encoding="utf-8").read()
except FileNotFoundError:
    doc = ""
# ids listed under "## Equivalent ..." count as equivalent; under any other section as accepted
# (survivors documented as not worth a test: code mutmut can't reach, a deliberate difference)
known = {}
for section in re.split(r"\n## ", doc):
    status = "equivalent" if section.startswith("Equivalent") else "accepted"
    for name in re.findall(r"`(runtime\.engine\.[^`]+__mutmut_\d+)`", section):
        known[name] = status
counts = collections.defaultdict(collections.Counter)
new = []
for line in out.splitlines():
    if ": " not in line:
        continue
    name, status = line.strip().rsplit(": ", 1)
    file = name.split(".")[2]
    if status == "survived" and name in known:
        status = known[name]
    elif status in ("survived", "no tests", "suspicious"):
        new.append(f"{status:9} {name}")
    counts[file][status] += 1
cols = ["killed", "timeout", "survived", "equivalent", "accepted", "no tests", "not checked"]
others = sorted({s for c in counts.values() for s in c} - set(cols))
print(f"{'file':16}" + "".join(f"{c:>13}" for c in cols + others))
for file in sorted(counts):
    print(f"{file:16}" + "".join(f"{counts[file][c]:>13}" for c in cols + others))
if new:
    print(f"\n{len(new)} mutants not killed and not listed in docs/MUTATION.md (mutmut show NAME for the diff):")
    print("\n".join("  " + n for n in new))
stale = set(known) - {line.strip().rsplit(": ", 1)[0] for line in out.splitlines() if ": " in line}
if stale:
    print(f"\ndocs/MUTATION.md lists {len(stale)} mutant ids this run doesn't have (the code changed: renumber):")
    print("\n".join("  " + s for s in sorted(stale)))
sys.exit(0)
PY
}

if [[ "${1:-}" == "--summary" ]]; then
    summary
    exit 0
fi
command -v mutmut >/dev/null || { echo "mutmut is not installed: pip install -e '.[mutation]'" >&2; exit 1; }

patterns=()
for f in "$@"; do
    f=${f##*/}
    f=${f%.py}
    [[ -f runtime/engine/$f.py ]] || { echo "no such engine file: runtime/engine/$f.py" >&2; exit 1; }
    patterns+=("runtime.engine.$f.*")
done
[[ ${#patterns[@]} -gt 0 ]] || patterns=("runtime.engine.*")  # named: re-test even if a result is stored

[[ "${MUTATION_KEEP:-0}" == 1 ]] || rm -rf mutants
mkdir -p mutants
start=$(date +%s)
echo "mutmut run ${patterns[*]} (log: mutants/run.log)"
mutmut run --max-children "${MUTATION_JOBS:-1}" "${patterns[@]}" > mutants/run.log 2>&1 || {
    tail -n 40 mutants/run.log >&2
    exit 1
}
echo "done in $(( ($(date +%s) - start) / 60 )) min"
echo
summary
