package inventory

import (
	"errors"
	"strings"
	"testing"
)

// TestProfileErase: a profile's erase is one of metadata, discard, zero
// and secure (absent means metadata, the release wipe of partition
// tables and signatures); anything else is refused naming the file, line
// and field.
func TestProfileErase(t *testing.T) {
	for _, tc := range []struct {
		name, profile string
		want          EraseMethod
		wantErr       string
	}{
		{"absent", "", "", ""},
		{"metadata", "    erase: metadata\n", EraseMetadata, ""},
		{"discard", "    erase: discard\n", EraseDiscard, ""},
		{"zero", "    erase: zero\n", EraseZero, ""},
		{"secure", "    erase: secure\n", EraseSecure, ""},
		{"unknown", "    erase: shred\n", "", "profiles.yaml:5:12: profiles[0].erase"},
		{"case", "    erase: Secure\n", "", "profiles[0].erase"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := loadWithProfile(t, labelServers, tc.profile)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Load = %v, want valid", err)
				}
				if got := res.Inventory.Profile("p").Erase; got != tc.want {
					t.Fatalf("erase = %q, want %q", got, tc.want)
				}
				return
			}
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Load = %v, want a validation error", err)
			}
			for _, fe := range verr.Errors {
				if strings.Contains(fe.Error(), tc.wantErr) {
					return
				}
			}
			t.Fatalf("Load = %v, want an error containing %q", verr.Errors, tc.wantErr)
		})
	}
}
