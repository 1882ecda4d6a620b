package state_test

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"

	"github.com/machina-metal/machina/state"
)

func rng(s, e string) state.AddressRange {
	return state.AddressRange{Start: netip.MustParseAddr(s), End: netip.MustParseAddr(e)}
}

func one(a string) state.AddressRange { return rng(a, a) }

// TestAddressPoolPick: the lowest free address in pool order, skipping
// excluded ranges (reserved, gateway, fixed addresses, network and
// broadcast) and taken addresses; the second range only once the first is
// full; exhaustion reports false; Size counts what can be handed out.
func TestAddressPoolPick(t *testing.T) {
	p := state.NewAddressPool("mgmt",
		[]state.AddressRange{rng("10.0.0.200", "10.0.0.255"), rng("10.0.0.0", "10.0.0.9")},
		[]state.AddressRange{one("10.0.0.0"), one("10.0.0.255"), one("10.0.0.1"), rng("10.0.0.200", "10.0.0.201"), one("10.0.0.203"), rng("10.0.0.205", "10.0.0.254"), one("10.0.0.5")})
	if got, want := p.Size(), uint64(2+8-1); got != want { // 202, 204; 2..9 minus 5
		t.Fatalf("Size = %d, want %d", got, want)
	}
	var taken state.SortedAddrs
	var got []string
	for {
		a, ok := p.Pick(taken)
		if !ok {
			break
		}
		got = append(got, a.String())
		taken = append(taken, a)
		state.SortAddrs(taken)
	}
	want := "[10.0.0.202 10.0.0.204 10.0.0.2 10.0.0.3 10.0.0.4 10.0.0.6 10.0.0.7 10.0.0.8 10.0.0.9]"
	if fmt.Sprint(got) != want {
		t.Fatalf("picks = %v, want %s", got, want)
	}
	// The Picker (the plan's simulation) picks the same sequence.
	pk := state.NewPicker(p, state.SortedAddrs{})
	var sim []string
	for {
		a, ok := pk.Next()
		if !ok {
			break
		}
		sim = append(sim, a.String())
	}
	if fmt.Sprint(sim) != want {
		t.Fatalf("Picker = %v, want %s", sim, want)
	}
	// Held addresses in the middle are skipped, the hole below is used.
	held := state.SortedAddrs{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.202")}
	if a, _ := p.Pick(held); a.String() != "10.0.0.204" {
		t.Fatalf("Pick with held = %s, want 10.0.0.204", a)
	}
	if p.Pickable(netip.MustParseAddr("10.0.0.5")) || p.Pickable(netip.MustParseAddr("10.0.0.100")) || !p.Pickable(netip.MustParseAddr("10.0.0.9")) {
		t.Fatal("Pickable: excluded or outside the pools reported pickable, or a pool address not")
	}
	v6 := state.NewAddressPool("v6", []state.AddressRange{rng("fd00::", "fd00::ffff:ffff:ffff:ffff")}, []state.AddressRange{one("fd00::")})
	if a, _ := v6.Pick(state.SortedAddrs{}); a.String() != "fd00::1" {
		t.Fatalf("v6 Pick = %s, want fd00::1", a)
	}
	if v6.Size() != ^uint64(0) {
		t.Fatalf("v6 Size = %d, want saturated", v6.Size())
	}
}

func readyServer(t *testing.T, s *state.Store, name string) {
	t.Helper()
	mustCreate(t, s, state.Server{Name: name, Lifecycle: state.LifecycleReady})
}

func allocMove(name string) state.Move {
	return state.Move{Server: name, From: state.LifecycleReady, To: state.LifecycleAllocated, Reason: "test",
		Update: func(s *state.Server) error { s.Allocation = &state.Allocation{Profile: "p"}; return nil }}
}

func releaseMove(name string) state.Move {
	return state.Move{Server: name, From: state.LifecycleAllocated, To: state.LifecycleReady, Reason: "test",
		Update: func(s *state.Server) error { s.Allocation = nil; return nil }}
}

// TestApplyClaiming, on both engines: addresses are taken with the move,
// the lowest free first, a preferred free one when asked; exhaustion
// fails the move and writes nothing (the server stays ready, no record);
// release frees (policy free) or keeps (policy keep) the address, and a
// re-allocation to the same profile gets the kept one back.
func TestApplyClaiming(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		pool := state.NewAddressPool("tenant", []state.AddressRange{rng("10.1.0.10", "10.1.0.12")}, []state.AddressRange{one("10.1.0.11")})
		claim := []state.AddressClaim{{Interface: "vlan120", Pool: pool}}
		for _, n := range []string{"a", "b", "c", "d"} {
			readyServer(t, s, n)
		}
		a, err := s.ApplyClaiming(allocMove("a"), "p", claim)
		if err != nil {
			t.Fatal(err)
		}
		if len(a.Addresses) != 1 || a.Addresses[0].Address != "10.1.0.10" || a.Addresses[0].Interface != "vlan120" {
			t.Fatalf("a.Addresses = %+v, want 10.1.0.10 on vlan120", a.Addresses)
		}
		b, err := s.ApplyClaiming(allocMove("b"), "p", claim)
		if err != nil || b.Addresses[0].Address != "10.1.0.12" {
			t.Fatalf("b: %v %+v, want 10.1.0.12", err, b.Addresses)
		}
		_, err = s.ApplyClaiming(allocMove("c"), "p", claim)
		var pe *state.PoolExhaustedError
		if !errors.As(err, &pe) || pe.Subnet != "tenant" || pe.Size != 2 || !errors.Is(err, state.ErrPoolExhausted) {
			t.Fatalf("c: %v, want PoolExhaustedError of tenant size 2", err)
		}
		if c, _ := s.Server("c"); c.Lifecycle != state.LifecycleReady || c.Allocation != nil || len(c.Addresses) != 0 {
			t.Fatalf("c after exhaustion: %s %+v %+v, want ready and nothing", c.Lifecycle, c.Allocation, c.Addresses)
		}
		// Keep: a's address stays with it through release.
		if _, err := s.ApplyReleasing(releaseMove("a"), func(string) bool { return true }); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ApplyClaiming(allocMove("c"), "p", claim); !errors.Is(err, state.ErrPoolExhausted) {
			t.Fatalf("c after a kept its address: %v, want exhausted", err)
		}
		a, err = s.ApplyClaiming(allocMove("a"), "p", claim)
		if err != nil || a.Addresses[0].Address != "10.1.0.10" {
			t.Fatalf("a re-allocated: %v %+v, want its kept 10.1.0.10", err, a.Addresses)
		}
		// Free: b's address goes back and c gets it.
		if _, err := s.ApplyReleasing(releaseMove("b"), func(string) bool { return false }); err != nil {
			t.Fatal(err)
		}
		if b, _ := s.Server("b"); len(b.Addresses) != 0 {
			t.Fatalf("b released with free: %+v, want none", b.Addresses)
		}
		pref := []state.AddressClaim{{Interface: "vlan120", Pool: pool, Prefer: netip.MustParseAddr("10.1.0.10")}}
		c, err := s.ApplyClaiming(allocMove("c"), "p", pref)
		if err != nil || c.Addresses[0].Address != "10.1.0.12" {
			t.Fatalf("c: %v %+v, want 10.1.0.12 (its preference is held by a)", err, c.Addresses)
		}
		h, err := s.AddressHolders("tenant")
		if err != nil || fmt.Sprint(h) != "map[10.1.0.10:a 10.1.0.12:c]" {
			t.Fatalf("holders = %v %v", h, err)
		}
	})
}

// TestApplyClaimingNoPartial: a server with two pool interfaces, the
// second pool exhausted, gets neither address and is not allocated.
func TestApplyClaimingNoPartial(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		readyServer(t, s, "a")
		claims := []state.AddressClaim{
			{Interface: "eth0", Pool: state.NewAddressPool("big", []state.AddressRange{rng("10.2.0.10", "10.2.0.20")}, nil)},
			{Interface: "eth1", Pool: state.NewAddressPool("empty", []state.AddressRange{one("10.3.0.10")}, []state.AddressRange{one("10.3.0.10")})},
		}
		if _, err := s.ApplyClaiming(allocMove("a"), "p", claims); !errors.Is(err, state.ErrPoolExhausted) {
			t.Fatalf("ApplyClaiming = %v, want exhausted", err)
		}
		if h, _ := s.AddressHolders("big"); len(h) != 0 {
			t.Fatalf("big holders = %v, want none (no partial allocation)", h)
		}
		if a, _ := s.Server("a"); a.Lifecycle != state.LifecycleReady {
			t.Fatalf("a is %s, want ready", a.Lifecycle)
		}
	})
}

// claimRace allocates n servers at once through the stores in turn and
// checks every address is held once and each server holds one.
func claimRace(t *testing.T, stores []*state.Store, n int) {
	pool := state.NewAddressPool("tenant", []state.AddressRange{rng("10.9.0.1", "10.9.3.254")}, nil)
	for i := range n {
		readyServer(t, stores[0], fmt.Sprintf("s%02d", i))
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			st := stores[i%len(stores)]
			_, errs[i] = st.ApplyClaiming(allocMove(fmt.Sprintf("s%02d", i)), "p", []state.AddressClaim{{Interface: "eth0", Pool: pool}})
		}()
	}
	close(start)
	wg.Wait()
	seen := map[string]string{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("s%02d: %v", i, errs[i])
		}
		srv, err := stores[1%len(stores)].Server(fmt.Sprintf("s%02d", i))
		if err != nil || len(srv.Addresses) != 1 {
			t.Fatalf("s%02d: %v %+v, want one address", i, err, srv.Addresses)
		}
		a := srv.Addresses[0].Address
		if other, dup := seen[a]; dup {
			t.Fatalf("%s handed to %s and %s", a, other, srv.Name)
		}
		seen[a] = srv.Name
	}
	h, err := stores[0].AddressHolders("tenant")
	if err != nil || len(h) != n {
		t.Fatalf("holders: %d %v, want %d", len(h), err, n)
	}
	for a, srv := range h {
		if seen[a] != srv {
			t.Fatalf("record %s → %s, server records say %s", a, srv, seen[a])
		}
	}
	// Lowest free in order: the n lowest addresses are the ones held.
	for i := range n {
		a := netip.AddrFrom4([4]byte{10, 9, 0, byte(1 + i)}).String()
		if _, ok := h[a]; !ok {
			t.Fatalf("%s not held: the picks were not the lowest free (%v)", a, h)
		}
	}
}

// TestApplyClaimingConcurrentBolt: 24 concurrent allocations on one bbolt
// store never share an address.
func TestApplyClaimingConcurrentBolt(t *testing.T) {
	s := openTest(t, state.Options{})
	claimRace(t, []*state.Store{s}, 24)
}

// TestEtcdTwoControllersAddressOnce: two controllers (two stores, own
// clients, on one etcd prefix) allocate 24 servers at once from one pool:
// the etcd transaction's compare on the pool's records makes every
// address go to one server only.
func TestEtcdTwoControllersAddressOnce(t *testing.T) {
	a, b := openEtcdPair(t)
	claimRace(t, []*state.Store{a, b}, 24)
}
