#!/bin/sh
# Lists every Go fuzz target as PKGDIR:FuncName, for `make fuzz`.
set -eu
cd "$(dirname "$0")/.."
git ls-files '*_test.go' | while read -r f; do
	grep -oE '^func (Fuzz[A-Za-z0-9_]+)\(' "$f" | sed -E 's/^func (Fuzz[A-Za-z0-9_]+)\(/\1/' | while read -r fn; do
		echo "./$(dirname "$f"):$fn"
	done
done
