#!/bin/sh
# scripts/fscheck.sh before|after FILE: the "no test writes outside its own
# temporary folders" check. `before` lists the names in / and a few folders
# a stray test could write to (system folders and $HOME's top level and
# dot-folders) into FILE; `after` lists them again and fails naming every
# entry that is new. `make test` and .ci/run run the suite between the two.
# Only names are compared (no contents), so the Go build cache filling up
# under an existing ~/.cache/go-build does not count.
set -eu
mode=${1:?usage: fscheck.sh before|after FILE}
file=${2:?usage: fscheck.sh before|after FILE}
home=${HOME:-/root}

list() {
	for d in / /etc /opt /srv /mnt /media /var /var/lib /var/tmp /usr/local /usr/local/bin /usr/local/lib \
		"$home" "$home/.config" "$home/.cache" "$home/.local" "$home/.local/share" "$home/.local/bin"; do
		[ -d "$d" ] || continue
		# One entry per line, full path; unreadable folders list nothing.
		ls -A "$d" 2>/dev/null | while IFS= read -r n; do
			case $d in /) echo "/$n" ;; *) echo "$d/$n" ;; esac
		done
	done | LC_ALL=C sort -u
}

case $mode in
before)
	mkdir -p "$(dirname "$file")"
	list > "$file"
	;;
after)
	[ -f "$file" ] || { echo "fscheck: no snapshot $file (run: $0 before $file)" >&2; exit 2; }
	now=$(mktemp)
	trap 'rm -f "$now"' EXIT
	list > "$now"
	new=$(LC_ALL=C comm -13 "$file" "$now")
	if [ -n "$new" ]; then
		echo "fscheck: the test suite left these outside its temporary folders:" >&2
		echo "$new" | sed 's/^/  /' >&2
		exit 1
	fi
	echo "fscheck: nothing new in / or \$HOME ($(wc -l < "$now") entries checked)"
	;;
*) echo "usage: $0 before|after FILE" >&2; exit 2 ;;
esac
