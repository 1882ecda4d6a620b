package redfish

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
)

// lastBodies is a transport that keeps the raw body of the last answer to
// each GET path, so a test can decode it independently of the driver.
type lastBodies struct {
	mu   sync.Mutex
	next http.RoundTripper
	last map[string][]byte
}

func (t *lastBodies) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(r)
	if err != nil || r.Method != http.MethodGet {
		return resp, err
	}
	raw, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	if rerr != nil {
		return nil, rerr
	}
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	t.mu.Lock()
	t.last[r.URL.Path] = raw
	t.mu.Unlock()
	return resp, nil
}

func (t *lastBodies) get(p string) []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.last[p]
}

// TestSystemDecodeReusedOnlyForEqualBytes: the System answer's decode is
// handed out again only when the BMC answers the same bytes as the last
// time; an answer that changed (a boot override PATCHed, a power action)
// is decoded afresh; after every driver operation the kept decode still
// equals a fresh decode of the kept bytes, so no caller modified the
// shared map. Over every vendor tree. The collector is off meanwhile: the
// kept answer lasts until the next collection (TestSystemDecodeReleasedByGC).
func TestSystemDecodeReusedOnlyForEqualBytes(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	for _, name := range []string{"dmtf-public-rackmount1", "dell-poweredge-r750-idrac9", "hpe-proliant-dl385gen10plusv2-ilo5",
		"lenovo-thinksystem-sr670v2-xcc", "supermicro-sys821ge-tnhr-x13", "openbmc-bmcweb-stock"} {
		t.Run(name, func(t *testing.T) {
			ts := offSim(t, name)
			rec := &lastBodies{next: http.DefaultTransport, last: map[string][]byte{}}
			d, err := New(Config{Endpoint: ts.URL, Username: "admin", Password: "s3cret", Transport: rec,
				PollInterval: time.Millisecond, RetryBase: time.Millisecond, PowerTimeout: 5 * time.Second,
				Timeout: 5 * time.Second, ResetEvidenceTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.Close(context.Background()) })
			ctx := context.Background()

			read := func(step string) map[string]any {
				t.Helper()
				sp, sys, err := d.system(ctx, step)
				if err != nil {
					t.Fatalf("%s: read System: %v", step, err)
				}
				if want := decodeObject(rec.get(sp)); !reflect.DeepEqual(sys, want) {
					t.Fatalf("%s: the System read differs from a fresh decode of the BMC's answer", step)
				}
				return sys
			}
			// unmodified checks that the kept decode still equals a fresh
			// decode of the kept bytes: no caller wrote into it.
			// The projection the power and boot paths read (sysProj) is
			// checked the same way once they have read one.
			unmodified := func(step string) {
				t.Helper()
				for _, c := range []struct {
					name  string
					cache *bodyCache
					dec   func([]byte) map[string]any
				}{{"System", &d.sysBody, decodeObject}, {"System projection", &d.sysProj, projectSystem}} {
					c.cache.mu.Lock()
					k := c.cache.last.Value()
					c.cache.mu.Unlock()
					if k == nil && (c.cache == &d.sysBody || step != "reads") {
						t.Fatalf("%s: no %s decode kept", step, c.name)
					}
					if k != nil && !reflect.DeepEqual(k.body, c.dec(k.raw)) {
						t.Fatalf("%s: the kept %s decode was modified by a caller", step, c.name)
					}
				}
			}

			first := read("first")
			again := read("again")
			if reflect.ValueOf(first).Pointer() != reflect.ValueOf(again).Pointer() {
				t.Fatal("an unchanged System answer was decoded again")
			}
			unmodified("reads")

			// A target other than the tree's, so the answer changes.
			dev, target := bmc.BootPXE, "Pxe"
			if strv(obj(first, "Boot"), "BootSourceOverrideTarget") == "Pxe" {
				dev, target = bmc.BootDisk, "Hdd"
			}
			if err := d.SetBootOverride(ctx, bmc.BootOverride{Device: dev}); err != nil {
				t.Fatalf("SetBootOverride: %v", err)
			}
			unmodified("SetBootOverride")
			after := read("after the override")
			if reflect.ValueOf(after).Pointer() == reflect.ValueOf(first).Pointer() {
				t.Fatal("the System changed by the override was not decoded afresh")
			}
			if got := strv(obj(after, "Boot"), "BootSourceOverrideTarget"); got != target {
				t.Fatalf("Boot.BootSourceOverrideTarget after the override = %q, want %s", got, target)
			}
			if o, err := d.BootOverride(ctx); err != nil || o.Device != dev {
				t.Fatalf("BootOverride = %+v, %v; want %s", o, err, dev)
			}
			unmodified("BootOverride")

			if err := d.Power(ctx, bmc.PowerActionOn); err != nil {
				t.Fatalf("Power on: %v", err)
			}
			unmodified("Power on")
			if ps, err := d.PowerState(ctx); err != nil || ps != bmc.PowerOn {
				t.Fatalf("PowerState after on = %s, %v", ps, err)
			}
			if ps := powerOf(read("after power on")); ps != bmc.PowerOn {
				t.Fatalf("System PowerState after on = %s", ps)
			}
			if _, _, err := d.Health(ctx); err != nil {
				t.Fatalf("Health: %v", err)
			}
			unmodified("Health")
			if _, err := d.Info(ctx); err != nil {
				t.Fatalf("Info: %v", err)
			}
			unmodified("Info")
			if err := d.Power(ctx, bmc.PowerActionOff); err != nil {
				t.Fatalf("Power off: %v", err)
			}
			unmodified("Power off")
			if ps := powerOf(read("after power off")); ps != bmc.PowerOff {
				t.Fatalf("System PowerState after off = %s", ps)
			}
		})
	}
}

// TestSystemDecodeReleasedByGC: the kept System answer does not outlive a
// garbage collection, so idle drivers hold no decoded Systems; the next
// read decodes afresh and is kept again. The collector runs only when
// the test asks.
func TestSystemDecodeReleasedByGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	ts := offSim(t, "dell-poweredge-r750-idrac9")
	d, err := New(Config{Endpoint: ts.URL, Username: "admin", Password: "s3cret", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	// PowerState reads the projection (sysProj); the second read finds
	// the first one's kept.
	kept := func() *keptBody {
		d.sysProj.mu.Lock()
		defer d.sysProj.mu.Unlock()
		return d.sysProj.last.Value()
	}
	for range 2 {
		if ps, err := d.PowerState(context.Background()); err != nil || ps != bmc.PowerOff {
			t.Fatalf("PowerState = %s, %v", ps, err)
		}
	}
	if kept() == nil {
		t.Fatal("no System answer kept after a read")
	}
	runtime.GC()
	if kept() != nil {
		t.Fatal("the kept System answer outlived a garbage collection")
	}
	if ps, err := d.PowerState(context.Background()); err != nil || ps != bmc.PowerOff {
		t.Fatalf("PowerState after the collection = %s, %v", ps, err)
	}
	if kept() == nil {
		t.Fatal("no System answer kept after the read following the collection")
	}
}

// offSim serves the fixture tree name from bmcsim (user admin, password
// s3cret, the machine off) on loopback until the test ends.
func offSim(t *testing.T, name string) *httptest.Server {
	t.Helper()
	dir, err := bmcsim.TreeDir("", name)
	if err != nil {
		t.Fatalf("TreeDir(%q): %v", name, err)
	}
	var trees bmcsim.Trees
	tr, err := trees.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := bmcsim.New(bmcsim.Config{Tree: tr, Username: "admin", Password: "s3cret", Power: bmcsim.NewMemoryPower(false)})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(sim)
	t.Cleanup(ts.Close)
	return ts
}

// BenchmarkSystemDecode decodes Dell iDRAC 9's ComputerSystem (15.6 KB,
// as the fixture tree holds it) whole (decodeObject: what every System
// read cost before the power and boot paths read the projection) and as
// the projection they read (projectSystem).
func BenchmarkSystemDecode(b *testing.B) {
	dir, err := bmcsim.TreeDir("", "dell-poweredge-r750-idrac9")
	if err != nil {
		b.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "redfish", "v1", "Systems", "System.Embedded.1", "index.json"))
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		dec  func([]byte) map[string]any
	}{{"whole", decodeObject}, {"projection", projectSystem}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				if c.dec(raw) == nil {
					b.Fatal("not an object")
				}
			}
		})
	}
}

// TestProjectionMatchesWholeDecode: over every vendor tree's System, the
// projection holds exactly the stateProps the whole decode has, with
// equal values.
func TestProjectionMatchesWholeDecode(t *testing.T) {
	for _, name := range []string{"dmtf-public-rackmount1", "dell-poweredge-r750-idrac9", "hpe-proliant-dl385gen10plusv2-ilo5",
		"lenovo-thinksystem-sr670v2-xcc", "supermicro-sys821ge-tnhr-x13", "openbmc-bmcweb-stock"} {
		dir, err := bmcsim.TreeDir("", name)
		if err != nil {
			t.Fatal(err)
		}
		paths, _ := filepath.Glob(filepath.Join(dir, "redfish", "v1", "Systems", "*", "index.json"))
		if len(paths) == 0 {
			t.Fatalf("%s: no System", name)
		}
		for _, p := range paths {
			raw, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			whole, proj := decodeObject(raw), projectSystem(raw)
			if want := stateSubset(whole); !reflect.DeepEqual(proj, want) {
				t.Errorf("%s: projection differs from the whole decode's %v", p, stateProps)
			}
			if _, ok := proj["Boot"]; !ok {
				t.Errorf("%s: no Boot in the projection", p)
			}
		}
	}
}

// stateSubset is what projectSystem should give for a System whose whole
// decode is whole: its stateProps members, those it has.
func stateSubset(whole map[string]any) map[string]any {
	want := map[string]any{}
	for _, k := range stateProps {
		if v, ok := whole[k]; ok {
			want[k] = v
		}
	}
	return want
}
