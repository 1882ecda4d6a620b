package ui

import (
	"strings"
	"testing"
)

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

// TestApprovePageCountsSteps renders the approval page with one and with
// two held steps: "this step", "these 2 steps" (it said "these 1 steps").
func TestApprovePageCountsSteps(t *testing.T) {
	tmpl, err := parseTemplates()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		held []PlanStep
		want string
	}{
		{[]PlanStep{{Server: "r3-n01", Action: "retire"}}, "run this step on its next pass"},
		{[]PlanStep{{Server: "r3-n01", Action: "retire"}, {Server: "r3-n02", Action: "retire"}}, "run these 2 steps on its next pass"},
	} {
		var b strings.Builder
		if err := tmpl["approve"].Execute(&b, layoutData{Page: approveView{Prefix: "9e1f2a3b4c5d", Held: tc.held}}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), tc.want) {
			t.Errorf("approve page with %d held steps lacks %q:\n%s", len(tc.held), tc.want, b.String())
		}
	}
}
