#!/usr/bin/env bash
# Docs: every repository path named in README.md, docs/, bench/results/ and
# the examples' and bindings' READMEs exists (scripts/check-doc-paths.py,
# whose self-test first shows it failing on a doc that names a missing one),
# and the README's table of part times has a row for every part here.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 scripts/check-doc-paths.py --self-test
python3 scripts/check-doc-paths.py
missing=()
for part in scripts/test.d/*.sh; do
  grep -q "^| \`${part#scripts/test.d/}\`" README.md || missing+=("${part#scripts/test.d/}")
done
[ ${#missing[@]} = 0 ] || { echo "README.md's table of part times has no row for: ${missing[*]}" >&2; exit 1; }
echo "docs: README.md's table of part times names all $(ls scripts/test.d/*.sh | wc -l) parts"
