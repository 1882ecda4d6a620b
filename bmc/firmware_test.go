package bmc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func i64(n int64) *int64 { return &n }

func testRegistry() *BIOSRegistry {
	r := &BIOSRegistry{ID: "BiosAttributeRegistry.v1_0_0", Attributes: []BIOSAttribute{
		{Name: "ProcVirtualization", Type: AttrEnumeration, AllowedValues: []string{"Enabled", "Disabled"}, ResetRequired: true},
		{Name: "AcPwrRcvryUserDelay", Type: AttrInteger, LowerBound: i64(60), UpperBound: i64(240)},
		{Name: "AssetTag", Type: AttrString, MaxLength: i64(4)},
		{Name: "SerialDebug", Type: AttrBoolean},
		{Name: "SetupPassword", Type: AttrPassword, MinLength: i64(8)},
		{Name: "SystemBiosVersion", Type: AttrString, ReadOnly: true},
	}}
	r.Sort()
	return r
}

// TestCheckAttribute: every refusal names the attribute, its reason and
// what is allowed; accepted values come back normalised.
func TestCheckAttribute(t *testing.T) {
	reg := testRegistry()
	for _, c := range []struct {
		name    string
		v       any
		reason  AttributeRefusal
		allowed string
	}{
		{"Nope", "x", RefuseUnknown, ""},
		{"ProcVirtualization", "enabled", RefuseNotInList, "Enabled, Disabled"},
		{"ProcVirtualization", true, RefuseWrongType, "Enabled, Disabled"},
		{"AcPwrRcvryUserDelay", 30, RefuseOutOfRange, "60..240"},
		{"AcPwrRcvryUserDelay", 61.5, RefuseWrongType, "60..240"},
		{"AcPwrRcvryUserDelay", "90", RefuseWrongType, "60..240"},
		{"AssetTag", "toolong", RefuseOutOfRange, "length 0..4"},
		{"SerialDebug", "true", RefuseWrongType, "true, false"},
		{"SetupPassword", "short", RefuseOutOfRange, "length 8.."},
		{"SystemBiosVersion", "1.0", RefuseReadOnly, ""},
	} {
		_, err := CheckAttribute(reg, c.name, c.v)
		var ae *AttributeError
		if !errors.As(err, &ae) || !errors.Is(err, ErrAttributeRefused) || ae.Reason != c.reason || ae.Attribute != c.name || strings.Join(ae.Allowed, ", ") != c.allowed {
			t.Errorf("%s=%v: %#v", c.name, c.v, err)
			continue
		}
		if !strings.Contains(err.Error(), c.name) || (c.allowed != "" && !strings.Contains(err.Error(), "allowed: "+c.allowed)) {
			t.Errorf("%s: message %q", c.name, err)
		}
		if c.name == "SetupPassword" && strings.Contains(err.Error(), "short") {
			t.Errorf("password value in error: %q", err)
		}
	}
	for _, c := range []struct {
		name string
		v    any
		want any
	}{
		{"ProcVirtualization", "Disabled", "Disabled"},
		{"AcPwrRcvryUserDelay", 90, int64(90)},
		{"AcPwrRcvryUserDelay", float64(90), int64(90)},
		{"AcPwrRcvryUserDelay", json.Number("90"), int64(90)},
		{"SerialDebug", false, false},
	} {
		got, err := CheckAttribute(reg, c.name, c.v)
		if err != nil || got != c.want {
			t.Errorf("%s=%v: %v %v", c.name, c.v, got, err)
		}
	}
	// No registry: accepted, normalised.
	if got, err := CheckAttribute(nil, "Anything", 3.0); err != nil || got != int64(3) {
		t.Errorf("nil registry: %v %v", got, err)
	}
	// CheckSettings reports every refusal.
	_, err := CheckSettings(reg, BIOSSettings{"Nope": 1, "ProcVirtualization": "x", "SerialDebug": true})
	if err == nil || !strings.Contains(err.Error(), "Nope") || !strings.Contains(err.Error(), "ProcVirtualization") {
		t.Errorf("CheckSettings: %v", err)
	}
}

// fakeTasks answers a scripted sequence of task reads.
type fakeTasks struct {
	steps []func() (*Task, error)
	n     int
}

func (f *fakeTasks) Task(ctx context.Context, uri string) (*Task, error) {
	s := f.steps[min(f.n, len(f.steps)-1)]
	f.n++
	return s()
}

func pct(n int) *int { return &n }

// TestWaitTask: transient errors (a BMC restarting) are polled through;
// a failed task is a *TaskError; a hard error ends the wait; a context
// that ends is ErrTimeout.
func TestWaitTask(t *testing.T) {
	ctx := context.Background()
	run := &Task{URI: "/t/1", State: TaskRunning, PercentComplete: pct(50)}
	ok := &Task{URI: "/t/1", State: TaskCompleted, Status: "OK", PercentComplete: pct(100)}
	bad := &Task{URI: "/t/1", State: TaskException, Status: "Critical", Messages: []TaskMessage{{MessageID: "Update.1.0.ApplyFailed", Message: "bad image"}}}
	transient := fmt.Errorf("x: %w", ErrUnreachable)
	f := &fakeTasks{steps: []func() (*Task, error){
		func() (*Task, error) { return run, nil },
		func() (*Task, error) { return nil, transient },
		func() (*Task, error) { return nil, fmt.Errorf("503: %w", ErrTransient) },
		func() (*Task, error) { return ok, nil },
	}}
	var seen []int
	got, err := WaitTask(ctx, f, "/t/1", time.Millisecond, func(t *Task) { seen = append(seen, *t.PercentComplete) })
	if err != nil || got != ok || fmt.Sprint(seen) != "[50 100]" {
		t.Fatalf("through restart: %v %v %v", got, err, seen)
	}
	f = &fakeTasks{steps: []func() (*Task, error){func() (*Task, error) { return bad, nil }}}
	_, err = WaitTask(ctx, f, "/t/1", time.Millisecond, nil)
	var te *TaskError
	if !errors.As(err, &te) || !errors.Is(err, ErrTaskFailed) || !strings.Contains(err.Error(), "bad image") {
		t.Fatalf("failed task: %v", err)
	}
	f = &fakeTasks{steps: []func() (*Task, error){func() (*Task, error) { return nil, errors.New("HTTP 404") }}}
	if _, err = WaitTask(ctx, f, "/t/1", time.Millisecond, nil); err == nil || IsTransient(err) {
		t.Fatalf("hard error: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	f = &fakeTasks{steps: []func() (*Task, error){func() (*Task, error) { cancel(); return run, nil }}}
	if _, err = WaitTask(cctx, f, "/t/1", time.Millisecond, nil); !errors.Is(err, ErrTimeout) {
		t.Fatalf("context: %v", err)
	}
}
