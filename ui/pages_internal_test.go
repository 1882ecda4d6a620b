package ui

import "testing"

// TestHumanBytes checks the unit the console shows sizes in: the largest
// binary unit the value reaches, one decimal; a 4 MiB image was "0.0 GiB".
func TestHumanBytes(t *testing.T) {
	for _, tc := range []struct {
		in   int64
		want string
	}{
		{0, "0 B"},
		{512, "512 B"},
		{1023, "1023 B"},
		{1024, "1.0 KiB"},
		{1536, "1.5 KiB"},
		{1024*1024 - 1, "1.0 MiB"}, // not "1024.0 KiB"
		{4 << 20, "4.0 MiB"},
		{2 << 30, "2.0 GiB"},
		{128 << 30, "128.0 GiB"},
		{480103981056, "447.1 GiB"},
		{1920383410176, "1.7 TiB"},
		{3 << 40, "3.0 TiB"},
		{2048 << 40, "2048.0 TiB"},
		{-1, "-1 B"},
	} {
		if got := humanBytes(tc.in); got != tc.want {
			t.Errorf("humanBytes(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
