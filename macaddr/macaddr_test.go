package macaddr

import (
	"encoding/json"
	"errors"
	"net"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    string // "" = error
		unicast bool   // ParseUnicast also accepts it
	}{
		{"52:54:00:12:34:56", "52:54:00:12:34:56", true},
		{"52:54:00:AB:cd:EF", "52:54:00:ab:cd:ef", true},
		{"52-54-00-12-34-56", "52:54:00:12:34:56", true},
		{"525400123456", "52:54:00:12:34:56", true},
		{"525400AABB01", "52:54:00:aa:bb:01", true},
		{"5254.0012.3456", "52:54:00:12:34:56", true},
		{"5254.00aa.bb01", "52:54:00:aa:bb:01", true},
		{"00:00:00:00:00:00", "00:00:00:00:00:00", false},
		{"01:00:5e:00:00:01", "01:00:5e:00:00:01", false}, // IPv4 multicast
		{"ff:ff:ff:ff:ff:ff", "ff:ff:ff:ff:ff:ff", false}, // broadcast
		{"33:33:00:00:00:01", "33:33:00:00:00:01", false}, // IPv6 multicast
		{"52:54:00-12:34:56", "", false},                  // mixed separators
		{"52:54:00:12:34", "", false},
		{"52:54:00:12:34:5g", "", false},
		{"zz:54:00:aa:bb:01", "", false},
		{"52545400aabb01", "", false},
		{"", "", false},
		{" 52:54:00:12:34:56", "", false},
		{"../../etc/passwd", "", false},
		{"52:54:00:12:34:56\x00", "", false},
		{"52:54:00:12:34:56:78:9a", "", false}, // EUI-64
		{"52%3A54%3A00", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Parse(tt.in)
			if tt.want == "" {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("Parse(%q) = %v, %v; want ErrInvalid", tt.in, got, err)
				}
			} else if err != nil || got.String() != tt.want {
				t.Fatalf("Parse(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
			}
			u, err := ParseUnicast(tt.in)
			if tt.unicast != (err == nil) {
				t.Fatalf("ParseUnicast(%q) = %v, %v; want ok=%v", tt.in, u, err, tt.unicast)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Fatalf("ParseUnicast(%q) error %v does not wrap ErrInvalid", tt.in, err)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	for _, tt := range []struct {
		hw net.HardwareAddr
		ok bool
	}{
		{net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}, true},
		{net.HardwareAddr{0x01, 0, 0x5e, 0, 0, 1}, false},
		{net.HardwareAddr{0, 0, 0, 0, 0, 0}, false},
		{net.HardwareAddr{0x52, 0x54, 0, 0, 0}, false},
		{net.HardwareAddr{0x02, 0, 0, 0, 0, 0, 0, 1}, false},
		{nil, false},
	} {
		if err := Check(tt.hw); (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("Check(%v) = %v, want ok=%v", tt.hw, err, tt.ok)
		}
	}
}

func TestText(t *testing.T) {
	var v struct{ MAC MAC }
	if err := json.Unmarshal([]byte(`{"MAC":"52-54-00-AA-BB-01"}`), &v); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(v)
	if string(b) != `{"MAC":"52:54:00:aa:bb:01"}` {
		t.Fatalf("round trip = %s", b)
	}
	if err := json.Unmarshal([]byte(`{"MAC":"nope"}`), &v); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Unmarshal(nope) = %v, want ErrInvalid", err)
	}
	hw := v.MAC.HardwareAddr()
	hw[0] = 0xff
	if v.MAC[0] == 0xff {
		t.Fatal("HardwareAddr aliases the MAC")
	}
}

// FuzzParse checks Parse against the parsers it replaced: it accepts exactly
// the 6-byte forms net.ParseMAC accepts (state's old rule) plus 12 bare hex
// digits (inventory's and boot's), with the same result, and round-trips.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"52:54:00:12:34:56", "52-54-00-12-34-56", "525400123456", "5254.0012.3456", "ff:ff:ff:ff:ff:ff", "", "52:54:00-12:34:56", "0000.0000.0000.0000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := Parse(s)
		hw, nerr := net.ParseMAC(s)
		old := nerr == nil && len(hw) == 6
		bare := len(s) == 12 && isHex(s)
		if (err == nil) != (old || bare) {
			t.Fatalf("Parse(%q) = %v, %v; net.ParseMAC = %v, %v; bare=%v", s, m, err, hw, nerr, bare)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse(%q) error %v does not wrap ErrInvalid", s, err)
			}
			return
		}
		if old && m.String() != hw.String() {
			t.Fatalf("Parse(%q) = %s, net.ParseMAC = %s", s, m, hw)
		}
		again, err := Parse(m.String())
		if err != nil || again != m {
			t.Fatalf("round trip of %q: %v, %v", s, again, err)
		}
		if u, err := ParseUnicast(s); (err == nil) != (m.CheckUnicast() == nil) || (err == nil && u != m) {
			t.Fatalf("ParseUnicast(%q) = %v, %v disagrees with Parse+CheckUnicast", s, u, err)
		}
	})
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if _, ok := unhex(s[i]); !ok {
			return false
		}
	}
	return true
}
