package boot

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestMemTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		tk := NewMemTokens()
		mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
		other := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 2}
		tok, err := tk.Issue(ctx, mac, "commission", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(tok) != 43 {
			t.Fatalf("token length %d, want 43", len(tok))
		}
		for k := range tk.entries {
			if string(k[:]) == tok {
				t.Fatal("token stored in clear")
			}
		}
		if err := tk.Consume(ctx, other, "commission", tok); !errors.Is(err, ErrTokenInvalid) {
			t.Fatalf("Consume(other mac) = %v, want ErrTokenInvalid", err)
		}
		if err := tk.Consume(ctx, mac, "deploy", tok); !errors.Is(err, ErrTokenInvalid) {
			t.Fatalf("Consume(other purpose) = %v, want ErrTokenInvalid", err)
		}
		if err := tk.Consume(ctx, mac, "commission", tok); err != nil {
			t.Fatalf("first Consume = %v", err)
		}
		if err := tk.Consume(ctx, mac, "commission", tok); !errors.Is(err, ErrTokenUsed) {
			t.Fatalf("second Consume = %v, want ErrTokenUsed", err)
		}
		tok2, _ := tk.Issue(ctx, mac, "commission", time.Minute)
		time.Sleep(time.Minute + time.Second) // fake clock under synctest
		if err := tk.Consume(ctx, mac, "commission", tok2); !errors.Is(err, ErrTokenExpired) {
			t.Fatalf("Consume after ttl = %v, want ErrTokenExpired", err)
		}
		if err := tk.Consume(ctx, mac, "commission", "nope"); !errors.Is(err, ErrTokenInvalid) {
			t.Fatalf("Consume(unknown) = %v, want ErrTokenInvalid", err)
		}
	})
}

func TestMemTokensConcurrentConsume(t *testing.T) {
	ctx := context.Background()
	tk := NewMemTokens()
	mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 3}
	tok, _ := tk.Issue(ctx, mac, "p", time.Minute)
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for range 16 {
		wg.Go(func() {
			if tk.Consume(ctx, mac, "p", tok) == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if wins != 1 {
		t.Fatalf("%d concurrent Consume calls succeeded, want 1", wins)
	}
}

func TestMemLookupDiscovered(t *testing.T) {
	ctx := context.Background()
	var l MemLookup
	mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 9}
	if _, err := l.Lookup(ctx, mac); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Lookup(unknown) = %v, want ErrNotFound", err)
	}
	a, err := l.Discovered(ctx, Discovery{MAC: mac, Source: "dhcp", Arch: 7})
	if err != nil || a.Lifecycle != LifecycleCommissioning {
		t.Fatalf("Discovered = %+v, %v", a, err)
	}
	if _, err := l.Discovered(ctx, Discovery{MAC: mac, Source: "ipxe"}); err != nil {
		t.Fatal(err)
	}
	if got := l.DiscoveredMACs(); len(got) != 1 || got[0].Source != "dhcp" {
		t.Fatalf("DiscoveredMACs = %+v, want one dhcp discovery", got)
	}
	if _, err := l.Discovered(ctx, Discovery{MAC: net.HardwareAddr{1, 0, 0x5e, 0, 0, 1}}); !errors.Is(err, ErrInvalidMAC) {
		t.Fatalf("Discovered(multicast) = %v, want ErrInvalidMAC", err)
	}
}

func TestAutoEnrollFromEnv(t *testing.T) {
	for v, want := range map[string]bool{"1": true, "true": true, " ON ": true, "yes": true, "": false, "0": false, "false": false, "2": false} {
		got := AutoEnrollFromEnv(func(k string) string {
			if k != "MACHINA_METAL_AUTO_ENROLL" {
				t.Fatalf("looked up %q", k)
			}
			return v
		})
		if got != want {
			t.Errorf("AutoEnrollFromEnv(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestGRUBPath(t *testing.T) {
	for in, want := range map[string]string{
		"http://10.99.0.1:8080/boot/grub":       "(http,10.99.0.1:8080)/boot/grub",
		"http://10.99.0.1/boot/ramdisk/vmlinuz": "(http,10.99.0.1:80)/boot/ramdisk/vmlinuz",
		"http://ctl.lan:8080/a?b=c":             "(http,ctl.lan:8080)/a?b=c",
	} {
		if got, err := GRUBPath(in); err != nil || got != want {
			t.Errorf("GRUBPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"https://10.0.0.1/x", "http://10.0.0.1/$x", "ftp://h/x", "http://u:p@h/x", `http://h/"`} {
		if got, err := GRUBPath(bad); err == nil {
			t.Errorf("GRUBPath(%q) = %q, want an error", bad, got)
		}
	}
	if _, err := GRUBChainConfig("http://h:1/boot/grub?x=1"); err == nil {
		t.Error("GRUBChainConfig accepted a script URL with a query")
	}
}
