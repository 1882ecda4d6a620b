package main

import (
	"runtime/debug"
	"testing"
)

func TestValidateGCSettings(t *testing.T) {
	for _, tc := range []struct {
		yamlBytes int64
		limit     int64
	}{
		{0, 160 << 20},
		{3_000_000, 160 << 20},    // 10,000 servers: the floor
		{16 << 20, 48 * 16 << 20}, // one file at --max-file-size's default: 48 bytes per byte
	} {
		percent, limit := gcSettings(tc.yamlBytes)
		if percent != 400 || limit != tc.limit {
			t.Errorf("gcSettings(%d) = %d, %d; want 400, %d", tc.yamlBytes, percent, limit, tc.limit)
		}
	}
}

// TestTuneGCLeavesOperatorSetting: GOGC or GOMEMLIMIT in the environment
// means the operator chose; validate must not override it.
func TestTuneGCLeavesOperatorSetting(t *testing.T) {
	for _, name := range []string{"GOGC", "GOMEMLIMIT"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, "100")
			before := debug.SetGCPercent(123)
			defer debug.SetGCPercent(before)
			limit := debug.SetMemoryLimit(-1)
			tuneGC(1 << 20)
			if got := debug.SetGCPercent(before); got != 123 {
				t.Errorf("GC percent after tuneGC with %s set = %d, want 123 (untouched)", name, got)
			}
			if got := debug.SetMemoryLimit(limit); got != limit {
				t.Errorf("memory limit after tuneGC with %s set = %d, want %d (untouched)", name, got, limit)
			}
		})
	}
}
